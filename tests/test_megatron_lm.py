"""Reading checkpoints pai-zoo did not write: Megatron-LM's torch_dist and legacy torch folders (issue 16).

The real fixtures in ../shared/megatron-lm-fixtures (written by NVIDIA Megatron-LM) convert to HF bit-identical to
their source model, with the same config.json, and load with logits within 1e-4 of transformers'. The generator in
tests/megatron_lm_writer.py (proved against those fixtures in test_megatron_lm_writer.py) covers the layouts the
fixtures do not: PP=2, TP x PP = 2 x 2 with Transformer Engine names, a virtual pipeline, qkv biases, tied embeddings,
an odd vocabulary and head shapes, both torch_dist common-state forms, release/ and --iteration. Bad folders get one
error naming the file and write nothing.
"""
from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import pai_zoo
from pai_zoo.cli import main
from pai_zoo.conversion.entry import convert
from pai_zoo.formats.safe_pickle import allowing
from pai_zoo.models.megatron_checkpoint import open_megatron
from pai_zoo.plugin.errors import PaiZooError

HERE = Path(__file__).resolve().parent
FIXTURES = HERE.parents[0].parent / "shared" / "megatron-lm-fixtures"
HAVE_FIXTURES = (FIXTURES / "llama-hf" / "model.safetensors").is_file()
needs_fixtures = pytest.mark.skipif(not HAVE_FIXTURES,
                                    reason="Megatron-LM fixtures not present (../shared/megatron-lm-fixtures)")
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
#: the token ids of the fixture README's logits check
README_IDS = [1, 450, 4996, 17354, 1701, 432, 17204, 975, 278, 17366, 11203, 29889, 9038, 2501]
LOGITS_ATOL = 1e-4


import megatron_lm_writer as mlw  # noqa: E402 - registered by conftest.py


def _config_dict(folder: Path) -> dict:
    data = json.loads((folder / "config.json").read_text())
    data.pop("transformers_version", None)
    return data


