"""Template-aware estimation: the chat template's tokens around each message, counted from the model's own
template with its own tokenizer, in what TokenBudget adds after a report and subtracts when it prunes."""

from __future__ import annotations

import asyncio
import math
from pathlib import Path

import pytest

from helpers import cli_json_ok
from kvjudge._llama import chat_renderer
from kvjudge.budget import TokenBudget, TokenEstimation, TurnMetrics
from kvjudge.errors import ConfigError
from kvjudge.settings import Settings
from kvjudge.tokens import MessageOverhead, ModelTokenizer, template_overhead

TEMPLATE = MessageOverhead("test", user=3, assistant=5)


def est(text: str) -> int:
    return math.ceil(len(text.encode("utf-8")) / 4)


def sync(budget: TokenBudget, user: str, assistant: str, input_tokens: int | None = None) -> None:
    asyncio.run(budget.sync_turn(user, assistant, TurnMetrics(input_tokens)))


def test_without_a_template_a_message_is_its_text() -> None:
    plain = TokenEstimation()
    assert plain.name == "chars/4" and plain.template == MessageOverhead()
    assert plain.message("user", "abcdefgh") == 2 and plain.turn("abcde", "a") == 3


def test_a_message_costs_its_text_and_the_template_around_it() -> None:
    estimation = TokenEstimation().with_template(TEMPLATE)
    assert estimation.name == "chars/4+template:test(user 3, assistant 5)"
    assert estimation.message("user", "abcdefgh") == 2 + 3
    assert estimation.message("assistant", "abcdefgh") == 2 + 5
    assert estimation.message("system", "abcdefgh") == 2  # the system prompt is in every report: not counted
    assert estimation.message("assistant", "   ") == 1  # a blank message is never sent: no markup for it
    assert estimation.turn("abcde", "a") == (2 + 3) + (1 + 5)


def test_the_budget_adds_the_templated_reply_after_a_report_and_drops_templated_turns() -> None:
    budget = TokenBudget(2000, 0.5).with_estimation(TokenEstimation().with_template(TEMPLATE))  # prunes above 1000
    sync(budget, "a" * 400, "b" * 400)  # no report: (100 + 3) + (100 + 5)
    assert budget.fullness() == 208
    sync(budget, "c" * 400, "d" * 40, input_tokens=900)  # the report, then the reply and its markup
    assert budget.fullness() == 900 + 10 + 5
    sync(budget, "e" * 4, "f" * 400, input_tokens=990)  # 990 + 105 > 1000: the oldest turn (208) goes
    assert [t.user[0] for t in budget.history] == ["c", "e"]
    assert budget.fullness() == 990 + 105 - 208


def test_template_from_config_needs_a_known_name(tmp_path: Path) -> None:
    (tmp_path / "kvjudge.toml").write_text('[context.estimation]\ntemplate = "llama-9"\n')
    with pytest.raises(ConfigError, match='template must be one of "model", "chatml", got \'llama-9\''):
        Settings.load(tmp_path / "kvjudge.toml")


@pytest.mark.model
def test_the_judge_models_template_costs_five_tokens_a_message(judge_model: Path) -> None:
    # Qwen2.5's template writes "<|im_start|>" role "\n" text "<|im_end|>" "\n" around every message: the two
    # markers are single special tokens, and so are the role word and each newline.
    tokenizer = ModelTokenizer(judge_model)
    assert template_overhead(tokenizer, "model") == MessageOverhead("model", user=5, assistant=5)


@pytest.mark.model
def test_a_model_without_a_template_is_told_to_count_chatml(default_model: Path, tmp_path: Path) -> None:
    (tmp_path / "kvjudge.toml").write_text('[context.estimation]\ntemplate = "model"\n')
    with pytest.raises(ConfigError, match='no chat template of its own.*template "chatml"'):
        TokenEstimation.from_settings(Settings.load(tmp_path / "kvjudge.toml"), default_model)


CONVERSATION = [
    ("List the files in src/.", "src/reader.py, src/writer.py and src/__init__.py."),
    ("Why does test_quoted_fields fail?", "The reader splits on every comma, quoted or not: 'a,\"b,c\"' → 3 fields."),
    ("Rewrite it with csv.reader.", "```python\nfor row in csv.reader(handle):\n    yield row\n```"),
    ("日本語のファイル名でも動きますか？", "Yes: open() takes the name as str; pass encoding='utf-8' for the content."),
    ("Thanks — write the commit message.", "Read CSV with the csv module so quoted commas stay in their field"),
]


@pytest.mark.model
@pytest.mark.parametrize(("which", "template"), [("default_model", "chatml"), ("judge_model", "model")])
def test_with_the_models_tokenizer_the_anchored_figure_predicts_every_prompt(which: str, template: str,
                                                                           request: pytest.FixtureRequest) -> None:
    """Reports taken from the real rendered prompt: fullness + the next message is the next prompt's size.

    Counted with the model's own tokenizer the only error left is a token merging across the template's
    markup, so the prediction is within a token per message; without the template it misses every marker.
    """
    tokenizer = ModelTokenizer(request.getfixturevalue(which))
    render = chat_renderer(tokenizer.llama, template)

    def prompt_tokens(messages: list[dict[str, str]]) -> int:
        prompt, added_special = render(messages)
        return len(tokenizer.tokenize(prompt, add_bos=not added_special, special=True))

    exact = TokenEstimation(tokenizer).with_template(template_overhead(tokenizer, template))
    budgets = {"template": TokenBudget(100_000, 0.9).with_estimation(exact),
               "text only": TokenBudget(100_000, 0.9).with_estimation(TokenEstimation(tokenizer))}
    misses: dict[str, list[int]] = {name: [] for name in budgets}
    messages = [{"role": "system", "content": "You are a careful coding agent."}]
    for user, reply in CONVERSATION:
        messages.append({"role": "user", "content": user})
        sent = prompt_tokens(messages)
        for name, budget in budgets.items():
            if budget.anchor is not None:
                misses[name].append(budget.fullness() + budget.estimation.message("user", user) - sent)
            asyncio.run(budget.sync_turn(user, reply, TurnMetrics(sent)))
        messages.append({"role": "assistant", "content": reply})
    assert len(misses["template"]) == len(CONVERSATION) - 1
    assert all(abs(miss) <= 2 for miss in misses["template"]), misses
    overhead = exact.template.user + exact.template.assistant
    assert all(miss <= -overhead + 2 for miss in misses["text only"]), misses


@pytest.mark.model
def test_kvjudge_budget_names_the_template_it_counts(judge_model: Path, tmp_path: Path,
                                                    capsys: pytest.CaptureFixture[str]) -> None:
    config = tmp_path / "kvjudge.toml"
    config.write_text('[context.estimation]\ncounter = "model"\ntemplate = "model"\n')
    payload = cli_json_ok(capsys, "budget", "--model", str(judge_model), "--config", str(config))
    sha = ModelTokenizer(judge_model).sha256
    assert payload["estimation"] == f"model:{sha[:16]}+template:model(user 5, assistant 5)"
