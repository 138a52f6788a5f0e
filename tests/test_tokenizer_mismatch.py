"""A tokenizer of another model (issue 44, item 4): one rule (pai_zoo.tokenizers.fit.misfit) decides, from the
tokenizer and config.json alone, before any model is built; ``inspect`` names the mismatch and exits 1, ``generate``,
``eval`` and ``train`` refuse it in one line, and all four go on when told ``--tokenizer-mismatch-ok``.

The rule: more tokens than embedding rows, more rows than tokens beyond padding (max(1024, 5%)), or a special-token
id outside the rows, is a mismatch; a bos/eos id that differs from the config's inside the rows is only a note
(released checkpoints and the tutorial's folder have it).
"""
from __future__ import annotations

import shutil
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pai_zoo.data.indexed import IndexedDatasetWriter
from pai_zoo.tokenizers.fit import ModelIds, id_notes, misfit, model_ids
from pai_zoo_conformance.cli_runs import main_result as run

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]  # tests/conftest.py


def _tok(size, bos=None, eos=None, pad=None):
    return SimpleNamespace(vocab_size=size, bos_id=bos, eos_id=eos, pad_id=pad, path=Path("tok/tokenizer.json"))


@pytest.mark.parametrize("rows, tokens, fits", [
    (151936, 151665, True),   # Qwen2: padding
    (32064, 32011, True),     # Phi-3: padding
    (102400, 100015, True),   # DeepSeek-V2: padding
    (128256, 128256, True),   # Llama-3 with its own
    (49152, 128256, False),   # SmolLM2 with Llama-3's tokenizer: ids past the rows
    (128256, 49152, False),   # Llama-3 with SmolLM2's: far more rows than tokens
    (1000, 600, True),        # a test preset's toy vocabulary: within the 1024 floor
])
def test_the_rule_allows_padding_and_refuses_another_models_vocabulary(rows, tokens, fits):
    assert (misfit(_tok(tokens), ModelIds(rows)) is None) == fits


def test_special_ids_outside_the_rows_are_a_mismatch_and_other_ids_a_note():
    model = model_ids(1000, {"bos_token_id": 1, "eos_token_id": [2, 7]}, {"eos_token_id": 9})
    assert model == ModelIds(1000, (1,), (2, 7, 9))
    assert misfit(_tok(600, bos=1, eos=9), model) is None and id_notes(_tok(600, bos=1, eos=9), model) == []
    assert misfit(_tok(600, eos=0), model) is None  # a note only
    assert id_notes(_tok(600, eos=0), model) == ["its eos 0 is not the config's eos_token_id [2, 7, 9]"]
    assert misfit(_tok(600, pad=1200), model) == "its pad 1200 is outside the model's 1000 embedding rows"
    text = model_ids(500, {"text_config": {"eos_token_id": 4}})  # a vision-language config
    assert text.eos == (4,)


@pytest.fixture(scope="module")
def folders(tmp_path_factory) -> Path:
    """``smol``: llama3-tiny with 400 rows and a 400-token toy tokenizer; ``mismatch``: the same model with a
    410-token tokenizer (another model's); ``data``: a small dataset of ids below 400."""
    import pai_zoo
    from pai_zoo.data import toy

    root = tmp_path_factory.mktemp("mismatch")
    toy.write_tokenizer(root / "smol", vocab_size=400)
    pai_zoo.load("llama3-tiny", backend="hf", vocab_size=400, tie_word_embeddings=True).model.save_pretrained(
        root / "smol")
    shutil.copytree(root / "smol", root / "mismatch")
    toy.write_tokenizer(root / "mismatch", vocab_size=1000)  # the toy grammar gives it 410 tokens
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(root / "data", np.uint16) as writer:
        for _ in range(8):
            writer.add_document(rng.integers(3, 400, size=40).tolist())
    return root




def _refused(code, out, err, where: Path, how: str) -> None:
    lines = err.strip().splitlines()
    assert code == 1 and "Traceback" not in out + err
    assert lines == [lines[0]] and lines[0].startswith(f"pai-zoo: error: {where}: its tokenizer ({where}/tokenizer"
                                                     ".json: 410 tokens, eos 0, pad 0) does not fit the model "
                                                     "(vocab_size 400, bos_token_id 1, eos_token_id 2): its ids "
                                                     "reach 409, past the model's 400 embedding rows; a tokenizer of "
                                                     "another model? ")
    assert lines[0].endswith(f"{how}, or --tokenizer-mismatch-ok to go on")


def _no_load(monkeypatch, module):
    def load(*args, **kwargs):
        raise AssertionError("the model was loaded before the tokenizer was checked")
    monkeypatch.setattr(module, "load", load)


def test_inspect_names_the_mismatch_and_describes_it_when_told(folders, capsys):
    mismatch = folders / "mismatch"
    _refused(*run(["inspect", mismatch], capsys), mismatch, f"put the model's own tokenizer files in {mismatch}")
    code, out, err = run(["inspect", mismatch, "--tokenizer-mismatch-ok"], capsys)
    assert code == 0 and "needs nothing more" in out
    assert ("tokenizer:    DOES NOT FIT: its tokenizer (" in out and "its ids reach 409, past the model's 400 "
            "embedding rows" in out)
    code, out, err = run(["inspect", folders / "smol"], capsys)
    assert code == 0, err
    assert ("tokenizer:    400 tokens, eos 0, pad 0: fits the model (vocab_size 400); note: its eos 0 is not the "
            "config's eos_token_id 2") in out