def _hf_logits(folder: Path, ids) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(folder, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(torch.tensor([ids])).logits


# -- the real Megatron-LM fixtures ------------------------------------------------------------------------
@needs_fixtures
@pytest.mark.parametrize("fixture", ["llama-legacy-tp1", "llama-legacy-tp2", "llama-dist-tp2"])
def test_fixture_converts_bit_identical_and_loads_with_the_hf_logits(fixture, tmp_path, capsys):
    source, hf = FIXTURES / fixture, FIXTURES / "llama-hf"
    code = main(["convert", source, tmp_path / "out", "--to", "hf", "--tokenizer", hf])
    assert code == 0, capsys.readouterr().err
    out = tmp_path / "out"
    ours, theirs = load_file(out / "model.safetensors"), load_file(hf / "model.safetensors")
    assert ours.keys() == theirs.keys()
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    assert _config_dict(out) == _config_dict(hf)
    assert json.loads((out / "generation_config.json").read_text()) == \
        json.loads((hf / "generation_config.json").read_text())
    assert (out / "tokenizer.model").read_bytes() == (hf / "tokenizer.model").read_bytes()

    handle = pai_zoo.load(source, tokenizer=hf)
    assert handle.family.name == "llama" and handle.tokenizer is not None
    delta = (handle.logits(torch.tensor([README_IDS])) - _hf_logits(hf, README_IDS)).abs().max().item()
    assert delta < LOGITS_ATOL


@needs_fixtures
def test_without_a_tokenizer_the_args_alone_give_the_model_and_say_what_is_missing(tmp_path, capsys):
    assert main(["convert", FIXTURES / "llama-dist-tp2", tmp_path / "out", "--to", "hf"]) == 0
    printed = capsys.readouterr().out
    assert "has no tokenizer" in printed and "Megatron-LM's defaults" in printed
    out, hf = tmp_path / "out", FIXTURES / "llama-hf"
    assert not (out / "tokenizer.model").exists()
    ours, theirs = load_file(out / "model.safetensors"), load_file(hf / "model.safetensors")
    assert all(torch.equal(ours[k], theirs[k]) for k in theirs)
    want = {k: v for k, v in _config_dict(hf).items() if not k.endswith("_token_id")}
    got = _config_dict(out)
    assert {k: got.get(k) for k in want} == want


@needs_fixtures
def test_inspect_describes_a_megatron_lm_checkpoint(capsys):
    assert main(["inspect", FIXTURES / "llama-legacy-tp2"]) == 0
    out = capsys.readouterr().out
    for text in ("torch (written by Megatron-LM", "iteration:    1", "tensor parallel 2, pipeline parallel 1",
                 "family:       llama", "parameters:   4,194,624 (float32)", "--tokenizer DIR"):
        assert text in out
    assert "num_query_groups                     2" in out


@needs_fixtures
def test_train_starts_from_a_megatron_lm_checkpoint(tmp_path):
    """One step from llama-legacy-tp1 has the loss of one step from llama-hf: the same weights were loaded."""
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess
    from pai_zoo_conformance.cli_runs import run_cli

    corpus = toy.write_corpus(tmp_path / "corpus.jsonl", documents=20)
    preprocess([corpus], tmp_path / "toy", str(FIXTURES / "llama-hf"), append_eod=True, progress=False)
    losses = []
    for name, model in (("mlm", FIXTURES / "llama-legacy-tp1"), ("hf", FIXTURES / "llama-hf")):
        args = ["--model", str(model), "--data", str(tmp_path / "toy_text_document"), "--save", str(tmp_path / name),
                "--global-batch-size", "1", "--batch-size", "1", "--seq-length", "16", "--train-tokens", "32",
                "--warmup-tokens", "16", "--no-progress"]
        proc = run_cli(["train", *args])
        assert proc.returncode == 0, proc.stderr[-3000:]
        losses.append(json.loads((tmp_path / name / "metrics.jsonl").read_text().splitlines()[0])["loss"])
    assert losses[0] == pytest.approx(losses[1], abs=1e-5)


# -- generated layouts ---------------------------------------------------------------------------------------
def _llama_odd(tmp_path: Path):
    """Heads 6 with 2 key/value groups (GQA ratio 3), head_dim 12 != 48/6, a vocabulary of 250 (padded)."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(vocab_size=250, hidden_size=48, intermediate_size=80, num_hidden_layers=4,
                         num_attention_heads=6, num_key_value_heads=2, head_dim=12, rms_norm_eps=1e-5,
                         max_position_embeddings=128, tie_word_embeddings=False, bos_token_id=1, eos_token_id=2)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "norm" in name:
                p.add_(torch.randn_like(p) * 0.1)
    model.save_pretrained(tmp_path / "hf")
    return model, config


def _qwen2_tied(tmp_path: Path):
    """Qwen2: qkv biases, tied embeddings, 2 heads per group, rope_theta 1e6 (the args must carry it)."""
    from transformers import Qwen2Config, Qwen2ForCausalLM

    torch.manual_seed(1)
    config = Qwen2Config(vocab_size=300, hidden_size=32, intermediate_size=64, num_hidden_layers=4,
                         num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-6, rope_theta=1e6,
                         max_position_embeddings=128, tie_word_embeddings=True)
    model = Qwen2ForCausalLM(config).eval()
    model.save_pretrained(tmp_path / "hf")
    return model, config


@pytest.fixture(scope="module")
def llama(tmp_path_factory):
    return _llama_odd(tmp_path_factory.mktemp("llama"))


@pytest.fixture(scope="module")
def qwen2(tmp_path_factory):
    return _qwen2_tied(tmp_path_factory.mktemp("qwen2"))


LAYOUTS = {
    "legacy-pp2": dict(kind="legacy", pp=2),
    "legacy-tp2-pp2-te": dict(kind="legacy", tp=2, pp=2, te_names=True, with_optimizer=True),
    "legacy-vpp2": dict(kind="legacy", pp=2, vpp=2),
    "legacy-tp2-release": dict(kind="legacy", tp=2, release=True),
    "dist-tp2-common-pt": dict(kind="dist", tp=2),
    "dist-tp2-common-state": dict(kind="dist", tp=2, common_in_metadata=True),
}


def _write(kind: str, model, config, dst: Path, **options) -> None:
    write = mlw.write_legacy if kind == "legacy" else mlw.write_torch_dist
    overrides = options.pop("args_overrides", {})
    overrides.setdefault("layernorm_epsilon", config.rms_norm_eps)
    overrides.setdefault("rotary_base", getattr(config, "rope_theta", None) or config.rope_parameters["rope_theta"])
    write(model, config, dst, args_overrides=overrides, **options)


def _assert_same_hf_tensors(checkpoint, model) -> None:
    state = model.state_dict()
    got = dict(checkpoint.hf_tensors(expected=state.keys()))
    assert got.keys() == state.keys()
    wrong = [k for k in state if not torch.equal(got[k], state[k])]
    assert not wrong, wrong


@pytest.mark.parametrize("layout", list(LAYOUTS))
def test_generated_llama_layouts_read_bit_identical(layout, llama, tmp_path):
    model, config = llama
    options = dict(LAYOUTS[layout])
    _write(options.pop("kind"), model, config, tmp_path / "ckpt", **options)
    with open_megatron(tmp_path / "ckpt") as checkpoint:  # the args alone: no reference config
        assert checkpoint.family.name == "llama"
        assert checkpoint.config["vocab_size"] == 250 and checkpoint.padded_vocab_size > 250
        assert checkpoint.config.kv_channels == 12 and checkpoint.config.num_query_groups == 2
        _assert_same_hf_tensors(checkpoint, model)


@pytest.mark.parametrize("kind", ["legacy", "dist"])
def test_qkv_bias_and_tied_embeddings_pick_qwen2_and_load_with_its_logits(kind, qwen2, tmp_path):
    model, config = qwen2
    options = dict(pp=2, ep=2) if kind == "legacy" else dict(tp=2, common_in_metadata=True)
    _write(kind, model, config, tmp_path / "ckpt", **options)
    with open_megatron(tmp_path / "ckpt") as checkpoint:
        assert checkpoint.family.name == "qwen2" and checkpoint.config.tied_embeddings
        assert checkpoint.config["rotary_base"] == 1e6 and checkpoint.config["layernorm_epsilon"] == 1e-6
        _assert_same_hf_tensors(checkpoint, model)
    handle = pai_zoo.load(tmp_path / "ckpt")
    ids = torch.tensor([[3, 17, 250, 299, 5, 42, 7, 1]])
    with torch.no_grad():
        expected = model(ids).logits
    assert (handle.logits(ids) - expected).abs().max().item() < LOGITS_ATOL


def test_reference_config_supplies_what_the_args_drop(llama, tmp_path):
    """Megatron-LM's Llama loader stores its default epsilon; the reference config.json's value wins, said aloud."""
    model, config = llama
    hf_dir = tmp_path / "hf"
    model.config.rms_norm_eps = 1e-6
    model.save_pretrained(hf_dir)
    _write("legacy", model, config, tmp_path / "ckpt", args_overrides={"layernorm_epsilon": 1e-5})
    with open_megatron(tmp_path / "ckpt") as checkpoint:
        assert checkpoint.config["layernorm_epsilon"] == 1e-5
    with open_megatron(tmp_path / "ckpt", reference=hf_dir) as checkpoint:
        assert checkpoint.config["layernorm_epsilon"] == 1e-6
        assert any("layernorm_epsilon" in n and "1e-06" in n for n in checkpoint.notes)


def test_iteration_flag_and_tracker_pick_the_saved_iteration(llama, tmp_path):
    model, config = llama
    _write("legacy", model, config, tmp_path / "ckpt", iteration=5)
    other = {k: v + 1 for k, v in model.state_dict().items()}
    _write("legacy", other, config, tmp_path / "ckpt", iteration=9)  # the tracker now says 9
    with open_megatron(tmp_path / "ckpt") as checkpoint:
        first = dict(checkpoint.hf_tensors())
    with open_megatron(tmp_path / "ckpt", iteration=5) as checkpoint:
        _assert_same_hf_tensors(checkpoint, model)
    assert torch.equal(first["model.norm.weight"], other["model.norm.weight"])


def test_family_flag_when_no_family_claims_the_args(llama, tmp_path, capsys):
    model, config = llama
    _write("legacy", model, config, tmp_path / "ckpt", args_overrides={"qk_layernorm": False, "swiglu": False})
    code = main(["convert", tmp_path / "ckpt", tmp_path / "out", "--to", "hf"])
    err = capsys.readouterr().err
    assert code == 1 and "no installed family claims these args" in err and "--family NAME" in err
    assert "Traceback" not in err and not (tmp_path / "out").exists()


# -- bad input: one line naming the file, nothing written ----------------------------------------------------------
def _bad(tmp_path, llama, damage) -> tuple[int, str]:
    model, config = llama
    ckpt = tmp_path / "ckpt"
    _write(damage.get("kind", "legacy"), model, config, ckpt, **damage.get("options", {}))
    extra = damage["apply"](ckpt)
    return ckpt, extra


class _Evil:
    def __reduce__(self):
        import os

        return (os.system, ("echo pwned > /dev/null",))


BAD = {
    "missing-rank": dict(options=dict(tp=2), apply=lambda c: (c / "iter_0000001" / "mp_rank_01" / "model_optim_rng.pt")
                         .unlink(), message="mp_rank_01/model_optim_rng.pt: missing"),
    "unsafe-common": dict(kind="dist", apply=lambda c: torch.save({"args": _Evil()}, c / "iter_0000001" / "common.pt"),
                          message="common.pt: cannot be read safely: its pickle needs posix.system"),
    "truncated-distcp": dict(kind="dist", options=dict(tp=2), apply=lambda c: (c / "iter_0000001" / "__1_0.distcp")
                             .write_bytes((c / "iter_0000001" / "__1_0.distcp").read_bytes()[:100]),
                             message="__1_0.distcp"),
    "no-such-iteration": dict(apply=lambda c: ["--iteration", "7"],
                              message="iteration 7 was not saved"),
    "tokenizer-disagrees": dict(apply=lambda c: ["--tokenizer", str(c.parent / "other")],
                                message="hidden_size: 32 in"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_checkpoints_fail_with_one_line_naming_the_file(case, llama, qwen2, tmp_path, capsys):
    qwen2[0].save_pretrained(tmp_path / "other")
    ckpt, extra = _bad(tmp_path, llama, BAD[case])
    code = main(["convert", ckpt, tmp_path / "out", "--to", "hf", *(extra if isinstance(extra, list) else [])])
    err = capsys.readouterr().err
    assert code == 1, err
    assert BAD[case]["message"] in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("pai-zoo: error:")]) == 1
    assert not (tmp_path / "out").exists()
    assert not [p for p in tmp_path.iterdir() if p.name.startswith(".out")]


def test_unsafe_pickle_is_refused_without_running_it(tmp_path):
    from pai_zoo.models.megatron_checkpoint import safe_load

    ran = tmp_path / "ran"
    torch.save({"args": _Touch(ran)}, tmp_path / "common.pt")
    with pytest.raises(PaiZooError, match="cannot be read safely"):
        safe_load(tmp_path / "common.pt")
    assert not ran.exists()


class _Touch:
    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        import pathlib

        return (pathlib.Path.touch, (pathlib.Path(self.path),))


def test_convert_megatron_lm_to_pai_zoo_layout(llama, tmp_path):
    """--to mcore re-lays a Megatron-LM checkpoint out as pai-zoo's (here for TP 2), the same tensors."""
    model, config = llama
    _write("legacy", model, config, tmp_path / "ckpt", pp=2)
    report = convert(tmp_path / "ckpt", tmp_path / "mcore", "mcore", tp=2, tokenizer=None)
    assert report.family == "llama" and (tmp_path / "mcore" / "pai_zoo.json").is_file()
    with open_megatron(tmp_path / "mcore") as checkpoint:
        _assert_same_hf_tensors(checkpoint, model)


def test_megatron_core_reads_the_generated_common_state_entry(llama, tmp_path):
    """megatron-core's own load_common_state_dict (0.19 reads the common_state entry) sees what pai-zoo reads."""
    import argparse
    import signal

    from megatron.core.dist_checkpointing import serialization
    from megatron.core.enums import ModelType
    from megatron.core.transformer.enums import AttnBackend

    if not hasattr(serialization, "_legacy_common_state_exists"):
        pytest.skip("this megatron-core reads only common.pt (the common_state entry came with 0.19); "
                    "the Python 3.12 pass runs it")
    model, config = llama
    _write("dist", model, config, tmp_path / "ckpt", tp=2, common_in_metadata=True)
    folder = tmp_path / "ckpt" / "iter_0000001"
    assert not (folder / "common.pt").exists()
    with allowing([argparse.Namespace, signal.Signals, ModelType, AttnBackend]):
        theirs = serialization.load_common_state_dict(str(folder))
    with open_megatron(tmp_path / "ckpt") as checkpoint:
        ours = checkpoint.description.common
    assert sorted(theirs) == sorted(ours) and vars(theirs["args"]) == vars(ours["args"])


def test_args_tokenizer_model_folder_is_the_reference_and_an_unknown_vocabulary_keeps_the_padding(llama, tmp_path):
    model, config = llama
    hf_dir = tmp_path / "hf"
    model.save_pretrained(hf_dir)
    _write("legacy", model, config, tmp_path / "named", args_overrides={"tokenizer_model": str(hf_dir)})
    report = convert(tmp_path / "named", tmp_path / "out", "hf")
    assert any("args.tokenizer_model" in n for n in report.notes)
    assert json.loads((tmp_path / "out" / "config.json").read_text())["vocab_size"] == 250
    _write("legacy", model, config, tmp_path / "bare", args_overrides={"vocab_size": None})
    with open_megatron(tmp_path / "bare") as checkpoint:
        assert checkpoint.config["vocab_size"] == checkpoint.padded_vocab_size == 256
        assert any(n.startswith("warning:") and "256 padded rows" in n for n in checkpoint.notes)
        got = dict(checkpoint.hf_tensors())
    assert torch.equal(got["model.embed_tokens.weight"][:250], model.state_dict()["model.embed_tokens.weight"])
    assert not got["model.embed_tokens.weight"][250:].any()  # Megatron's padding rows, kept


def test_safe_load_keeps_megatron_cores_own_allow_list(tmp_path):
    """Reading a Megatron-LM pickle must not undo megatron-core's process-wide safe globals (argparse.Namespace):
    megatron-core's dist_checkpointing.load of any later checkpoint relies on them."""
    import argparse

    import megatron.core  # noqa: F401 - registers megatron-core's SAFE_GLOBALS

    from pai_zoo.models.megatron_checkpoint import safe_load

    assert argparse.Namespace in torch.serialization.get_safe_globals()
    torch.save({"args": argparse.Namespace(num_layers=2)}, tmp_path / "common.pt")
    assert safe_load(tmp_path / "common.pt")["args"].num_layers == 2
    assert argparse.Namespace in torch.serialization.get_safe_globals()
    assert torch.load(tmp_path / "common.pt", weights_only=True)["args"].num_layers == 2
