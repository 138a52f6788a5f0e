"""Published-style FP8 block-scaled folders for the tests, written independently of pai-zoo: DeepSeek's recipe
(``scale_inv = amax / 448`` per 128x128 block, edge blocks partial) applied with plain torch, and the tensors laid
out in two safetensors shards with an index, as DeepSeek-V3 and Qwen3-FP8 publish them. ``import fp8_reference``
(registered by conftest.py)."""
from __future__ import annotations

import json
import math
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

#: The published quantization_config.
QUANT = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}


def reference_quantize(w: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Block by block, as DeepSeek's recipe says: scale_inv = amax / 448 (1 for an all-zero block)."""
    rows, cols = w.shape
    q = torch.empty(rows, cols, dtype=torch.float8_e4m3fn)
    inv = torch.empty(math.ceil(rows / 128), math.ceil(cols / 128))
    for i in range(inv.shape[0]):
        for j in range(inv.shape[1]):
            block = w[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128].float()
            amax = block.abs().max()
            scale = 448.0 / amax if amax > 0 else torch.tensor(1.0)
            q[i * 128:(i + 1) * 128, j * 128:(j + 1) * 128] = (block * scale).clamp(-448, 448).to(q.dtype)
            inv[i, j] = 1.0 / scale
    return q, inv


def reference_dequantize(q: torch.Tensor, inv: torch.Tensor, dtype=torch.float32) -> torch.Tensor:
    out = torch.empty(q.shape, dtype=torch.float32)
    for i in range(inv.shape[0]):
        for j in range(inv.shape[1]):
            rows, cols = slice(i * 128, (i + 1) * 128), slice(j * 128, (j + 1) * 128)
            out[rows, cols] = q[rows, cols].float() * inv[i, j]
    return out.to(dtype)


def is_quantized(name: str, tensor: torch.Tensor) -> bool:
    """What the published checkpoints store in FP8: the decoder layers' projections, experts' included."""
    return (tensor.dim() == 2 and name.startswith("model.layers.") and name.endswith(".weight")
            and "norm" not in name and not name.endswith("mlp.gate.weight"))


def write_fp8_folder(plain: Path, out: Path, edge_cases: bool = True, quantized=is_quantized,
                     extra: dict[str, torch.Tensor] | None = None) -> dict[str, torch.Tensor]:
    """``plain`` (a bf16 folder, plus the tensors ``extra``) as an FP8 block-scaled folder in ``out``, the tensors
    ``quantized(name, tensor)`` selects in FP8; returns what was written."""
    state = {**load_file(plain / "model.safetensors"), **(extra or {})}
    written = {}
    for i, (name, tensor) in enumerate(sorted(state.items())):
        if not quantized(name, tensor):
            written[name] = tensor
            continue
        q, inv = reference_quantize(tensor)
        scaled = sum(1 for n in written if n.endswith("weight_scale_inv"))
        if edge_cases and scaled == 1:  # scales wider than amax / 448 (no block reaches 448): only reuse keeps them
            inv = inv * 1.5
            q = torch.cat([(tensor[i:i + 128].float() / inv[i // 128].repeat_interleave(128)[:tensor.shape[1]])
                           .clamp(-448, 448).to(torch.float8_e4m3fn) for i in range(0, tensor.shape[0], 128)])
        if edge_cases and scaled == 0:
            raw = q.view(torch.uint8)
            raw[0, :5] = 0  # zeros
            raw[1, :3] = torch.tensor([0x80, 0x01, 0x87], dtype=torch.uint8)  # -0.0, e4m3 subnormals (+ and -)
            raw[2, :2] = torch.tensor([0x7E, 0xFE], dtype=torch.uint8)  # +-448, the largest
        written[name], written[name[: -len("weight")] + "weight_scale_inv"] = q, inv
    out.mkdir()
    names = sorted(written)
    half = {n for n in names[: len(names) // 2]}
    half |= {n[: -len("weight_scale_inv")] + "weight" for n in half if n.endswith("weight_scale_inv")}
    half |= {n[: -len("weight")] + "weight_scale_inv" for n in half if n[: -len("weight")] + "weight_scale_inv"
             in written}  # a weight and its scales share a shard
    shards = {"model-00001-of-00002.safetensors": {n: written[n] for n in names if n in half},
              "model-00002-of-00002.safetensors": {n: written[n] for n in names if n not in half}}
    for file, tensors in shards.items():
        save_file({k: v.contiguous() for k, v in tensors.items()}, str(out / file), metadata={"format": "pt"})
    weight_map = {n: file for file, tensors in shards.items() for n in tensors}
    (out / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}))
    config = json.loads((plain / "config.json").read_text())
    (out / "config.json").write_text(json.dumps({**config, "quantization_config": QUANT}, indent=2))
    for extra in plain.iterdir():
        if extra.name not in ("config.json", "model.safetensors") and extra.is_file():
            (out / extra.name).write_bytes(extra.read_bytes())
    return written


def bytes_of(folder: Path) -> dict[str, tuple[str, bytes]]:
    """Every tensor of a folder's safetensors files: its dtype and raw bytes (a bit-identical comparison)."""
    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        for name, tensor in load_file(file).items():
            out[name] = (str(tensor.dtype), tensor.contiguous().view(torch.uint8).numpy().tobytes())
    return out
