"""The judge protocols' contract: the registry, the scale and the rubric, bad input as one-line errors, the prompt
layout (shared first, the question last; repeats are distinct prompts), what enters the manifest and the cache keys
(a cached verdict or score of another protocol, rubric, scale or K is never reused; the letter protocol's keys are
those it always had), and the `score` and `judge --protocol` commands end to end against the simulated judge."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from helpers import store_from_runs

from kvjudge.cli import main
from kvjudge.errors import ConfigError, JudgeError, UsageError
from kvjudge.judge import Judge, judge_batch, open_servers
from kvjudge.judge.labels import LabelScore
from kvjudge.judge.pointwise import score_runs
from kvjudge.judge.prompt import RAW, TemplateText, chat_framing
from kvjudge.judge.protocols import PROTOCOLS, Criterion, Rubric, make_protocol
from kvjudge.judge.protocols.base import MAX_REPEATS, Reading
from kvjudge.judge.protocols.rubric import load_rubric, parse_criteria
from kvjudge.judge.scale import Scale, letter_scale
from kvjudge.judge.server_logprobs import label_score, top_logprobs
from kvjudge.judge.verdict import judge_settings
from kvjudge.retention import Store
from kvjudge.settings import Settings
from kvjudge.testing.graded_runs import swe_run, write_graded
from kvjudge.testing.sim_judge import Settings as SimSettings
from kvjudge.testing.sim_judge import SimJudgeServer, scale_distribution, scale_levels

ONE = Rubric((Criterion("overall", "The run accomplished its task."),), source="the test rubric")


# ----------------------------------------------------------------------------------------- scale and rubric
def test_the_expected_score_is_the_probability_weighted_mean_of_the_levels() -> None:
    scale = letter_scale(5)
    assert scale.levels == ("A", "B", "C", "D", "E")
    probs, mass = scale.read({"A": 0.1, "C": 0.2, "E": 0.5, "Z": 0.2})
    assert mass == pytest.approx(0.8)
    assert scale.expected(probs) == pytest.approx((0.2 * 0.5 + 0.5 * 1.0) / 0.8)


def test_too_little_label_mass_is_an_error_never_a_score() -> None:
    with pytest.raises(JudgeError, match="held 0.300 of the answer's probability, under the least 0.5"):
        letter_scale(3, min_mass=0.5).read({"A": 0.2, "C": 0.1})
    with pytest.raises(JudgeError, match="no probability"):
        letter_scale(3).read({})


def test_a_server_answer_is_read_on_the_scale_a_level_outside_the_top_n_has_no_probability() -> None:
    scale = letter_scale(4, min_mass=0.5)
    score = label_score({" B": -0.5, "B": -3.0, " D": -1.5, " The": -2.0}, top_n=20, prompt_tokens=9, scale=scale)
    assert set(score.probs) == set(scale.levels) and score.probs["A"] == score.probs["C"] == 0.0
    assert score.label_mass == pytest.approx(0.6065 + 0.0498 + 0.2231, abs=1e-3)
    with pytest.raises(JudgeError, match="no logprobs"):
        top_logprobs({"choices": [{"text": "B", "logprobs": None}]})


@pytest.mark.parametrize(("levels", "message"), [(1, "2 to 26 levels"), (27, "2 to 26 levels")])
def test_a_scale_under_two_levels_or_beyond_the_letters_is_a_config_error(levels: int, message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        Settings.from_mapping({"judge": {"levels": levels}})
    with pytest.raises(UsageError, match="2 to 26 levels"):
        letter_scale(levels)
    with pytest.raises(UsageError, match="at least 2 levels"):
        Scale(("A",))


@pytest.mark.parametrize(("items", "message"), [
    ([], "has no criteria"),
    (["tests: ran them", "tests: again"], "names the criterion 'tests' twice"),
    (["no colon here"], 'must read "name: text"'),
    (["Bad Name: text"], "short lower-case identifier"),
    (["empty:  "], "has no text"),
])
def test_a_bad_rubric_is_a_one_line_error(items: list[str], message: str) -> None:
    with pytest.raises(UsageError, match=message) as raised:
        parse_criteria(items, "[judge] rubric")
    assert "\n" not in str(raised.value)


def test_a_rubric_file_is_read_and_a_bad_one_refused(tmp_path: Path) -> None:
    good = tmp_path / "rubric.toml"
    good.write_text('[[criterion]]\nname = "tests"\ntext = "The tests pass."\n\n'
                    '[[criterion]]\nname = "scope"\ntext = "Only what was asked changed."\n')
    assert load_rubric(good).names == ["tests", "scope"]
    bad = tmp_path / "bad.toml"
    bad.write_text('[[criterion]]\nname = "tests"\n')
    with pytest.raises(UsageError, match="needs exactly the strings name and text"):
        load_rubric(bad)
    with pytest.raises(ConfigError, match="cannot read the rubric file"):
        load_rubric(tmp_path / "missing.toml")
    protocol = make_protocol("pointwise", rubric=str(good))
    assert [c["name"] for c in protocol.manifest()["rubric"]] == ["tests", "scope"]


def test_the_registry_names_every_protocol_and_refuses_what_does_not_fit() -> None:
    assert set(PROTOCOLS) == {"letter", "pairwise-scale", "pointwise"}
    with pytest.raises(UsageError, match="unknown judge protocol 'best'"):
        make_protocol("best")
    with pytest.raises(UsageError, match="a rubric or repeats need a scale protocol"):
        make_protocol("letter", repeats=2)
    with pytest.raises(UsageError, match=f"repeats must be 1 to {MAX_REPEATS}"):
        make_protocol("pointwise", repeats=MAX_REPEATS + 1)


# ------------------------------------------------------------------------------------------- prompt layout
@pytest.mark.parametrize("framing", [RAW, chat_framing("{% for m in messages %}<|u|>{{ m['content'] }}<|e|>"
                                                       "{% endfor %}<|a|>")])
def test_what_the_calls_share_comes_first_and_the_question_last(framing) -> None:  # type: ignore[no-untyped-def]
    pairwise = make_protocol("pairwise-scale", repeats=MAX_REPEATS)
    views = (["view one ", "body"], ["view two"])
    prompts = {r.id: pairwise.segments(framing, r, *(views if r.order == "ab" else views[::-1]), "")
               for r in pairwise.readings()}
    assert len(prompts) == len(pairwise.readings()) == 2 * 3 * MAX_REPEATS  # orders × default criteria × K
    shared = pairwise.shared(framing)
    assert len({tuple(p[:shared]) for p in prompts.values()}) == 1  # the same leading segments in every call
    question = -2 if framing.name == "chat" else -1
    for order in ("ab", "ba"):  # one order's readings: identical up to the question
        assert len({tuple(p[:question]) for r, p in prompts.items() if r.endswith(order)}) == 1
    assert len({"".join(p) for p in prompts.values()}) == len(prompts)  # every repeat reads another prompt
    if framing.name == "chat":
        assert all(isinstance(p[0], TemplateText) and isinstance(p[-1], TemplateText) for p in prompts.values())
    for reading in pairwise.readings():
        text = "".join(prompts[reading.id])
        assert scale_levels(text) == pairwise.scale.levels  # the simulated judge finds the scale, either order
        assert reading.criterion is not None and reading.criterion.text in prompts[reading.id][question]


def test_the_simulated_judge_answers_an_expected_level_exactly() -> None:
    for value in (0.0, 0.13, 0.5, 0.87, 1.0):
        probs = scale_distribution("ABCDEFGHIJ", value)
        assert sum(probs.values()) == pytest.approx(1.0)
        assert letter_scale(10).expected(probs) == pytest.approx(value)


# ----------------------------------------------------------------------------------- manifest and cache keys
def test_the_manifest_lists_the_protocol_and_only_a_scale_protocol_enters_the_keys() -> None:
    pointwise = make_protocol("pointwise", levels=5, repeats=2, rubric=ONE)
    manifest = pointwise.manifest()
    assert manifest["protocol"] == "pointwise" and manifest["levels"] == ["A", "B", "C", "D", "E"]
    assert manifest["repeats"] == 2
    assert manifest["rubric"] == [{"name": "overall", "sha256": ONE.criteria[0].sha256}]
    letter = make_protocol("letter").manifest()
    assert letter["protocol"] == "letter" and letter["levels"] == ["B", "A"]
    assert judge_settings({"model": "m", **letter}) == judge_settings({"model": "m"})  # the keys it always had
    assert judge_settings({"model": "m", **manifest}) != judge_settings({"model": "m", **{**manifest, "repeats": 3}})


# ------------------------------------------------------------------------------------ against the sim judge
@pytest.fixture
def graded(tmp_path: Path):  # type: ignore[no-untyped-def]
    runs = [swe_run(f"{side}/t{n}", task=f"t{n}", passed=side == "pass", seed=n, explore=0, file_lines=3, changed=2)
            for n in range(3) for side in ("pass", "fail")]
    runs_file, key = write_graded(tmp_path, runs)
    store = store_from_runs(tmp_path / "store.sqlite", [r.run for r in runs])
    store.close()
    return tmp_path / "store.sqlite", key, [r.id for r in runs], runs_file


def _judge(url: str, protocol: str, **kwargs: object) -> Judge:
    return Judge(open_servers([url], n_ctx=8192), protocol=make_protocol(protocol, **kwargs))


def test_a_cached_score_of_another_protocol_rubric_scale_or_k_is_never_reused(graded) -> None:  # type: ignore[no-untyped-def]
    path, key, ids, _ = graded
    with SimJudgeServer(key, SimSettings()) as server, Store.open(path) as store:
        def cached(**kwargs: object) -> list[bool]:
            judge = _judge(server.url, "pointwise", **kwargs)
            try:
                return [s.cached for s in score_runs(judge, store, ids)]
            finally:
                judge.backend.close()

        assert cached(rubric=ONE) == [False] * len(ids)
        assert cached(rubric=ONE) == [True] * len(ids)
        assert cached(rubric=ONE, repeats=2) == [False] * len(ids)
        assert cached(rubric=ONE, levels=5) == [False] * len(ids)
        other = Rubric((Criterion("overall", "The run did what it was asked."),))
        assert cached(rubric=other) == [False] * len(ids)
        assert cached(rubric=ONE) == [True] * len(ids)
        pairs = [(ids[0], ids[1])]
        for protocol, kwargs in (("pairwise-scale", {"rubric": ONE}), ("letter", {})):
            judge = _judge(server.url, protocol, **kwargs)
            assert [v.cached for v in judge_batch(judge, store, pairs)] == [False]
            assert [v.cached for v in judge_batch(judge, store, pairs)] == [True]
            judge.backend.close()


def test_a_reading_below_the_least_label_mass_is_an_error_and_is_not_cached(graded) -> None:  # type: ignore[no-untyped-def]
    path, key, ids, _ = graded
    with SimJudgeServer(key, SimSettings()) as server, Store.open(path) as store:  # the sim puts 0.96 on the labels
        judge = _judge(server.url, "pointwise", rubric=ONE, min_mass=0.99)
        scores = score_runs(judge, store, ids)
        assert {s.outcome for s in scores} == {"error"} and all(s.p_success is None for s in scores)
        assert "under the least 0.99" in (scores[0].error or "")
        verdicts = judge_batch(_judge(server.url, "pairwise-scale", rubric=ONE, min_mass=0.99), store,
                               [(ids[0], ids[1])])
        assert verdicts[0].outcome == "error" and verdicts[0].p_a is None
        judge = _judge(server.url, "pointwise", rubric=ONE, min_mass=0.99)
        assert not any(s.cached for s in score_runs(judge, store, ids))


def test_a_scale_larger_than_the_servers_top_logprobs_and_a_criterion_too_long_are_refused(graded) -> None:  # type: ignore[no-untyped-def]
    path, key, ids, _ = graded
    with SimJudgeServer(key, SimSettings()) as server, Store.open(path) as store:
        with pytest.raises(UsageError, match="a 21-level scale cannot be read from the judge server's top 20"):
            _judge(server.url, "pointwise", levels=21)
        long = Rubric((Criterion("long", "Check every line of the run. " * 1500),))
        judge = _judge(server.url, "pointwise", rubric=long)
        with pytest.raises(UsageError, match="criterion 'long' .* leaves the runs"):
            score_runs(judge, store, ids)
        with pytest.raises(UsageError, match="the pointwise protocol scores one run at a time"):
            judge_batch(judge, store, [(ids[0], ids[1])])


def test_a_server_that_returns_no_logprobs_gives_error_verdicts(graded, monkeypatch: pytest.MonkeyPatch) -> None:  # type: ignore[no-untyped-def]
    from kvjudge.testing import sim_judge

    answer = sim_judge._Api.completions

    def without_logprobs(self, body):  # type: ignore[no-untyped-def]
        done = answer(self, body)
        if body.get("max_tokens") == 1:  # the judge's calls (a probe's or a count's are left alone)
            done["choices"][0]["logprobs"] = None
        return done

    path, key, ids, _ = graded
    monkeypatch.setattr(sim_judge._Api, "completions", without_logprobs)
    with SimJudgeServer(key, SimSettings()) as server, Store.open(path) as store:
        scores = score_runs(_judge(server.url, "pointwise", rubric=ONE), store, ids[:2])
        assert [s.outcome for s in scores] == ["error", "error"] and "no logprobs" in (scores[0].error or "")


def test_score_and_judge_protocol_from_the_cli(graded, capsys: pytest.CaptureFixture[str], tmp_path: Path) -> None:  # type: ignore[no-untyped-def]
    path, key, ids, _ = graded
    with SimJudgeServer(key, SimSettings()) as server:
        common = ["--server", server.url, "--n-ctx", "8192", "--store", str(path)]
        assert main(["score", *common, "--repeats", "2", "--levels", "6", "--json"]) == 0
        assert not any(json.loads(line).get("cached") for line in capsys.readouterr().out.splitlines())
        assert main(["score", *common, "--repeats", "2", "--levels", "6", "--json"]) == 0
        out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
        runs, summary = out[:-1], out[-1]["summary"]
        assert len(runs) == len(ids) and all(r["cached"] and r["outcome"] == "scored" for r in runs)
        assert set(runs[0]["criteria"]) == {"correctness", "verification", "conduct"}
        assert all(c["n"] == 2 and c["spread"] is not None for c in runs[0]["criteria"].values())
        assert summary["manifest"]["levels"] == list("ABCDEF") and summary["manifest"]["repeats"] == 2
        assert main(["judge", ids[0], ids[1], *common, "--protocol", "pairwise-scale", "--json"]) == 0
        verdict = json.loads(capsys.readouterr().out.splitlines()[0])
        assert verdict["manifest"]["protocol"] == "pairwise-scale" and len(verdict["readings"]) == 2 * 3
        rubric = tmp_path / "empty.toml"
        rubric.write_text("")
        assert main(["score", *common, "--rubric", str(rubric)]) == 2
        err = capsys.readouterr().err
        assert "has no criteria" in err and err.count("\n") == 1


def test_a_jury_combines_its_members_and_an_unreachable_member_gives_errors_never_scores(  # type: ignore[no-untyped-def]
        graded, capsys: pytest.CaptureFixture[str]) -> None:
    from helpers import free_ports

    from kvjudge.judge.jury import MemberVerdict, combine

    path, key, ids, _ = graded
    [port] = free_ports()
    dead = f"http://127.0.0.1:{port}"
    pairs = [(ids[0], ids[1]), (ids[3], ids[2])]  # the passing run first, then second
    with SimJudgeServer(key, SimSettings(accuracy=1.0)) as right, \
            SimJudgeServer(key, SimSettings(accuracy=1.0, seed=1, model="second")) as other:
        argv = ["judge", "--pairs", str(path.with_name("pairs.jsonl")), "--n-ctx", "8192", "--store", str(path),
                "--jury", right.url, "--jury", other.url, "--jury", dead, "--protocol", "pairwise-scale",
                "--json"]
        path.with_name("pairs.jsonl").write_text("".join(json.dumps({"a": a, "b": b}) + "\n" for a, b in pairs))
        assert main(argv) == 0
    out = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    verdicts, summary = out[:-1], out[-1]["summary"]
    for verdict, better in zip(verdicts, ("a", "b")):
        members = {m["member"]: m for m in verdict["members"]}
        assert members[dead]["outcome"] == "error" and members[dead]["p_a"] is None
        assert "reachable" in members[dead]["error"]
        scored = [members[url]["p_a"] for url in (right.url, other.url)]
        assert verdict["p_a"] == pytest.approx(sum(scored) / 2)  # the mean of the members that scored
        assert verdict["outcome"] == better and verdict["votes"] == {better: 2}
    assert summary["members"][dead] == {"error": 2}
    # The jury's cost: each member's own (3 criteria × 2 orders per pair; the unreachable one spent nothing), the
    # total their sum, a verdict's cost its members' verdicts'.
    each = summary["member_costs"]
    assert each[right.url]["calls"] == each[other.url]["calls"] == 2 * 3 * 2 and each[dead]["calls"] == 0
    assert summary["cost"]["calls"] == sum(c["calls"] for c in each.values())
    assert summary["cost"]["prompt_tokens"] == sum(c["prompt_tokens"] for c in each.values()) > 0
    assert sum(v["cost"]["prompt_tokens"] for v in verdicts) == summary["cost"]["prompt_tokens"]
    # The majority of the labels given; no majority is a tie; nobody scored is an error.
    fake = [MemberVerdict(name, None, "down") for name in ("x", "y")]
    assert combine("a", "b", fake).outcome == "error" and combine("a", "b", fake).p_a is None


def test_eval_measures_a_pointwise_critic_and_a_pairwise_scores_auc(graded, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    path, key, ids, _ = graded
    with SimJudgeServer(key, SimSettings()) as server:
        common = ["--server", server.url, "--n-ctx", "8192", "--store", str(path), "--json"]
        assert main(["eval", *common, "--protocol", "pointwise"]) == 0
        result = json.loads(capsys.readouterr().out)
        figures = result["pointwise"]
        assert figures["graded"] == len(ids) and figures["succeeded"] == len(ids) // 2
        # Its cost: every run read once per criterion of the default rubric (3, K = 1), as the server counted them.
        assert result["cost"]["calls"] == 3 * len(ids) == server.requests["/v1/completions"]
        # The simulated judge centres each reading on the grade (1 or 0) with σ = 0.15: it ranks every pair right.
        assert figures["auc"] == 1.0 and figures["auc_ci95"] is not None
        assert set(figures["criteria"]) == {"correctness", "verification", "conduct"}
        assert set(figures["calibration"]) == {"isotonic", "platt"}
        assert all(held["fit"] + held["held_out"] == len(ids) for held in figures["calibration"].values())
        assert main(["eval", *common, "--protocol", "pairwise-scale", "--png", str(path.with_name("e.png"))]) == 0
        [(_, pairwise)] = json.loads(capsys.readouterr().out)["templates"].items()
        assert pairwise["score"]["pairs"] == len(ids) // 2 and set(pairwise["score"]["criteria"]) == {
            "correctness", "verification", "conduct"}


def test_the_docs_table_is_the_registry() -> None:
    text = (Path(__file__).parent.parent / "docs" / "judge-protocols.md").read_text()
    rows = {line.split("|")[1].strip(" `"): line for line in text.splitlines() if line.startswith("| `")}
    for name, cls in PROTOCOLS.items():
        assert f"| `{name}` | {cls.kind} | {cls.summary} |" == rows[name]
    from kvjudge.judge.protocols import DEFAULT_RUBRIC

    for criterion in DEFAULT_RUBRIC.criteria:
        assert f"| `{criterion.name}` | {criterion.text} |" == rows[criterion.name]


def test_the_report_shows_each_pairs_criteria_and_the_score_auc(graded, capsys: pytest.CaptureFixture[str],  # type: ignore[no-untyped-def]
                                                                tmp_path: Path) -> None:
    path, key, ids, _ = graded
    out = tmp_path / "report.html"
    pairs = tmp_path / "pairs.jsonl"  # the better run first in one pair, second in the others: both classes
    pairs.write_text("".join(json.dumps({"a": a, "b": b}) + "\n" for a, b in
                             [(ids[0], ids[1]), (ids[3], ids[2]), (ids[5], ids[4])]))
    with SimJudgeServer(key, SimSettings()) as server:
        assert main(["report", "--server", server.url, "--n-ctx", "8192", "--store", str(path), "--out", str(out),
                     "--protocol", "pairwise-scale", "--repeats", "2", "--pairs", str(pairs), "--bootstrap", "20",
                     "--json"]) == 0
    payload = json.loads(capsys.readouterr().out)
    index = out.read_text()
    assert 'id="score-auc"' in index and "ROC AUC 1.00" in index
    page = next(Path(payload["pair_dir"]).glob("*.html")).read_text()
    assert 'id="criteria"' in page and all(name in page for name in ("correctness", "verification", "conduct"))


def test_eval_reports_how_far_p_a_moves_with_the_length_difference(graded, capsys: pytest.CaptureFixture[str]) -> None:  # type: ignore[no-untyped-def]
    path, key, ids, _ = graded
    with SimJudgeServer(key, SimSettings()) as server:
        assert main(["eval", "--server", server.url, "--n-ctx", "8192", "--store", str(path), "--json",
                     "--png", str(path.with_name("e.png"))]) == 0
    [(_, result)] = json.loads(capsys.readouterr().out)["templates"].items()
    length = result["length_controlled"]
    assert length["pairs"] == 3  # every pair scored
    assert length["slope"] is not None and length["unit_chars"] == 1000
