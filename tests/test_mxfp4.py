"""MXFP4 (gpt-oss's published experts): decoding equals transformers' own dequantization bit for bit, an MXFP4 folder
converts to megatron-core and back (``--quantize mxfp4``: the source's blocks and scales, byte for byte; without it
bf16), and bad input is refused in one line.

The folder is laid out as transformers' MXFP4 quantizer stores one (``Mxfp4ReverseDeserialize``: ``*_blocks``
``[E, out, in / 32, 16]`` and ``*_scales`` ``[E, out, in / 32]`` uint8); its quantize step needs triton kernels, so the
codes and exponents are drawn at random, and transformers' own loader (``Mxfp4Config(dequantize=True)``) reads it.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file
from transformers.integrations.mxfp4 import convert_moe_packed_tensors

from pai_zoo.formats.encodings import mxfp4
from pai_zoo.plugin.errors import PaiZooError
from pai_zoo_gpt_oss.mxfp4_folder import (
    check_mxfp4_folder,
    random_packed,
    write_mxfp4_folder,
)


@pytest.fixture(scope="module")
def mxfp4_folder(tmp_path_factory):
    return write_mxfp4_folder(tmp_path_factory.mktemp("mxfp4") / "src")


def test_decode_equals_transformers_bit_for_bit():
    gen = torch.Generator().manual_seed(3)
    blocks, scales = random_packed((3, 40, 5), gen)
    scales[0, 0, 0], scales[0, 0, 1], scales[1, 1, 1] = 0, 255, 1  # the exponent range's ends
    for dtype in (torch.bfloat16, torch.float32):
        ours = mxfp4.dequantize(blocks, scales, dtype)
        theirs = convert_moe_packed_tensors(blocks, scales, dtype=dtype)
        assert ours.dtype == theirs.dtype == dtype and ours.shape == theirs.shape == (3, 160, 40)
        assert torch.equal(ours.view(torch.uint8 if dtype == torch.bfloat16 else torch.int32).view(-1),
                           theirs.view(torch.uint8 if dtype == torch.bfloat16 else torch.int32).view(-1))


def test_recorded_scales_give_the_bytes_back():
    gen = torch.Generator().manual_seed(4)
    blocks, scales = random_packed((2, 24, 3), gen)
    weight = mxfp4.dequantize(blocks, scales)
    got_blocks, got_scales = mxfp4.quantize(weight, scales)
    assert torch.equal(got_blocks, blocks) and torch.equal(got_scales, scales)
    # a changed weight gets fresh scales that represent the FP4 grid exactly
    fresh_blocks, fresh_scales = mxfp4.quantize(weight * 1.1, scales)
    again = mxfp4.dequantize(fresh_blocks, fresh_scales, torch.float32)
    assert (again - (weight * 1.1).float()).abs().max() <= (weight * 1.1).float().abs().max() / 4


def test_folder_decodes_as_transformers_loads_it(mxfp4_folder):
    """pai-zoo's reader of the folder hands out exactly the weights transformers' own MXFP4 loader (dequantize)
    gives its model, and the megatron-core model of the folder gives transformers' logits (fp32)."""
    assert check_mxfp4_folder(mxfp4_folder) < 1e-4


def _convert(src, dst, to, quantize=None):
    from pai_zoo.conversion import convert

    convert(src, dst, to=to, quantize=quantize, progress=False)


def test_mxfp4_round_trip_bit_identical(mxfp4_folder, tmp_path):
    from pai_zoo.formats.hf_folder import open_weights

    mcore, back, plain = tmp_path / "mcore", tmp_path / "back", tmp_path / "plain"
    _convert(mxfp4_folder, mcore, "mcore")
    _convert(mcore, back, "hf", quantize="mxfp4")
    _convert(mcore, plain, "hf")
    source = load_file(mxfp4_folder / "model.safetensors")
    written = {k: v for f in sorted(back.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert sorted(written) == sorted(source)
    for name, tensor in source.items():
        assert written[name].dtype == tensor.dtype and torch.equal(written[name].view(torch.uint8),
                                                                   tensor.view(torch.uint8)), name
    config = json.loads((back / "config.json").read_text())
    assert config["quantization_config"]["quant_method"] == "mxfp4"
    plain_config = json.loads((plain / "config.json").read_text())
    assert "quantization_config" not in plain_config
    plain_tensors = {k: v for f in sorted(plain.glob("*.safetensors")) for k, v in load_file(f).items()}
    assert not any(n.endswith(("_blocks", "_scales")) for n in plain_tensors)
    with open_weights(mxfp4_folder) as decoded:
        for name in decoded.names():
            assert plain_tensors[name].dtype == torch.bfloat16
            assert torch.equal(plain_tensors[name].view(torch.uint8), decoded.get(name).view(torch.uint8)), name


def _broken_folder(src: Path, dst: Path, change) -> Path:
    shutil.copytree(src, dst)
    state = load_file(dst / "model.safetensors")
    config = json.loads((dst / "config.json").read_text())
    change(state, config)
    save_file(state, str(dst / "model.safetensors"), metadata={"format": "pt"})
    (dst / "config.json").write_text(json.dumps(config))
    return dst


BLOCKS = "model.layers.0.mlp.experts.down_proj_blocks"


@pytest.mark.parametrize("change, says", [
    (lambda s, c: s.pop(BLOCKS.replace("_blocks", "_scales")), "has no model.layers.0.mlp.experts.down_proj_scales"),
    (lambda s, c: s.__setitem__(BLOCKS, s[BLOCKS][..., :8].contiguous()), "MXFP4 blocks are uint8"),
    (lambda s, c: s.__setitem__(BLOCKS.replace("_blocks", "_scales"),
                                s[BLOCKS.replace("_blocks", "_scales")][:, :3].contiguous()), "need uint8 scales"),
    (lambda s, c: c["quantization_config"].update(quant_method="awq"), "quant_method 'awq' is not supported"),
    (lambda s, c: c["quantization_config"].update(group_size=16), "with group_size is not supported"),
])
def test_bad_mxfp4_folder_refused_in_one_line(mxfp4_folder, tmp_path, change, says):
    from pai_zoo.formats.hf_folder import open_weights

    folder = _broken_folder(mxfp4_folder, tmp_path / "bad", change)
    with pytest.raises(PaiZooError) as err:
        with open_weights(folder) as source:
            source.names()
    assert says in str(err.value) and "\n" not in str(err.value)


def test_quantize_mxfp4_refuses_a_model_without_stacked_experts():
    with pytest.raises(PaiZooError, match="has none"):
        mxfp4.writer_for(None, None, ["model.layers.0.mlp.down_proj.weight"])
