"""FP8 block-scaled checkpoints (DeepSeek-V3/R1, Qwen3-FP8) read as published and written back the same way.

The FP8 folders are built as the published ones are laid out: a random bf16 model from transformers, every linear
weight (experts' included; not the embeddings, norms, router or head) quantized per 128x128 block by the test's own
loop (``amax / 448``, cross-checked against transformers' ``Fp8Quantize`` where the shapes divide), written with
safetensors in two shards with an index, ``quantization_config`` in config.json. The dimensions are no multiples of
128, so the edge blocks are partial; one weight holds zeros, -0.0, +-448 and e4m3 subnormals, another has scales
1.5 times amax / 448 (as a quantizer with headroom writes them), which only reusing the recorded scales reproduces.
"""
from __future__ import annotations

import json
import types
from pathlib import Path

import pytest
import torch
from fp8_reference import (  # noqa: E402 - registered by conftest.py
    QUANT,
    bytes_of,
    is_quantized,
    reference_dequantize,
    reference_quantize,
    write_fp8_folder,
)
from safetensors.torch import load_file, save_file

import pai_zoo
from pai_zoo import formats
from pai_zoo.conversion.entry import convert
from pai_zoo.formats.encodings import fp8_blocks
from pai_zoo_conformance.cli_runs import run_cli

MODELS = {
    # dense: 6 heads of 20 in 2 KV groups, hidden 200, FFN 300 (grids 1x2, 3x2, 2x3), vocabulary 997
    "qwen3": ("qwen3-odd", {"hidden_size": 200, "intermediate_size": 300}),
    # MoE with MLA: hidden 200, dense FFN 300, experts' FFN 136 (grid 2x2: 8 rows in the edge block)
    "deepseek-v3": ("deepseek-v3-tiny", {"hidden_size": 200, "intermediate_size": 300, "moe_intermediate_size": 136}),
}
IDS = torch.tensor([[1, 5, 9, 77, 300, 2, 8, 41, 123, 7, 250, 19]])


@pytest.fixture(scope="module", params=list(MODELS))
def fp8(request, tmp_path_factory):
    preset, overrides = MODELS[request.param]
    root = tmp_path_factory.mktemp(f"fp8-{request.param}")
    model = pai_zoo.load(preset, backend="hf", seed=0, **overrides).model.to(torch.bfloat16)
    model.save_pretrained(root / "bf16")
    written = write_fp8_folder(root / "bf16", root / "fp8")
    # the reference: the test's own dequantization, in fp32, saved as a plain folder for transformers
    reference = {n: reference_dequantize(t, written[n[: -len("weight")] + "weight_scale_inv"])
                 if t.dtype == torch.float8_e4m3fn else t.float() for n, t in written.items()
                 if not n.endswith("weight_scale_inv")}
    (root / "dequantized").mkdir()
    save_file(reference, str(root / "dequantized" / "model.safetensors"), metadata={"format": "pt"})
    config = json.loads((root / "bf16" / "config.json").read_text())
    (root / "dequantized" / "config.json").write_text(json.dumps({**config, "dtype": "float32"}))
    return types.SimpleNamespace(name=request.param, root=root, folder=root / "fp8", written=written,
                                 reference=reference)


def test_the_folder_is_laid_out_as_published(fp8):
    quantized = [n for n, t in fp8.written.items() if t.dtype == torch.float8_e4m3fn]
    assert quantized and all(fp8.written[n[: -len("weight")] + "weight_scale_inv"].dtype == torch.float32
                             for n in quantized)
    assert any(fp8.written[n].shape[0] % 128 or fp8.written[n].shape[1] % 128 for n in quantized)  # partial edges
    assert not any(n.endswith(("embed_tokens.weight", "lm_head.weight", "mlp.gate.weight")) for n in quantized)
    if fp8.name == "deepseek-v3":
        assert any(".experts." in n for n in quantized) and any("kv_b_proj" in n for n in quantized)


def test_dequantized_weights_equal_the_reference_dequantization(fp8):
    weights = formats.open_checkpoint(fp8.folder, dtype=torch.float32)  # the HF reader, FP8 decoded
    try:
        assert sorted(weights.names()) == sorted(fp8.reference)  # the scales are not weights
        for name, want in fp8.reference.items():
            got = weights.get(name)
            if name in weights.quantized:  # dequantized into the dtype asked for
                assert got.dtype == torch.float32 and torch.equal(got, want), name
            else:  # the rest as stored, as HFCheckpoint reads them
                assert got.dtype == torch.bfloat16 and torch.equal(got.float(), want), name
        assert weights.meta(next(iter(weights.quantized))).dtype == torch.float32
    finally:
        weights.close()
    bf16 = formats.open_checkpoint(fp8.folder)  # by default: the folder's own unquantized dtype
    try:
        name = next(iter(bf16.quantized))
        want = fp8.reference[name].to(torch.bfloat16)
        assert bf16.dtype(name) == torch.bfloat16 and torch.equal(bf16.get(name), want)
    finally:
        bf16.close()


