"""Settings: one typed reader of kvjudge.toml, the environment and flags; unknown keys and bad values fail."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvjudge.errors import ConfigError
from kvjudge.settings import Settings


def test_defaults_without_a_file(isolated_dirs: Path) -> None:
    settings = Settings.load()
    assert settings.source is None
    assert settings.retention.ceiling == 200_000 and settings.retention.counter == "model"
    assert settings.judge.margin == 0.05 and settings.judge.server_urls == ()
    assert settings.memory.threshold_pct == 0.8


def test_a_full_file_is_read_typed(tmp_path: Path) -> None:
    path = tmp_path / "kvjudge.toml"
    path.write_text('[memory]\ncontext_tokens = 16000\nthreshold_pct = 0.75\n'
                    '[context.estimation]\ncounter = "tiktoken"\n'
                    '[probe]\nmemory_budget = "6GiB"\nstaleness_days = 7\n'
                    '[retention]\nceiling = 50000\ncold = "file:///mnt/cold"\n'
                    '[retention.tenants.acme]\nceiling = 1000\n'
                    '[judge]\nservers = ["http://a:8080", "http://b:8080"]\nmargin = 0\ntimeout = 30\n')
    settings = Settings.load(path)
    assert settings.source == path
    assert settings.memory.context_tokens == 16000 and settings.context.estimation.counter == "tiktoken"
    assert settings.probe.memory_budget == "6GiB" and settings.probe.staleness_days == 7.0
    assert settings.retention.ceiling_for("acme") == 1000 and settings.retention.ceiling_for("other") == 50000
    assert settings.judge.server_urls == ("http://a:8080", "http://b:8080")
    assert isinstance(settings.judge.margin, float) and isinstance(settings.judge.timeout, float)


@pytest.mark.parametrize(("toml", "message"), [
    ("[retention]\nceilng = 5000\n", "unknown key 'ceilng' in [retention]; did you mean ceiling?"),
    ("[jugde]\nmodel = 'x'\n", "unknown key 'jugde' in the top level; did you mean judge?"),
    ("[retention.tenants.acme]\ncieling = 1\n", "unknown key 'cieling' in [retention.tenants.acme]; did you mean"),
    ("[judge]\nzzz = 1\n", "known keys: model, server, servers"),
    ("[retention]\nceiling = true\n", "[retention] ceiling must be a whole number, got True"),
    ("[retention]\nceiling = -5\n", "[retention] ceiling must be a positive number of tokens"),
    ("[judge]\nmargin = 0.5\n", "[judge] margin must be in [0, 0.5)"),
    ("[judge]\nservers = []\n", "[judge] servers must be a non-empty list of URLs"),
    ("[judge]\ntemplate = 'jinja'\n", '[judge] template must be one of "auto", "chat", "raw"'),
    ("[memory]\nthreshold_pct = 80\n", "[memory] threshold_pct must be a fraction like 0.8"),
    ("retention = 5\n", "[retention] must be a table"),
])
def test_a_bad_file_is_one_line_naming_file_and_key(tmp_path: Path, toml: str, message: str) -> None:
    path = tmp_path / "kvjudge.toml"
    path.write_text(toml)
    with pytest.raises(ConfigError) as caught:
        Settings.load(path)
    assert str(path) in str(caught.value) and message in str(caught.value)
    assert "\n" not in str(caught.value)


def test_flags_override_the_file_and_are_checked_by_name(tmp_path: Path) -> None:
    path = tmp_path / "kvjudge.toml"
    path.write_text('[judge]\nmodel = "from-file.gguf"\nparallel = 4\n')
    settings = Settings.load(path).with_overrides({"judge.model": "flag.gguf", "judge.parallel": None})
    assert settings.judge.model == "flag.gguf" and settings.judge.parallel == 4 and settings.source == path
    with pytest.raises(ConfigError, match=r"^--parallel: \[judge\] parallel must be at least 1, got 0"):
        settings.with_overrides({"judge.parallel": 0}, {"judge.parallel": "--parallel"})


def test_a_missing_explicit_file_and_broken_toml_are_errors(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(ConfigError, match="does not exist"):
        Settings.load(tmp_path / "nope.toml")
    monkeypatch.setenv("KVJUDGE_CONFIG", str(tmp_path / "nope.toml"))
    with pytest.raises(ConfigError, match="does not exist"):
        Settings.load()
    broken = tmp_path / "broken.toml"
    broken.write_text("[judge\n")
    with pytest.raises(ConfigError, match="is not valid TOML"):
        Settings.load(broken)