def test_generate_refuses_before_loading_and_goes_on_when_told(folders, capsys, monkeypatch):
    import pai_zoo.cli.generate as generate

    mismatch = folders / "mismatch"
    with monkeypatch.context() as patch:
        _no_load(patch, generate)
        _refused(*run(["generate", "--model", mismatch, "--prompt", "the cat", "--max-new-tokens", "2"], capsys),
                 mismatch, f"put the model's own tokenizer files in {mismatch}")
    code, out, err = run(["generate", "--model", mismatch, "--prompt", "the cat", "--max-new-tokens", "2",
                          "--backend", "hf", "--tokenizer-mismatch-ok"], capsys)
    assert code == 0, err
    assert err.startswith(f"pai-zoo: warning: {mismatch}: its tokenizer (") and "(going on: --tokenizer-mismatch-ok)" \
        in err
    code, out, err = run(["generate", "--model", folders / "smol", "--prompt", "the cat", "--max-new-tokens", "2",
                          "--backend", "hf"], capsys)
    assert code == 0 and "warning" not in err, err


def test_eval_refuses_before_loading_and_goes_on_when_told(folders, capsys, monkeypatch):
    import pai_zoo.cli.eval as evaluate

    mismatch, data = folders / "mismatch", folders / "data"
    common = ["--data", data, "--seq-length", "16", "--packing", "document", "--max-tokens", "64", "--backend", "hf",
              "--no-progress"]
    with monkeypatch.context() as patch:
        _no_load(patch, evaluate)
        _refused(*run(["eval", mismatch, *common], capsys), mismatch,
                 f"put the model's own tokenizer files in {mismatch}")
        # the --tokenizer given replaces the model's own: it is the one checked, and the fix names the flag
        code, out, err = run(["eval", folders / "smol", *common, "--tokenizer", mismatch], capsys)
        assert code == 1 and err.count("\n") == 1 and "give the right --tokenizer, or --tokenizer-mismatch-ok" in err
    code, out, err = run(["eval", mismatch, *common, "--tokenizer-mismatch-ok", "--output", folders / "loss.json"],
                         capsys)
    assert code == 0, err
    assert (folders / "loss.json").is_file() and "(going on: --tokenizer-mismatch-ok)" in err


@pytest.mark.megatron  # pai_zoo.training.trainer imports megatron-core
def test_train_refuses_the_model_before_building_it_and_goes_on_when_told(folders, tmp_path):
    """The trainer checks its source before megatron-core builds anything; the setting is a TrainConfig field with
    the flag ``--tokenizer-mismatch-ok`` (and the YAML key ``tokenizer_mismatch_ok``)."""
    from pai_zoo.tokenizers.fit import TokenizerMismatchError
    from pai_zoo.training.config import TrainConfig
    from pai_zoo.training.trainer import Trainer

    def config(**given):
        return TrainConfig.load(None, {"--model": str(folders / "mismatch"), "--data": [str(folders / "data")],
                                       "--save": str(tmp_path / "run"), **given})

    with pytest.raises(TokenizerMismatchError, match="or --tokenizer-mismatch-ok to go on"):
        Trainer(config())._source()
    cfg = config(**{"--tokenizer-mismatch-ok": True})
    assert cfg.tokenizer_mismatch_ok is True
    with pytest.warns(UserWarning, match=r"\(going on: --tokenizer-mismatch-ok\)"):
        assert Trainer(cfg)._source().path == folders / "mismatch"
    assert not (tmp_path / "run").exists()


@pytest.mark.megatron
def test_train_cli_refuses_in_one_line_and_writes_nothing(folders, tmp_path, capsys):
    mismatch = folders / "mismatch"
    code, out, err = run(["train", "--model", mismatch, "--data", folders / "data", "--save", tmp_path / "run",
                          "--global-batch-size", "2", "--batch-size", "1", "--seq-length", "16", "--train-iters", "1",
                          "--no-progress"], capsys)
    _refused(code, out, err, mismatch, f"put the model's own tokenizer files in {mismatch}")
    assert not (tmp_path / "run").exists()


def test_rl_refuses_a_model_folder_with_another_models_tokenizer(folders, tmp_path, capsys):
    """Every RL trainer's model settings (``--model``, ``--actor`` ...) are checked before the trainer starts; the
    flag is added to each trainer."""
    pairs = tmp_path / "pairs.jsonl"
    pairs.write_text('{"prompt": "the cat", "chosen": " sees", "rejected": " tower"}\n')
    mismatch = folders / "mismatch"
    code, out, err = run(["rl", "reward", "--model", mismatch, "--data", pairs, "--epochs", "1", "--save",
                          tmp_path / "run"], capsys)
    _refused(code, out, err, mismatch, f"put the model's own tokenizer files in {mismatch}")
    assert not (tmp_path / "run").exists()
    code, out, err = run(["rl", "reward", "--help"], capsys)
    assert "--tokenizer-mismatch-ok" in out
