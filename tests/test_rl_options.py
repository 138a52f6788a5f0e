"""``pai-zoo rl`` options: train's names (``--clip-grad``, ``--max-grad-norm`` kept as an alias), defaults in
``--help``, and ``--chat`` (the chat template ``generate --chat`` applies) for prompts and preference pairs."""
from __future__ import annotations

import argparse
import json
import re

import pytest

from pai_zoo.cli import main
from pai_zoo.cli._common import HelpFormatter
from pai_zoo.cli.rl import _show_defaults
from pai_zoo.data.sft import build_example
from pai_zoo.generation import encode_prompt
from pai_zoo.rl.data import read_pairs, read_prompts
from pai_zoo.rl.ppo import PPOTrainer
from pai_zoo.rl.reward import RewardTrainer

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]  # tests/conftest.py


@pytest.fixture(scope="module")
def tokenizer():
    from pai_zoo.tokenizers.names import resolve_tokenizer

    return resolve_tokenizer("llama3-tiny").load()


def _parser(cls) -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    cls.add_arguments(parser)
    return parser


def _help(argv, capsys) -> str:
    with pytest.raises(SystemExit):
        main(argv)
    return " ".join(capsys.readouterr().out.split())


@pytest.mark.parametrize("cls, required", [
    (PPOTrainer, ["--actor", "a", "--reward", "rule:contains=1", "--prompts", "p", "--save", "s"]),
    (RewardTrainer, ["--model", "m", "--data", "d", "--save", "s"]),
])
def test_clip_grad_is_the_name_and_max_grad_norm_an_alias(cls, required):
    parser = _parser(cls)
    assert parser.parse_args(required).max_grad_norm == 1.0
    assert parser.parse_args([*required, "--clip-grad", "0.5"]).max_grad_norm == 0.5
    assert parser.parse_args([*required, "--max-grad-norm", "0.25"]).max_grad_norm == 0.25
    assert parser.parse_args(required).chat is False and parser.parse_args([*required, "--chat"]).chat is True


@pytest.mark.parametrize("trainer", ["ppo", "reward"])
def test_rl_help_shows_every_default(trainer, capsys):
    text = _help(["rl", trainer, "--help"], capsys).split(" options: ", 1)[1]  # past the usage lines
    assert "--clip-grad NORM, --max-grad-norm NORM" in text
    cls = {"ppo": PPOTrainer, "reward": RewardTrainer}[trainer]
    for action in _parser(cls)._actions:
        if not action.option_strings or action.default in (None, argparse.SUPPRESS) or isinstance(action.default, bool):
            continue
        flags = HelpFormatter("pai-zoo")._format_action_invocation(action)
        after = text.split(f" {flags} ", 1)[1]
        assert after.split("(default: ", 1)[1].startswith(f"{action.default})"), (flags, after[:200])
    if trainer == "ppo":  # 1.0 and 0 are shown too (they equal True and False)
        assert "--gamma GAMMA GAE discount (default: 1.0)" in text and "(default: 0)" in text


def test_a_plugin_flag_without_help_shows_its_default():
    parser = argparse.ArgumentParser(formatter_class=HelpFormatter)
    parser.add_argument("--beta", type=float, default=0.1)
    parser.add_argument("--flag", action="store_true")
    _show_defaults(parser)
    text = " ".join(parser.format_help().split())
    assert "--beta BETA default: 0.1" in text and "--flag" in text


def _jsonl(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_rl_chat_prompts_use_the_generate_chat_template(tmp_path, tokenizer):
    chat = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi there"}]
    path = _jsonl(tmp_path / "prompts.jsonl", [{"prompt": "Hi there"}, {"messages": chat}, {"prompt": [5, 6, 7]}])
    plain = read_prompts(_jsonl(tmp_path / "plain.jsonl", [{"prompt": "Hi there"}]), tokenizer)
    with_chat = read_prompts(path, tokenizer, chat=True)
    user = [{"role": "user", "content": "Hi there"}]
    assert with_chat == [encode_prompt(user, tokenizer, chat=True), encode_prompt(chat, tokenizer, chat=True),
                         [5, 6, 7]]
    assert with_chat[0] != plain[0] and len(with_chat[0]) > len(plain[0])  # the template's role headers
    rendered = tokenizer.decode(with_chat[1])
    assert "Be brief." in rendered and rendered.rstrip().endswith("[/INST]")  # the tokenizer's own (Llama 2) template


def test_rl_chat_pairs_split_at_the_generation_prompt(tmp_path, tokenizer):
    path = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": "Is the sky blue?", "chosen": "Yes.", "rejected": "No."}])
    [pair] = read_pairs(path, tokenizer, chat=True)
    assert pair.prompt == encode_prompt("Is the sky blue?", tokenizer, chat=True)
    assert tokenizer.decode(pair.chosen).startswith("Yes.") and tokenizer.decode(pair.rejected).startswith("No.")
    # split where SFT data's loss mask starts: the response is the assistant turn and what closes it
    chat = [{"role": "user", "content": "Is the sky blue?"}, {"role": "assistant", "content": "Yes."}]
    ids, mask = build_example(chat, tokenizer)
    assert pair.prompt + pair.chosen == ids and mask == [0] * len(pair.prompt) + [1] * len(pair.chosen)
    [plain] = read_pairs(path, tokenizer)
    assert plain.prompt != pair.prompt


def test_rl_chat_pairs_reject_token_ids(tmp_path, tokenizer):
    path = _jsonl(tmp_path / "pairs.jsonl", [{"prompt": "q", "chosen": [1, 2], "rejected": "No."}])
    with pytest.raises(Exception, match=re.escape("pairs.jsonl:1: with --chat, 'chosen' must be text")):
        read_pairs(path, tokenizer, chat=True)
