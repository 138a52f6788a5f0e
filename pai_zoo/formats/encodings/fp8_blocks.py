"""FP8 block-scaled weights, read and written as DeepSeek-V3/R1, GLM-4.5-FP8 and the Qwen3 ``-FP8`` releases publish
them.

Their ``config.json`` says ``"quantization_config": {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size":
[128, 128], "activation_scheme": "dynamic"}``. Each quantized linear weight ``W [out, in]`` is stored as
``float8_e4m3fn`` with a float32 ``*.weight_scale_inv`` of shape ``[ceil(out/128), ceil(in/128)]`` beside it (the
edge blocks partial): ``W = q * scale_inv`` block by block. Embeddings, norms, router gates and the head stay bf16.

For such a folder :func:`pai_zoo.formats.hf_folder.open_weights` returns a :class:`DequantizedCheckpoint`
(through :func:`pai_zoo.formats.encodings.decoded`), which hides the scales and hands out each weight dequantized
into the conversion's dtype, one tensor at a time (memory stays at one tensor, never the model in fp32).

:class:`Fp8BlockWriter` goes back: :func:`quantize` gives ``q`` and ``scale_inv`` per block with the scale
``amax / 448`` (transformers' ``Fp8Quantize`` convention: an all-zero block gets scale 1), or reuses the scale a
checkpoint recorded from its FP8 source when that reproduces the weight exactly, so an untrained round trip
FP8 -> megatron-core -> FP8 gives the source's bytes back.
"""
from __future__ import annotations

import math
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import torch

from ...plugin.errors import PaiZooError
from ...plugin.quantization import FP8_BLOCK_128
from ..base import CheckpointReader

#: The largest finite ``float8_e4m3fn`` value.
FP8_MAX = 448.0
FP8_DTYPE = torch.float8_e4m3fn
#: The block size the published checkpoints use, the only one read.
BLOCK = (128, 128)
SCALE_SUFFIX = "weight_scale_inv"
#: The ``quantization_config`` written when the source recorded none (DeepSeek-V3's, as published).
DEFAULT_CONFIG = FP8_BLOCK_128
_FLOAT8 = (torch.float8_e4m3fn, torch.float8_e5m2)
#: ``quantization_config.quant_method`` of this encoding.
METHOD = "fp8"


@dataclass(frozen=True)
class BlockFp8:
    """A ``quantization_config`` of block-scaled FP8, as published (``config``, kept for the way back)."""

    config: dict = field(default_factory=lambda: dict(DEFAULT_CONFIG))
    method = METHOD

    @property
    def block(self) -> tuple[int, int]:
        return tuple(self.config.get("weight_block_size") or BLOCK)

    @property
    def power_of_two_scales(self) -> bool:
        """DeepSeek-V3.1's ``scale_fmt: ue8m0``: every scale a power of two."""
        return self.config.get("scale_fmt") == "ue8m0"

    @property
    def not_converted(self) -> tuple[str, ...]:
        """``modules_to_not_convert``: module names (or their ends) whose weights stay unquantized."""
        return tuple(self.config.get("modules_to_not_convert") or ())


def scheme_of(quant: Mapping, where: str = "config.json") -> BlockFp8:
    """The block-FP8 scheme of a ``quantization_config`` whose ``quant_method`` is ``"fp8"``; a variant pai-zoo does
    not read is refused in one line naming the setting."""
    block = quant.get("weight_block_size")
    if block is None:
        raise PaiZooError(f"{where}: quantization_config quant_method 'fp8' without weight_block_size (per-tensor "
                          "scales) is not supported; pai-zoo reads block-scaled FP8 with weight_block_size [128, 128]")
    if list(block) != list(BLOCK):
        raise PaiZooError(f"{where}: quantization_config weight_block_size {list(block)} is not supported; pai-zoo "
                          f"reads the published block size {list(BLOCK)}")
    if quant.get("fmt", "e4m3") != "e4m3":
        raise PaiZooError(f"{where}: quantization_config fmt {quant['fmt']!r} is not supported; FP8 weights are "
                          "float8_e4m3fn ('e4m3')")
    if quant.get("activation_scheme", "dynamic") != "dynamic":
        raise PaiZooError(f"{where}: quantization_config activation_scheme {quant['activation_scheme']!r} is not "
                          "supported (static activation scales); pai-zoo reads 'dynamic'")
    if quant.get("scale_fmt") not in (None, "ue8m0"):
        raise PaiZooError(f"{where}: quantization_config scale_fmt {quant['scale_fmt']!r} is not supported "
                          "(known: 'ue8m0', or none)")
    return BlockFp8(dict(quant))