def test_logits_equal_transformers_on_the_dequantized_model(fp8):
    from transformers import AutoModelForCausalLM

    want = AutoModelForCausalLM.from_pretrained(fp8.root / "dequantized", dtype=torch.float32).eval()
    with torch.no_grad():
        expected = want(IDS).logits
    for backend in ("mcore", "hf"):
        got = pai_zoo.load(fp8.folder, backend=backend, dtype=torch.float32).logits(IDS)
        assert (got - expected).abs().max().item() <= 1e-4, backend


def test_fp8_to_mcore_to_fp8_gives_the_same_bytes_and_scales(fp8, tmp_path):
    report = convert(fp8.folder, tmp_path / "mcore", "mcore")
    assert any("FP8 block-scaled source" in n for n in report.notes), report.notes
    convert(tmp_path / "mcore", tmp_path / "back", "hf", quantize="fp8-block")
    assert bytes_of(tmp_path / "back") == bytes_of(fp8.folder)
    config = json.loads((tmp_path / "back" / "config.json").read_text())
    assert config["quantization_config"] == QUANT
    plain = convert(tmp_path / "mcore", tmp_path / "plain", "hf")  # the default: bf16, no quantization_config
    assert "quantization_config" not in json.loads((tmp_path / "plain" / "config.json").read_text())
    assert any("--quantize fp8-block" in n for n in plain.notes)
    written = bytes_of(tmp_path / "plain")
    assert {d for d, _ in written.values()} == {"torch.bfloat16"} and set(written) == set(fp8.reference)


def test_a_bf16_checkpoint_quantizes_with_fresh_block_scales(fp8, tmp_path):
    """No FP8 source to reuse (or weights that changed in training): amax / 448 per block, on the same weights
    the published checkpoints quantize."""
    convert(fp8.root / "bf16", tmp_path / "mcore", "mcore")
    convert(tmp_path / "mcore", tmp_path / "fp8", "hf", quantize="fp8-block")
    got = {}
    for file in (tmp_path / "fp8").glob("*.safetensors"):
        got.update(load_file(file))
    source = load_file(fp8.root / "bf16" / "model.safetensors")
    quantized = sorted(n for n, t in got.items() if t.dtype == torch.float8_e4m3fn)
    assert quantized == sorted(n for n, t in source.items() if is_quantized(n, t))
    for name in quantized:
        q, inv = reference_quantize(source[name])
        assert torch.equal(got[name].view(torch.uint8), q.view(torch.uint8)), name
        assert torch.equal(got[name[: -len("weight")] + "weight_scale_inv"], inv), name
    assert json.loads((tmp_path / "fp8" / "config.json").read_text())["quantization_config"] == QUANT


def test_block_arithmetic_equals_transformers_where_shapes_divide():
    from transformers.integrations.finegrained_fp8 import Fp8Dequantize, Fp8Quantize
    from transformers.utils.quantization_config import FineGrainedFP8Config

    w = (torch.randn(256, 384, generator=torch.Generator().manual_seed(0)) * 0.05).to(torch.bfloat16)
    w[:128, :128] = 0  # an all-zero block: scale 1
    quantizer = types.SimpleNamespace(quantization_config=FineGrainedFP8Config(weight_block_size=(128, 128)))
    theirs = Fp8Quantize(quantizer)._quantize_one("x.weight", w)
    q, inv = fp8_blocks.quantize(w)
    assert torch.equal(q.view(torch.uint8), theirs["x.weight"].view(torch.uint8))
    assert torch.equal(inv, theirs["x.weight_scale_inv"]) and inv[0, 0] == 1.0
    for dtype in (torch.float32, torch.bfloat16):
        want = Fp8Dequantize(quantizer)._dequantize_one(q, inv, output_dtype=dtype)
        assert torch.equal(fp8_blocks.dequantize(q, inv, dtype=dtype), want)
    changed = w.clone()
    changed[200, 300] = 1.0  # a trained weight no longer fits the recorded scales: fresh ones
    q2, inv2 = fp8_blocks.quantize(changed, scale_inv=inv)
    assert torch.equal(inv2, fp8_blocks.quantize(changed)[1]) and not torch.equal(inv2, inv)
    assert torch.equal(fp8_blocks.quantize(fp8_blocks.dequantize(q, inv), scale_inv=inv)[0].view(torch.uint8),
                       q.view(torch.uint8))  # an unchanged one keeps them


