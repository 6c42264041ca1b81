"""The simulated judge of known quality on its own: its decision rule, its answer key, its HTTP shapes.

What it is for (kvjudge reading a capable judge right, through the CLI) is tests/test_judge_known_quality.py.
Here: it decides only what its key and the quoted views allow, its draws hit the set accuracy and are the same
in both orders, a bad key is one clear error, and kvjudge's real server client reads its answers as vLLM's.
"""

from __future__ import annotations

import http.client
import json
import math
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from helpers import kvjudge_json

from kvjudge.errors import ServerError, UsageError
from kvjudge.judge import PromptOverflow, ServerBackend
from kvjudge.judge.prompt import RAW, TemplateText, user_message
from kvjudge.server_client import ServerClient
from kvjudge.testing.graded_runs import swe_run, write_graded
from kvjudge.testing.sim_judge import (
    LABEL_MASS,
    AnswerKey,
    KeyEntry,
    Settings,
    SimJudge,
    SimJudgeServer,
    changed_lines,
    common_pieces,
    draw,
    quoted_views,
    write_key,
)

GOOD = swe_run("good", task="csv-7", passed=True, seed=1)
BAD = swe_run("bad", task="csv-7", passed=False, seed=2)
ALSO_GOOD = swe_run("also-good", task="csv-7", passed=True, seed=3)


def _view(run: object) -> str:
    """A view with indented bodies (the judge's renderer writes them flush; both read the same): the submission and
    the test outcome, among other lines."""
    return "Task csv-7:\n  Fix the reader.\n[step 9] tool (bash, exit 0):\n" + "\n".join(
        "  " + line for line in [*run.patch.splitlines(), run.outcome])  # type: ignore[attr-defined]


def _prompt(first: str, second: str) -> str:
    return "".join(RAW.segments(first, second))


def _judge(**settings: float) -> SimJudge:
    return SimJudge(AnswerKey([GOOD.key, BAD.key, ALSO_GOOD.key]), Settings(**settings))  # type: ignore[arg-type]


def test_it_prefers_the_better_run_with_the_set_confidence_and_bias_only_where_it_can_see_the_evidence() -> None:
    judge = _judge(accuracy=1.0, bias=0.6, confidence=0.85)
    good, bad = _view(GOOD), _view(BAD)
    ab, ba = judge.decide(_prompt(good, bad)), judge.decide(_prompt(bad, good))
    assert (ab.reason, ab.runs, ab.right) == ("decided", ("good", "bad"), True)
    # The better run shown first gets 0.85 + 0.1; shown second, the first (worse) run gets 0.15 + 0.1.
    assert ab.p_first == pytest.approx(0.95) and ba.p_first == pytest.approx(0.25)
    assert (ab.p_first + ba.p_first) / 2 == pytest.approx(0.6)  # the mean given to the run shown first: the bias

    # One changed line of the bad run's patch elided: its evidence is not all visible, so no preference.
    hidden = changed_lines(BAD.patch)[1]
    cut = bad.replace(hidden, "[… 40 tokens elided from sha256:0123456789ab …]")
    assert cut != bad
    assert judge.decide(_prompt(good, cut)).reason == "evidence_hidden"
    assert judge.decide(_prompt(good, cut)).p_first == pytest.approx(0.6)
    # A line cut in the middle is not visible either; nor is an outcome line missing from the view.
    assert judge.decide(_prompt(good, bad.replace(BAD.outcome, BAD.outcome[:12]))).reason == "evidence_hidden"
    # Equal grades: no preference whatever is shown.
    equal = judge.decide(_prompt(good, _view(ALSO_GOOD)))
    assert (equal.reason, equal.p_first) == ("equal_grades", pytest.approx(0.6))
    # A view without a known marker (or with two) is not identified.
    assert judge.decide(_prompt(good, "  nothing to see")).reason == "unidentified"
    assert judge.decide(_prompt(good, bad + "\n" + _view(ALSO_GOOD))).reason == "unidentified"
    assert judge.decide("a prompt with no runs quoted").reason == "no_runs"
    assert judge.reasons == {"decided": 2, "evidence_hidden": 3, "equal_grades": 1, "unidentified": 2,
                             "no_runs": 1}


def test_a_common_piece_counts_only_where_a_view_names_it() -> None:
    judge = _judge(accuracy=1.0)
    good, bad = _view(GOOD), _view(BAD)
    hidden = changed_lines(GOOD.patch)[0]
    cut = good.replace(hidden, "[… elided …]")
    # The judge's block of text both runs share: numbered pieces; a view shows "[common text N]" where it has one.
    common = f"<<<BEGIN COMMON TEXT>>>\n[common text 1]\n{hidden}\n[common text 2]\nother\n<<<END COMMON TEXT>>>\n\n"
    unnamed = _prompt(cut, bad).replace("<<<BEGIN RUN A>>>", common + "<<<BEGIN RUN A>>>", 1)
    assert quoted_views(unnamed) == {"A": cut, "B": bad}
    assert common_pieces(unnamed) == {"[common text 1]": f"\n{hidden}\n", "[common text 2]": "\nother"}
    # A piece no view names reveals nothing; the view that names it contains it.
    assert judge.decide(unnamed).reason == "evidence_hidden"
    named = _prompt(good.replace(hidden, "  [common text 1]"), bad)
    named = named.replace("<<<BEGIN RUN A>>>", common + "<<<BEGIN RUN A>>>", 1)
    assert judge.decide(named).reason == "decided"
    assert judge.decide(_prompt(good, bad)).reason == "decided"


