"""``docs/configuration.md`` against the settings dataclasses it is generated from (``pai_zoo.cli._docs``): the
committed file is the generated text, every setting has its flags and meaning, every spelling in the table is
accepted by both the flag parser and the YAML reader, and the worked YAML examples are valid settings."""
from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from pai_zoo.cli import _docs
from pai_zoo.generation import SamplingParams
from pai_zoo.training.config import SETTINGS, TrainConfig, aliases

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

DOC = Path(__file__).resolve().parents[1] / "docs" / "configuration.md"


def test_committed_docs_are_the_generated_text():
    assert DOC.is_file(), "docs/configuration.md is missing: python -m pai_zoo.cli._docs > docs/configuration.md"
    assert DOC.read_text() == _docs.configuration_markdown(), (
        "docs/configuration.md and the settings dataclasses drifted apart; regenerate it with "
        "python -m pai_zoo.cli._docs > docs/configuration.md")


def test_every_setting_has_flags_and_a_meaning():
    names = [f.name for f in dataclasses.fields(TrainConfig)]
    assert sorted(SETTINGS) == sorted(names)
    assert sorted(_docs.SAMPLING) == sorted(f.name for f in dataclasses.fields(SamplingParams))
    text = DOC.read_text()
    for name in names:
        setting = SETTINGS[name]
        assert setting.flags and setting.help, name
        row = next((line for line in text.splitlines() if line.startswith(f"| `{name}` |")), None)
        assert row is not None, f"{name} has no row in docs/configuration.md"
        assert f"`{setting.flags[0]}`" in row and setting.help in row
        if setting.megatron:
            assert f"`{setting.megatron}`" in row


def _sample(f: dataclasses.Field):
    kind = str(f.type)
    if kind.startswith("bool"):
        return True
    if kind.startswith("list"):
        return ["p"]
    if kind.startswith("int"):
        return 3
    if kind.startswith("float"):
        return 0.25
    return "linear"


@pytest.mark.parametrize("key", sorted(aliases()))
def test_every_spelling_is_a_yaml_key_and_a_flag(key, tmp_path):
    from pai_zoo.cli import build_parser, parse
    from pai_zoo.cli.train import GIVEN

    name, negated = aliases()[key]
    f = next(f for f in dataclasses.fields(TrainConfig) if f.name == name)
    value = _sample(f)
    want = (not value) if negated else value
    file = tmp_path / "one.yaml"
    file.write_text(f"{key}: {value}\n")
    assert getattr(TrainConfig.load(file), name) == want, key
    flag = "--" + key.replace("_", "-")
    if flag in SETTINGS[name].all_flags:  # the field's own name is a key, not necessarily a flag
        values = [] if SETTINGS[name].switch is not None else value if isinstance(value, list) else [value]
        argv = ["train", flag, *map(str, values)]
        args = parse(build_parser(), argv)
        got = TrainConfig.load(None, getattr(args, GIVEN))
        assert getattr(got, name) == (SETTINGS[name].switch if SETTINGS[name].switch is not None else want), flag


def test_the_yaml_examples_are_valid_settings(tmp_path):
    loaded = {}
    for title, (_, text) in _docs.EXAMPLES.items():
        file = tmp_path / "example.yaml"
        file.write_text(text)
        loaded[title] = cfg = TrainConfig.load(file)
        cfg.validate(world_size=cfg.tensor_parallel_size * cfg.pipeline_parallel_size * 4)
        assert f"```yaml\n{text}```" in DOC.read_text()
    cpt, sft = loaded["Continued pretraining"], loaded["SFT"]
    assert (cpt.train_steps, cpt.warmup_steps, cpt.tensor_parallel_size, cpt.batch_size, cpt.learning_rate) == \
        (2000, 100, 2, 4, 3e-4)
    assert cpt.data_blend() == (["data/books_text_document", "data/web_text_document"], [0.7, 0.3])
    assert (sft.sft, sft.train_steps, sft.warmup_steps, sft.save_optim, sft.lr_decay_style) == \
        (True, 200, 10, False, "linear")


def test_generate_flags_and_defaults_are_sampling_params():
    from pai_zoo.cli import build_parser, command_parser

    parser = build_parser()
    generate = command_parser(parser, parser.parse_args(["generate", "--model", "m"]))
    actions = {option: action for action in generate._actions for option in action.option_strings}
    for f in dataclasses.fields(SamplingParams):
        flag, _ = _docs.SAMPLING[f.name]
        if flag is None:
            continue
        assert flag in actions, f"generate has no {flag}"
        if f.default is not dataclasses.MISSING and f.default != ():
            assert actions[flag].default == f.default, flag
