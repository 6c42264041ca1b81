"""Judge backends through one door (issue 37): the registry's kinds, the default that keeps every existing config's
judge, the docs and ``--help`` made from it, a backend another package adds through a real ``kvjudge.backends``
entry point judging a pair end to end, one that does not load said in one note, an unknown name in one line."""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

import pytest
from helpers import kvjudge, store_from_runs

from kvjudge.cli import build_parser, main
from kvjudge.commands._args import settings_from
from kvjudge.errors import UsageError
from kvjudge.judge import backend_registry
from kvjudge.settings import Settings
from kvjudge.target import JudgeTarget
from kvjudge.testing.native_runs import make_run

REPO = Path(__file__).resolve().parent.parent
DOCS = REPO / "docs" / "judging.md"


def _judge_settings(**values: object) -> Settings:
    return Settings().with_overrides({f"judge.{key}": value for key, value in values.items()})


def test_the_registry_holds_kvjudge_own_kinds_and_keeps_todays_choice_by_default() -> None:
    assert backend_registry.names()[:2] == ("llama", "servers")
    assert all(kind.summary and kind.needs for kind in backend_registry.kinds())
    pool = ("http://127.0.0.1:1", "http://127.0.0.1:2")
    assert backend_registry.chosen(Settings()).name == "llama"  # no server: in-process, as before
    assert backend_registry.chosen(_judge_settings(servers=pool)).name == "servers"
    assert backend_registry.chosen(_judge_settings(server=pool[0])).name == "servers"
    # Named, the kind wins over what is configured beside it: llama with servers configured judges in-process.
    local = JudgeTarget(_judge_settings(servers=pool, backend="llama"))
    assert local.backend_kind.name == "llama" and local.servers == () and not local.served
    served = JudgeTarget(_judge_settings(servers=pool))
    assert served.backend_kind.serves and served.servers == pool


def test_the_docs_and_the_help_list_the_registry(capsys: pytest.CaptureFixture[str]) -> None:
    section = re.search(r"<!-- backends:begin -->\n(.*?)\n<!-- backends:end -->", DOCS.read_text(), re.DOTALL)
    assert section is not None and section.group(1) == backend_registry.docs_section()
    for kind in backend_registry.kinds():
        assert f"- `{kind.name}` — {kind.summary}" in section.group(1)
    with pytest.raises(SystemExit):
        main(["judge", "--help"])
    flat = "".join(capsys.readouterr().out.split())  # argparse wraps the help at spaces and hyphens
    assert all("".join(f"{kind.name}: {kind.summary}".split()) in flat for kind in backend_registry.kinds())


def _docs_example() -> str:
    """The "adding a backend" example of docs/judging.md, exactly as written there."""
    text = DOCS.read_text()
    start = text.index("**Adding a backend.**")
    return re.search(r"```python\n(.*?)```", text[start:], re.DOTALL).group(1)


def _installed(site: Path, entry_points: str) -> dict[str, str]:
    """The docs' example installed into ``site`` the way pip leaves a distribution (a module, a ``*.dist-info``
    with its entry points, a broken module beside it), and the environment that puts ``site`` on a child's path."""
    site.mkdir(parents=True)
    (site / "lab_judge.py").write_text(_docs_example())
    (site / "lab_broken.py").write_text("raise ImportError('no judge here')\n")
    info = site / "lab_judge-0.1.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: lab-judge\nVersion: 0.1\n")
    (info / "entry_points.txt").write_text(f"[kvjudge.backends]\n{entry_points}\n")
    return {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), str(REPO), os.environ.get("PYTHONPATH", "")])}


def _pair_store(path: Path) -> tuple[str, str]:
    """Two runs of one task: ``short`` with one tool output of 20 characters, ``long`` with five of 400."""
    short, long = make_run("short", ["x" * 20]), make_run("long", [f"line {i} " * 50 for i in range(5)])
    for run in (short, long):
        run["task"]["id"] = "t1"
    store_from_runs(path, [short, long]).close()
    return "short", "long"


def test_a_backend_another_package_adds_judges_a_pair_end_to_end(tmp_path: Path) -> None:
    env = _installed(tmp_path / "site", "shorter-wins = lab_judge:BACKEND\nbroken = lab_broken:BACKEND")
    store = tmp_path / "s.sqlite"
    short, long = _pair_store(store)
    done = kvjudge("judge", short, long, "--backend", "shorter-wins", "--store", str(store), "--json", env=env)
    assert done.returncode == 0, done.stderr
    assert "Traceback" not in done.stderr
    # The broken entry point is one note; the working one judges.
    assert ("judge backend 'broken' (lab_broken:BACKEND) cannot be loaded: ImportError: no judge here"
            in done.stderr.splitlines())
    verdict = json.loads(done.stdout.splitlines()[0])
    # The example answers 0.8 for the run quoted first when it is the shorter, 0.2 when it is the longer: in both
    # orders (un-swapped) the probability that run a (short) is better is 0.8.
    assert (verdict["a"], verdict["b"], verdict["outcome"]) == (short, long, "a")
    assert verdict["p_a"] == pytest.approx(0.8) and verdict["p_a_by_order"] == pytest.approx({"ab": 0.8, "ba": 0.8})
    # Named in the config instead, with the pair the other way round: the long run loses.
    config = tmp_path / "kvjudge.toml"
    config.write_text('[judge]\nbackend = "shorter-wins"\n')
    done = kvjudge("judge", long, short, "--store", str(store), "--json", env={**env, "KVJUDGE_CONFIG": str(config)})
    assert done.returncode == 0, done.stderr
    verdict = json.loads(done.stdout.splitlines()[0])
    assert verdict["outcome"] == "b" and verdict["p_a"] == pytest.approx(0.2)
    helped = kvjudge("judge", "--help", env=env)
    assert "shorter-wins: the shorter run wins (a baseline, no model)" in " ".join(helped.stdout.split())


def test_an_unknown_backend_is_one_line_naming_the_kinds(tmp_path: Path) -> None:
    store = tmp_path / "s.sqlite"
    short, long = _pair_store(store)
    done = kvjudge("judge", short, long, "--backend", "no-such", "--store", str(store))
    assert done.returncode != 0 and "Traceback" not in done.stderr
    assert done.stderr.strip().splitlines()[-1] == "kvjudge: error: " + backend_registry.unknown_message("no-such")
    assert done.stderr.strip().count("\n") == 0  # nothing loaded, nothing said before it
    assert all(f"{name} (" in done.stderr for name in backend_registry.names())


def test_flags_choose_the_kind_as_they_always_did(tmp_path: Path) -> None:
    config = tmp_path / "kvjudge.toml"
    config.write_text('[judge]\nbackend = "llama"\nservers = ["http://127.0.0.1:1"]\n')

    def kind_of(*argv: str) -> str:
        args = build_parser("judge").parse_args(["judge", "a", "b", "--config", str(config), *argv])
        return JudgeTarget(settings_from(args)).backend_kind.name

    assert kind_of() == "llama"  # named in the file: the configured servers do not apply
    assert kind_of("--server", "http://127.0.0.1:2") == "servers"  # --server without --backend: the servers
    assert kind_of("--backend", "servers") == "servers"
    with pytest.raises(UsageError, match="only apply to judge servers"):
        kind_of("--parallel", "2")  # the in-process kind, named in the file, takes no server options