def test_inspect_shows_the_quantization(fp8):
    proc = run_cli(["inspect", str(fp8.folder)])
    assert proc.returncode == 0, proc.stderr
    line = next(x for x in proc.stdout.splitlines() if x.startswith("quantization:"))
    count = sum(1 for t in fp8.written.values() if t.dtype == torch.float8_e4m3fn)
    assert f"{count} weights float8_e4m3fn with 128x128 blocks" in line and "read as bfloat16" in line
    params = next(x for x in proc.stdout.splitlines() if x.startswith("parameters:"))
    assert f"{sum(t.numel() for t in fp8.reference.values()):,}" in params  # the scales are not parameters


def _broken(fp8, tmp_path, change) -> Path:
    folder = tmp_path / "broken"
    folder.mkdir()
    for file in fp8.folder.iterdir():
        (folder / file.name).write_bytes(file.read_bytes())
    change(folder)
    return folder


def _edit_config(quant):
    def change(folder):
        config = json.loads((folder / "config.json").read_text())
        if quant is None:
            del config["quantization_config"]
        else:
            config["quantization_config"] = quant
        (folder / "config.json").write_text(json.dumps(config))
    return change


def _edit_scale(fn):
    def change(folder):
        index = json.loads((folder / "model.safetensors.index.json").read_text())
        scale = next(n for n in sorted(index["weight_map"]) if n.endswith("weight_scale_inv"))
        file = folder / index["weight_map"][scale]
        tensors = load_file(file)
        fn(tensors, scale)
        if scale not in tensors:
            del index["weight_map"][scale]
            (folder / "model.safetensors.index.json").write_text(json.dumps(index))
        save_file(tensors, str(file), metadata={"format": "pt"})
    return change


BAD = {
    "missing scale": (_edit_scale(lambda t, s: t.pop(s)), r"model-0000\d-of-00002.safetensors: \S+\.weight is "
                      r"float8_e4m3fn but has no \S+\.weight_scale_inv beside it"),
    "scale of the wrong shape": (_edit_scale(lambda t, s: t.update({s: t[s][:, :1].contiguous()})),
                                 r"\S+weight_scale_inv has shape \[\d+, 1\]; the \[\d+, \d+\] weight \S+ with "
                                 r"\[128, 128\] blocks needs \[\d+, \d+\]"),
    "gptq": (_edit_config({"quant_method": "gptq", "bits": 4}), r"config.json: quantization_config quant_method "
             r"'gptq' is not supported"),
    "awq": (_edit_config({"quant_method": "awq"}), r"quant_method 'awq' is not supported"),
    "per-tensor fp8": (_edit_config({"quant_method": "fp8", "activation_scheme": "dynamic"}),
                       r"'fp8' without weight_block_size \(per-tensor scales\) is not supported"),
    "64x64 blocks": (_edit_config({**QUANT, "weight_block_size": [64, 64]}),
                     r"weight_block_size \[64, 64\] is not supported"),
    "no quantization_config": (_edit_config(None), r"is float8_e4m3fn but \S+config.json has no "
                               r"quantization_config"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_fp8_input_is_one_line_and_nothing_is_written(fp8, tmp_path, case):
    import re

    change, message = BAD[case]
    folder = _broken(fp8, tmp_path, change)
    proc = run_cli(["convert", str(folder), str(tmp_path / "out"), "--to", "mcore"])
    assert proc.returncode == 1, proc.stderr
    lines = [x for x in proc.stderr.splitlines() if x.strip()]
    assert len(lines) == 1 and lines[0].startswith("pai-zoo: error: ") and re.search(message, lines[0]), lines
    assert not (tmp_path / "out").exists() and not list(tmp_path.glob(".out.*"))


def test_quantize_is_refused_for_a_megatron_core_output(fp8, tmp_path):
    proc = run_cli(["convert", str(fp8.folder), str(tmp_path / "out"), "--to", "mcore", "--quantize", "fp8-block"])
    assert proc.returncode == 1 and "--quantize writes a quantized Hugging Face folder (--to hf)" in proc.stderr
    assert not (tmp_path / "out").exists()