def scale_name(weight: str) -> str:
    """``model.layers.0.mlp.down_proj.weight`` -> ``model.layers.0.mlp.down_proj.weight_scale_inv``."""
    return weight[: -len("weight")] + SCALE_SUFFIX


def scale_shape(shape: Iterable[int], block: tuple[int, int] = BLOCK) -> tuple[int, int]:
    """The scale grid of a ``[out, in]`` weight: ``[ceil(out / block_out), ceil(in / block_in)]``."""
    rows, cols = shape
    return math.ceil(rows / block[0]), math.ceil(cols / block[1])


def _blocks(tensor: torch.Tensor, block: tuple[int, int]) -> torch.Tensor:
    """``tensor`` zero-padded to whole blocks, viewed as ``[row blocks, block_out, col blocks, block_in]``."""
    rows, cols = tensor.shape
    grid = scale_shape(tensor.shape, block)
    padded = torch.nn.functional.pad(tensor, (0, grid[1] * block[1] - cols, 0, grid[0] * block[0] - rows))
    return padded.view(grid[0], block[0], grid[1], block[1])


def dequantize(q: torch.Tensor, scale_inv: torch.Tensor, block: tuple[int, int] = BLOCK,
               dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``q * scale_inv`` per block, in float32, rounded once into ``dtype``."""
    rows, cols = q.shape
    blocks = _blocks(q.to(torch.float32), block)
    blocks.mul_(scale_inv.to(torch.float32)[:, None, :, None])
    return blocks.reshape(blocks.shape[0] * block[0], -1)[:rows, :cols].to(dtype)


def quantize(weight: torch.Tensor, block: tuple[int, int] = BLOCK, scale_inv: torch.Tensor | None = None,
             power_of_two: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """``(q, scale_inv)`` of a ``[out, in]`` weight. With ``scale_inv`` (a source's recorded scales), those
    scales when they give ``weight`` back exactly (:func:`dequantize` into its dtype, bit for bit): an untrained
    weight. Otherwise fresh ones: ``amax / 448`` per block (1 for an all-zero block), rounded up to a power of
    two with ``power_of_two`` (``scale_fmt: ue8m0``)."""
    rows, cols = weight.shape
    values = _blocks(weight.to(torch.float32), block)
    if scale_inv is not None and tuple(scale_inv.shape) == scale_shape(weight.shape, block):
        recorded = scale_inv.to(torch.float32)
        q = _to_fp8(values / recorded[:, None, :, None], rows, cols)
        if _same_bits(dequantize(q, recorded, block, weight.dtype), weight):
            return q, scale_inv.to(torch.float32)
    amax = values.abs().amax(dim=(1, 3))
    scale = torch.where(amax > 0, FP8_MAX / amax, torch.ones_like(amax))
    inv = (1.0 / scale).to(torch.float32)
    if power_of_two:
        inv = torch.pow(2.0, torch.ceil(torch.log2(inv.clamp(min=torch.finfo(torch.float32).tiny))))
        scale = 1.0 / inv
    return _to_fp8(values * scale[:, None, :, None], rows, cols), inv


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    """Equal bytes (``torch.equal`` calls -0.0 and 0.0 equal, and NaN unequal to itself)."""
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


def _to_fp8(blocks: torch.Tensor, rows: int, cols: int) -> torch.Tensor:
    flat = blocks.reshape(blocks.shape[0] * blocks.shape[1], -1)[:rows, :cols]
    return flat.clamp(-FP8_MAX, FP8_MAX).to(FP8_DTYPE)


# -- reading -----------------------------------------------------------------------------------------------------
class DequantizedCheckpoint(CheckpointReader):
    """An FP8 block-scaled HF folder seen as a plain one: the same interface as :class:`HFCheckpoint`, without the
    ``*.weight_scale_inv`` tensors, each FP8 weight dequantized into ``dtype`` when it is read."""

    def __init__(self, source, scheme: BlockFp8, dtype: torch.dtype | None = None, where: str = "config.json"):
        self.source, self.scheme = source, scheme
        self.path, self.format, self.storage, self.config = source.path, source.format, source.storage, source.config
        names = source.names()
        self.quantized: dict[str, str] = {}  # weight -> its scale
        for name in names:
            meta = source.meta(name)
            if meta.dtype not in _FLOAT8:
                continue
            where = source.file_of(name)
            if meta.dtype != FP8_DTYPE:
                raise PaiZooError(f"{where}: {name} is {meta.dtype}, not float8_e4m3fn as quantization_config's "
                                  "fmt 'e4m3' says")
            scale = scale_name(name) if name.endswith(".weight") else name + "_scale_inv"
            if not source.has(scale):
                raise PaiZooError(f"{where}: {name} is float8_e4m3fn but has no {scale} beside it; the FP8 "
                                  "checkpoint is incomplete (every FP8 weight needs its block scales)")
            want = scale_shape(meta.shape, scheme.block) if meta.dim() == 2 else None
            got = tuple(source.meta(scale).shape)
            if want is None or got != want:
                raise PaiZooError(f"{source.file_of(scale)}: {scale} has shape {list(got)}; the {list(meta.shape)} "
                                  f"weight {name} with {list(scheme.block)} blocks needs "
                                  f"{list(want) if want else 'a 2-D weight'}")
            self.quantized[name] = scale
        orphans = sorted(n for n in names if n.endswith("_scale_inv") and n not in self.quantized.values())
        if orphans:
            raise PaiZooError(f"{source.file_of(orphans[0])}: {orphans[0]} scales no float8_e4m3fn weight "
                              f"({len(orphans)} such scale(s)); the checkpoint's weights and scales do not match")
        if not self.quantized:
            raise PaiZooError(f"{where}: quantization_config says FP8, but no tensor is float8_e4m3fn")
        self._scales = set(self.quantized.values())
        self.out_dtype = dtype or next((source.meta(n).dtype for n in names if source.meta(n).is_floating_point()
                                        and source.meta(n).dtype not in _FLOAT8 and n not in self._scales),
                                       torch.bfloat16)

    def names(self) -> list[str]:
        return [n for n in self.source.names() if n not in self._scales]

    def has(self, name: str) -> bool:
        return self.source.has(name) and name not in self._scales

    def shape(self, name: str) -> tuple[int, ...]:
        return self.source.shape(name)

    def dtype(self, name: str) -> torch.dtype:
        return self.meta(name).dtype

    def read(self, name: str) -> torch.Tensor:
        return self.get(name)

    def read_slice(self, name: str, offsets, sizes) -> torch.Tensor:
        return self.get(name)[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].clone()


    def meta(self, name: str) -> torch.Tensor:
        meta = self.source.meta(name)
        return torch.empty(meta.shape, dtype=self.out_dtype, device="meta") if name in self.quantized else meta

    def nbytes(self, name: str) -> int:
        extra = self.source.nbytes(self.quantized[name]) if name in self.quantized else 0
        return self.source.nbytes(name) + extra

    def get(self, name: str) -> torch.Tensor:
        if name not in self.quantized:
            return self.source.get(name)
        return dequantize(self.source.get(name), self.source.get(self.quantized[name]), self.scheme.block,
                          self.out_dtype)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in self.names():
            yield name, self.get(name)

    def scales(self) -> dict[str, torch.Tensor]:
        """Every FP8 weight's recorded scales, under the scale's name."""
        return {scale: self.source.get(scale) for scale in self.quantized.values()}

    def weight_files(self) -> list[Path]:
        return self.source.weight_files()

    def file_of(self, name: str) -> Path:
        return self.source.file_of(name)

    def close(self) -> None:
        self.source.close()


# -- writing -----------------------------------------------------------------------------------------------------
def quantizable_weights(hf_model, names: Iterable[str]) -> set[str]:
    """Of a model's checkpoint tensor ``names``, the weights the published FP8 checkpoints store in FP8: those of
    every ``nn.Linear`` and every routed expert's projections (transformers 5 fuses them in memory), but not the
    output head's nor a router's (``mlp.gate``), which stay unquantized. ``hf_model`` may be on the meta device.
    A multi-token-prediction layer's transformer layer (``model.layers.{num_hidden_layers + i}``, which transformers'
    model leaves out) is quantized as the last decoder layer is; its ``eh_proj`` and ``shared_head.head`` stay
    unquantized, as DeepSeek-V3 publishes them (vLLM and SGLang build them as plain linears)."""
    output = hf_model.get_output_embeddings() if hasattr(hf_model, "get_output_embeddings") else None
    linear = {f"{name}.weight" for name, module in hf_model.named_modules()
              if isinstance(module, torch.nn.Linear) and module is not output}
    layers = getattr(getattr(hf_model, "config", None), "num_hidden_layers", None)

    def as_decoder(name: str) -> str:  # an MTP layer's tensor under the last decoder layer's name
        found = re.match(r"model\.layers\.(\d+)\.(.*)", name)
        if layers and found and int(found[1]) >= layers:
            return f"model.layers.{layers - 1}.{found[2]}"
        return name

    return {n for n in names if n.endswith(".weight") and not n.endswith("mlp.gate.weight")
            and (as_decoder(n) in linear or ".experts." in n)}


@dataclass
class Fp8BlockWriter:
    """Which HF tensors a ``--quantize fp8-block`` write stores as FP8, and how.

    ``quantized``: the weights to quantize (a recorded source's FP8 weights, else :func:`quantizable_weights`
    less ``modules_to_not_convert``); ``recorded``: the source's scales by scale name, reused where exact."""

    scheme: BlockFp8
    quantized: set[str]
    recorded: dict[str, torch.Tensor] = field(default_factory=dict)

    def plan(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> list[tuple[str, tuple, torch.dtype]]:
        """The tensors ``name`` becomes on disk: itself in FP8 and its scales, or itself unchanged."""
        if not self.quantizes(name, shape):
            return [(name, shape, dtype)]
        return [(name, shape, FP8_DTYPE), (scale_name(name), scale_shape(shape, self.scheme.block), torch.float32)]

    def quantizes(self, name: str, shape) -> bool:
        return name in self.quantized and len(shape) == 2 and name.endswith(".weight")

    def encode(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if not self.quantizes(name, tensor.shape):
            return [(name, tensor)]
        scale = scale_name(name)
        q, inv = quantize(tensor, self.scheme.block, self.recorded.get(scale), self.scheme.power_of_two_scales)
        return [(name, q), (scale, inv)]


def writer_for(source_scheme: BlockFp8 | None, recorded: dict | None, hf_model_on_meta,
               names: Iterable[str]) -> Fp8BlockWriter:
    """The writer of a checkpoint whose source declared ``source_scheme`` and kept the ``recorded`` scales (a
    pai-zoo checkpoint's ``hf/`` folder): that scheme, FP8 weights and scales when it came from an FP8 folder, else
    :data:`DEFAULT_CONFIG` on :func:`quantizable_weights` (less ``modules_to_not_convert``) of the checkpoint
    tensor ``names``."""
    scheme = source_scheme
    if scheme is not None and recorded is not None:
        weights = {name[: -len(SCALE_SUFFIX)] + "weight" for name in recorded}
        return Fp8BlockWriter(scheme, weights, recorded)
    scheme = scheme or BlockFp8()
    skip = scheme.not_converted
    weights = {n for n in quantizable_weights(hf_model_on_meta, names)
               if not any(n[: -len(".weight")] == m or n[: -len(".weight")].endswith("." + m) for m in skip)}
    return Fp8BlockWriter(scheme, weights)


#: The decoding reader of this encoding (:func:`pai_zoo.formats.encodings.decoded`).
decoder = DequantizedCheckpoint