def test_draws_are_the_same_in_both_orders_and_hit_the_set_accuracy() -> None:
    markers = [f"index {n:07x}..{n * 7919 % 2**28:07x} 100644" for n in range(4000)]
    pairs = list(zip(markers[::2], markers[1::2]))
    assert all(draw(5, x, y) == draw(5, y, x) for x, y in pairs)
    assert draw(5, *pairs[0]) != draw(6, *pairs[0])  # the draw seed matters
    for accuracy in (0.7, 0.8):
        right = sum(draw(5, x, y) < accuracy for x, y in pairs)
        # Binomial(2000, accuracy): within 4 standard deviations.
        assert abs(right / len(pairs) - accuracy) < 4 * math.sqrt(accuracy * (1 - accuracy) / len(pairs))
    # A pair judged wrong is wrong in both orders.
    judge = _judge(accuracy=0.0)
    assert judge.decide(_prompt(_view(GOOD), _view(BAD))).p_first == pytest.approx(0.15)
    assert judge.decide(_prompt(_view(BAD), _view(GOOD))).p_first == pytest.approx(0.85)


def test_the_evidence_share_sets_how_much_must_be_visible() -> None:
    lines = changed_lines(BAD.patch)
    assert len(lines) == 12 and not any(line.startswith(("+++", "---")) for line in lines)
    cut = _view(BAD).replace(lines[0], "[… elided …]")
    prompt = _prompt(_view(GOOD), cut)
    assert _judge(evidence_share=1.0).decide(prompt).reason == "evidence_hidden"
    assert _judge(evidence_share=0.9).decide(prompt).reason == "decided"  # 12 of 13 lines are visible


def test_settings_and_keys_are_checked(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match="confidence"):
        Settings(confidence=0.9, bias=0.6)  # 0.9 + 0.1 would reach 1.0: the bias would be clipped
    with pytest.raises(UsageError, match="--accuracy"):
        Settings(accuracy=1.2)
    with pytest.raises(UsageError, match=r"runs\[1\]\.marker: the same marker as runs\[0\]"):
        write_key(tmp_path / "dup.json", [GOOD.key, KeyEntry(GOOD.key.marker, 0.0, ())])
    assert not (tmp_path / "dup.json").exists()  # checked before anything is written
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"runs": [GOOD.key.to_json(), {"marker": "x", "evidence": []}]}))
    with pytest.raises(UsageError, match=r"bad\.json: runs\[1\]: 'grade' is a required property"):
        AnswerKey.load(bad)
    # From the command line: one line on stderr, exit 2, no traceback.
    done = subprocess.run([sys.executable, "-m", "kvjudge.testing.sim_judge", "--key", str(bad)],
                          capture_output=True, text=True, timeout=60)
    assert done.returncode == 2 and done.stderr.count("\n") == 1 and "runs[1]" in done.stderr
    assert "Traceback" not in done.stderr


def test_as_a_subprocess_it_announces_its_url_and_answers_in_vllms_shapes(tmp_path: Path) -> None:
    _runs, key = write_graded(tmp_path, [GOOD, BAD, ALSO_GOOD])
    child = subprocess.Popen([sys.executable, "-m", "kvjudge.testing.sim_judge", "--key", str(key), "--port", "0",
                              "--accuracy", "1", "--bias", "0.55", "--max-model-len", "4096", "--json"],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        ready = json.loads(child.stdout.readline())
        assert ready["max_model_len"] == 4096 and ready["runs"] == 3
        backend = ServerBackend(url=ready["url"], top_logprobs=50)
        info = backend.info
        assert info is not None and info.kind == "vllm" and info.model_id == ready["model"]
        assert info.version == "kvjudge-sim-judge 1" and backend.n_ctx == 4096
        assert backend.top_logprobs == 20  # vLLM's cap on logprobs, read from the server's kind
        assert backend.count("def f(x):\n    return x") == len(SimJudge.tokens("def f(x):\n    return x")) == 8

        # The completions API (the raw framing): {token: logprob} maps, the labels spelled " A" / " B".
        segments = RAW.segments(_view(GOOD), _view(BAD))
        score = backend.score(segments)
        assert score.probs["A"] == pytest.approx(0.85 + 0.05) and score.label_mass == pytest.approx(LABEL_MASS)
        assert score.prompt_tokens == sum(backend.count(s) for s in segments) + 1  # its BOS
        # The chat completions API: a list of {"token", "logprob", "bytes"}, the labels spelled "A" / "B".
        chat = backend.score([TemplateText("<|im_start|>user\n"), *RAW.segments(_view(BAD), _view(GOOD)),
                              TemplateText("<|im_end|>\n<|im_start|>assistant\n")])
        assert chat.probs["A"] == pytest.approx(0.15 + 0.05)
        answer = backend.client.chat([{"role": "user", "content": user_message(segments)}], top_logprobs=3)
        entries = answer["choices"][0]["logprobs"]["content"][0]["top_logprobs"]
        assert [e["token"] for e in entries] == ["A", "B", "The"] and entries[0]["bytes"] == [65]

        # vLLM's refusals: too many logprobs; a prompt over max_model_len (a measured overflow, with its figures);
        # a model it does not serve.
        client = ServerClient(ready["url"])
        with pytest.raises(ServerError, match="Requested sample logprobs of 21, which is greater than max allowed: "
                                              "20"):
            client.complete("x", logprobs=21)
        with pytest.raises(PromptOverflow) as over:
            backend.score(["word " * 5000])  # 5001 tokens and the BOS
        refusal = over.value.__cause__
        assert refusal.n_ctx == 4096 and refusal.prompt_tokens == 5002  # type: ignore[union-attr]
        with pytest.raises(ServerError, match="does not exist"):
            client.complete("x", model="another-model")
        # With one logprob asked, only the likelier label comes back: kvjudge's error, never a guess.
        with pytest.raises(Exception, match="not among the server's top 1"):
            ServerBackend(url=ready["url"], top_logprobs=1).score(segments)
    finally:
        child.send_signal(signal.SIGTERM)
        child.wait(timeout=30)
    assert child.returncode == 0, child.stderr.read() if child.stderr else ""


def test_kvjudge_probe_certifies_it_with_a_refused_prompt(tmp_path: Path) -> None:
    _runs, key = write_graded(tmp_path, [GOOD, BAD])
    with SimJudgeServer(key, Settings(max_model_len=8192)) as server:
        probed = kvjudge_json("probe", "--server", server.url)
        assert server.requests["/v1/completions"] == 2  # one prompt just under the context, one just over
    assert probed["server"]["kind"] == "vllm" and probed["server"]["model_id"] == server.model
    assert probed["max_context_tokens"] == 8192 and probed["certified"] and probed["method"] == "measured"
    ok, over = probed["trials"]
    assert ok["outcome"] == "ok" and 8192 - 32 <= ok["prompt_tokens"] == probed["max_ok_input"] < 8192
    assert over["outcome"] == "overflow" and over["n_ctx_reported"] == 8192 and over["prompt_tokens"] > 8192
    assert probed["safe_context"] <= probed["max_ok_input"]


def test_it_keeps_every_text_it_is_sent_to_read_only_when_given_a_list(tmp_path: Path) -> None:
    _runs, key = write_graded(tmp_path, [GOOD, BAD])
    segments = RAW.segments(_view(GOOD), _view(BAD))
    received: list[str] = []
    with SimJudgeServer(key, Settings(), prompts=received) as server:
        backend = ServerBackend(url=server.url)
        backend.count("a view to count")
        backend.score(segments)  # the completions API
        backend.score([TemplateText("<|im_start|>user\n"), *segments, TemplateText("<|im_end|>\n")])  # chat
    # The tokenize texts (the client first counts the empty text: the BOS every tokenization adds), the
    # completions prompt whole, the chat request rendered by its template.
    assert received[:3] == ["", "a view to count", "".join(segments)]
    assert received[3].startswith("<|im_start|>user\n") and user_message(segments) in received[3]
    assert len(received) == 4
    with SimJudgeServer(key, Settings()) as server:  # none kept by default
        ServerBackend(url=server.url).score(segments)
        assert server.prompts is None and server.requests["/v1/completions"] == 1


def test_a_refused_post_leaves_its_kept_alive_connection_usable(tmp_path: Path) -> None:
    """An unknown path's body is read before the 404, so the next request on the same connection is read as one."""
    _runs, key = write_graded(tmp_path, [GOOD, BAD])
    with SimJudgeServer(key, Settings()) as server:
        host, port = server.url.removeprefix("http://").rstrip("/").split(":")
        connection = http.client.HTTPConnection(host, int(port), timeout=10)
        body = json.dumps({"prompt": "x" * 5000})
        connection.request("POST", "/v1/no-such-endpoint", body=body, headers={"Content-Type": "application/json"})
        refused = connection.getresponse()
        assert refused.status == 404 and json.loads(refused.read()) == {"detail": "Not Found"}
        connection.request("GET", "/v1/models")
        answered = connection.getresponse()
        assert answered.status == 200 and json.loads(answered.read())["data"][0]["id"]
        connection.close()
