"""MXFP4 expert weights, read and written as gpt-oss publishes them (transformers' ``quant_method: "mxfp4"``).

Their ``config.json`` says ``"quantization_config": {"quant_method": "mxfp4", "modules_to_not_convert": [...]}``.
Each routed-expert projection ``mlp.experts.{gate_up,down}_proj`` (in memory ``[E, in, out]``) is stored as two
uint8 tensors: ``*_blocks`` ``[E, out, in / 32, 16]`` -- 32 FP4 (e2m1) values per block, two per byte, the even
element in the low nibble -- and ``*_scales`` ``[E, out, in / 32]``, one exponent per block with bias 127: the
value of code ``c`` in a block with scale ``s`` is ``FP4[c] * 2 ** (s - 127)``. Attention, router, embeddings and
the head stay bf16.

For such a folder :func:`pai_zoo.formats.hf_folder.open_weights` returns an :class:`Mxfp4Checkpoint` (through
:func:`pai_zoo.formats.encodings.decoded`): it hides the ``*_blocks`` / ``*_scales`` pairs and hands out each
projection under its in-memory name (``mlp.experts.gate_up_proj``), dequantized exactly as transformers'
``convert_moe_packed_tensors`` does it (the same lookup table, ``ldexp`` and transpose: the same bits) into the
folder's unquantized dtype.

:class:`Mxfp4Writer` goes back (``convert --to hf --quantize mxfp4``): :func:`quantize` reuses the exponents a
checkpoint recorded from its MXFP4 source where they reproduce the weight exactly (an untrained weight: the
source's bytes back, blocks and scales), else draws fresh ones as the OpenAI/triton reference quantizer does (the
block maximum over 6, rounded up to a power of two; values rounded to the nearest FP4 value, ties to even).
"""
from __future__ import annotations

import fnmatch
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator, Mapping

import torch

from ...plugin.errors import PaiZooError
from ..base import CheckpointReader
from ..megatron_folder import recorded_tensors

#: ``quantization_config.quant_method`` of this encoding.
METHOD = "mxfp4"
#: The FP4 (e2m1) value of each 4-bit code, transformers' ``FP4_VALUES``.
FP4_VALUES = (+0.0, +0.5, +1.0, +1.5, +2.0, +3.0, +4.0, +6.0, -0.0, -0.5, -1.0, -1.5, -2.0, -3.0, -4.0, -6.0)
#: Values per scale (one block), and bytes per block (two codes a byte).
BLOCK = 32
BLOCK_BYTES = BLOCK // 2
#: The exponent bias of a scale byte (E8M0).
SCALE_BIAS = 127
BLOCKS_SUFFIX, SCALES_SUFFIX = "_blocks", "_scales"
#: In a pai-zoo checkpoint's ``hf/`` folder: the scales of its MXFP4 source, under their HF names.
SCALES_FILE = "mxfp4_scales.safetensors"
#: The projections transformers' MXFP4 quantizer stores so (``Mxfp4GptOssExperts``' parameters).
PROJECTIONS = ("mlp.experts.gate_up_proj", "mlp.experts.down_proj")
#: The ``quantization_config`` written when the source recorded none (gpt-oss's, as published).
DEFAULT_CONFIG = {
    "modules_to_not_convert": ["model.layers.*.self_attn", "model.layers.*.mlp.router", "model.embed_tokens",
                               "lm_head"],
    "quant_method": METHOD,
}
#: ``quantization_config`` keys read (others are refused: they would change what the weights mean).
_KNOWN_KEYS = {"quant_method", "modules_to_not_convert", "dequantize"}


@dataclass(frozen=True)
class Mxfp4:
    """A ``quantization_config`` of MXFP4, as published (``config``, kept for the way back)."""

    config: dict = field(default_factory=lambda: dict(DEFAULT_CONFIG))
    method = METHOD

    @property
    def not_converted(self) -> tuple[str, ...]:
        """``modules_to_not_convert``: module names or patterns (``model.layers.*.self_attn``) kept unquantized."""
        return tuple(self.config.get("modules_to_not_convert") or ())


def scheme_of(quant: Mapping, where: str = "config.json") -> Mxfp4:
    """The MXFP4 scheme of a ``quantization_config`` whose ``quant_method`` is ``"mxfp4"``; an unknown setting is
    refused in one line naming it."""
    unknown = sorted(set(quant) - _KNOWN_KEYS)
    if unknown:
        raise PaiZooError(f"{where}: quantization_config quant_method 'mxfp4' with {', '.join(unknown)} is not "
                          f"supported; pai-zoo reads {', '.join(sorted(_KNOWN_KEYS))}")
    return Mxfp4({k: v for k, v in quant.items() if k != "dequantize"})


def blocks_name(name: str) -> str:
    """``model.layers.0.mlp.experts.down_proj`` -> ``model.layers.0.mlp.experts.down_proj_blocks``."""
    return name + BLOCKS_SUFFIX


def scales_name(name: str) -> str:
    return name + SCALES_SUFFIX


def dequantize(blocks: torch.Tensor, scales: torch.Tensor, dtype: torch.dtype = torch.bfloat16) -> torch.Tensor:
    """``[E, out, in / 32, 16]`` blocks and ``[E, out, in / 32]`` scales -> the ``[E, in, out]`` weight in ``dtype``,
    by transformers' ``_convert_moe_packed_tensors``' operations (lookup in ``dtype``, ``ldexp`` in place, transpose):
    bit for bit its result."""
    blocks = blocks.to(torch.uint8)
    exponents = scales.to(torch.int32) - SCALE_BIAS
    lut = torch.tensor(FP4_VALUES, dtype=dtype, device=blocks.device)
    *prefix, groups, width = blocks.shape
    rows = math.prod(prefix) * groups
    blocks, exponents = blocks.reshape(rows, width), exponents.reshape(rows, 1)
    out = torch.empty(rows, width * 2, dtype=dtype, device=blocks.device)
    out[:, 0::2] = lut[(blocks & 0x0F).to(torch.int)]
    out[:, 1::2] = lut[(blocks >> 4).to(torch.int)]
    torch.ldexp(out, exponents, out=out)
    out = out.reshape(*prefix, groups, width * 2).view(*prefix, groups * width * 2)
    return out.transpose(1, 2).contiguous()


#: Boundaries between neighbouring FP4 magnitudes (codes 0..7).
_MIDPOINTS = torch.tensor([0.25, 0.75, 1.25, 1.75, 2.5, 3.5, 5.0])
_MAGNITUDES = torch.tensor(FP4_VALUES[:8])


def _codes(values: torch.Tensor) -> torch.Tensor:
    """The FP4 codes of float32 ``values`` already divided by their block's scale: the nearest magnitude (ties to
    the even code, values beyond 6 to 6), the sign bit (8) from the value's sign, -0.0 included."""
    magnitude = values.abs().contiguous()
    code = torch.bucketize(magnitude, _MIDPOINTS)  # a tie falls to the lower code
    tie = (code < len(_MIDPOINTS)) & (magnitude == _MIDPOINTS[code.clamp(max=len(_MIDPOINTS) - 1)])
    code = torch.where(tie & (code % 2 == 1), code + 1, code)
    return (code | (torch.signbit(values).to(code.dtype) << 3)).to(torch.uint8)


def _pack(codes: torch.Tensor) -> torch.Tensor:
    """``[..., 32]`` codes -> ``[..., 16]`` bytes, the even element in the low nibble."""
    return codes[..., 0::2] | (codes[..., 1::2] << 4)


def fresh_scales(values: torch.Tensor) -> torch.Tensor:
    """The scale bytes of ``[..., 32]`` float32 blocks: the block maximum over 6 rounded up to a power of two (the
    reference quantizer's ``ROUND_UP``), as its biased exponent."""
    amax = values.abs().amax(dim=-1)
    bits = (amax / 6.0).view(torch.int32)
    rounded = (bits + 0x007FFFFF) & 0x7F800000
    return (rounded >> 23).to(torch.uint8)


def quantize(weight: torch.Tensor, scales: torch.Tensor | None = None) -> tuple[torch.Tensor, torch.Tensor]:
    """``(blocks, scales)`` of an ``[E, in, out]`` weight (``in`` a multiple of 32). With ``scales`` (a source's
    recorded ``[E, out, in / 32]`` bytes), those scales when they give ``weight`` back exactly (:func:`dequantize`
    into its dtype, bit for bit): an untrained weight. Otherwise fresh ones (:func:`fresh_scales`)."""
    experts, width, out = weight.shape
    if width % BLOCK:
        raise PaiZooError(f"MXFP4 needs the input width of an expert projection to be a multiple of {BLOCK}; this "
                          f"weight is {list(weight.shape)} ([experts, in, out])")
    values = weight.to(torch.float32).transpose(1, 2).reshape(experts, out, width // BLOCK, BLOCK)
    if scales is not None and tuple(scales.shape) == tuple(values.shape[:-1]):
        blocks = _encode(values, scales)
        if _same_bits(dequantize(blocks, scales, weight.dtype), weight):
            return blocks, scales.to(torch.uint8)
    scales = fresh_scales(values)
    return _encode(values, scales), scales


def _encode(values: torch.Tensor, scales: torch.Tensor) -> torch.Tensor:
    exponents = scales.to(torch.int32) - SCALE_BIAS
    return _pack(_codes(torch.ldexp(values, -exponents[..., None].to(torch.float32)).clamp(-6.0, 6.0)))


def _same_bits(a: torch.Tensor, b: torch.Tensor) -> bool:
    return a.dtype == b.dtype and a.shape == b.shape and torch.equal(a.contiguous().view(torch.uint8),
                                                                     b.contiguous().view(torch.uint8))


# -- reading -----------------------------------------------------------------------------------------------------
class Mxfp4Checkpoint(CheckpointReader):
    """An MXFP4 HF folder seen as a plain one: the same interface as :class:`HFCheckpoint`, each ``*_blocks`` /
    ``*_scales`` pair handed out as the dequantized tensor under its in-memory name, in ``dtype``."""

    def __init__(self, source, scheme: Mxfp4, dtype: torch.dtype | None = None, where: str = "config.json"):
        self.source, self.scheme = source, scheme
        self.path, self.format, self.storage, self.config = source.path, source.format, source.storage, source.config
        names = source.names()
        self.quantized: dict[str, tuple[str, str]] = {}  # weight -> (its blocks, its scales)
        for name in names:
            if not name.endswith(BLOCKS_SUFFIX):
                continue
            weight = name[: -len(BLOCKS_SUFFIX)]
            scale = scales_name(weight)
            meta, file = source.meta(name), source.file_of(name)
            if meta.dtype != torch.uint8 or meta.dim() != 4 or meta.shape[-1] != BLOCK_BYTES:
                raise PaiZooError(f"{file}: {name} is {str(meta.dtype).removeprefix('torch.')} {list(meta.shape)}; "
                                  f"MXFP4 blocks are uint8 [experts, out, in / {BLOCK}, {BLOCK_BYTES}]")
            if not source.has(scale):
                raise PaiZooError(f"{file}: {name} has no {scale} beside it; the MXFP4 checkpoint is incomplete "
                                  "(every *_blocks tensor needs its *_scales)")
            smeta = source.meta(scale)
            if smeta.dtype != torch.uint8 or tuple(smeta.shape) != tuple(meta.shape[:-1]):
                raise PaiZooError(f"{source.file_of(scale)}: {scale} is {str(smeta.dtype).removeprefix('torch.')} "
                                  f"{list(smeta.shape)}; the {list(meta.shape)} blocks {name} need uint8 scales "
                                  f"{list(meta.shape[:-1])}")
            if source.has(weight):
                raise PaiZooError(f"{file}: both {weight} and {name}; a weight is stored plain or in MXFP4, not both")
            self.quantized[weight] = (name, scale)
        scales = {s for _, s in self.quantized.values()}
        orphans = sorted(n for n in names if n.endswith(SCALES_SUFFIX) and n not in scales)
        if orphans:
            raise PaiZooError(f"{source.file_of(orphans[0])}: {orphans[0]} scales no *_blocks tensor "
                              f"({len(orphans)} such scale(s)); the checkpoint's blocks and scales do not match")
        if not self.quantized:
            raise PaiZooError(f"{where}: quantization_config says MXFP4, but no tensor is stored as *_blocks and "
                              "*_scales")
        self._hidden = {n for pair in self.quantized.values() for n in pair}
        self.out_dtype = dtype or next((source.meta(n).dtype for n in names if source.meta(n).is_floating_point()),
                                       torch.bfloat16)

    def names(self) -> list[str]:
        out = []
        for name in self.source.names():
            if name.endswith(BLOCKS_SUFFIX) and name[: -len(BLOCKS_SUFFIX)] in self.quantized:
                out.append(name[: -len(BLOCKS_SUFFIX)])
            elif name not in self._hidden:
                out.append(name)
        return out

    def has(self, name: str) -> bool:
        return name in self.quantized or (self.source.has(name) and name not in self._hidden)

    def meta(self, name: str) -> torch.Tensor:
        if name not in self.quantized:
            return self.source.meta(name)
        experts, out, groups, _ = self.source.meta(self.quantized[name][0]).shape
        return torch.empty((experts, groups * BLOCK, out), dtype=self.out_dtype, device="meta")

    def shape(self, name: str) -> tuple[int, ...]:
        return tuple(self.meta(name).shape)

    def dtype(self, name: str) -> torch.dtype:
        return self.meta(name).dtype

    def read(self, name: str) -> torch.Tensor:
        return self.get(name)

    def read_slice(self, name: str, offsets, sizes) -> torch.Tensor:
        return self.get(name)[tuple(slice(o, o + s) for o, s in zip(offsets, sizes))].clone()

    def nbytes(self, name: str) -> int:
        if name in self.quantized:
            return sum(self.source.nbytes(n) for n in self.quantized[name])
        return self.source.nbytes(name)

    def get(self, name: str) -> torch.Tensor:
        if name not in self.quantized:
            return self.source.get(name)
        blocks, scales = self.quantized[name]
        return dequantize(self.source.get(blocks), self.source.get(scales), self.out_dtype)

    def items(self) -> Iterator[tuple[str, torch.Tensor]]:
        for name in self.names():
            yield name, self.get(name)

    def scales(self) -> dict[str, torch.Tensor]:
        """Every MXFP4 weight's recorded scales, under the scale's name."""
        return {scale: self.source.get(scale) for _, scale in self.quantized.values()}

    def weight_files(self) -> list[Path]:
        return self.source.weight_files()

    def file_of(self, name: str) -> Path:
        return self.source.file_of(self.quantized[name][0] if name in self.quantized else name)

    def close(self) -> None:
        self.source.close()


# -- writing -----------------------------------------------------------------------------------------------------
def _not_converted(name: str, patterns: Iterable[str]) -> bool:
    module = name.rsplit(".", 1)[0]
    return any(fnmatch.fnmatchcase(module, p) or fnmatch.fnmatchcase(module, p + ".*") or module.endswith("." + p)
               for p in patterns)


def quantizable_weights(names: Iterable[str], skip: Iterable[str] = ()) -> set[str]:
    """Of a model's checkpoint tensor ``names``, those transformers' MXFP4 quantizer stores in MXFP4: every layer's
    ``mlp.experts.gate_up_proj`` and ``mlp.experts.down_proj`` (not their biases), less ``skip``
    (``modules_to_not_convert``)."""
    return {n for n in names if n.endswith(PROJECTIONS) and not _not_converted(n, skip)}


@dataclass
class Mxfp4Writer:
    """Which HF tensors a ``--quantize mxfp4`` write stores as MXFP4, and how.

    ``quantized``: the weights to quantize (a recorded source's, else :func:`quantizable_weights`); ``recorded``:
    the source's scales by scale name, reused where exact."""

    scheme: Mxfp4
    quantized: set[str]
    recorded: dict[str, torch.Tensor] = field(default_factory=dict)

    def quantizes(self, name: str, shape) -> bool:
        return name in self.quantized and len(shape) == 3

    def plan(self, name: str, shape: tuple[int, ...], dtype: torch.dtype) -> list[tuple[str, tuple, torch.dtype]]:
        """The tensors ``name`` becomes on disk: its blocks and scales, or itself unchanged."""
        if not self.quantizes(name, shape):
            return [(name, shape, dtype)]
        experts, width, out = shape
        if width % BLOCK:
            raise PaiZooError(f"--quantize mxfp4: {name} is {list(shape)} ([experts, in, out]); MXFP4 needs the "
                              f"input width to be a multiple of {BLOCK}")
        grid = (experts, out, width // BLOCK)
        return [(blocks_name(name), (*grid, BLOCK_BYTES), torch.uint8), (scales_name(name), grid, torch.uint8)]

    def encode(self, name: str, tensor: torch.Tensor) -> list[tuple[str, torch.Tensor]]:
        if not self.quantizes(name, tensor.shape):
            return [(name, tensor)]
        blocks, scales = quantize(tensor, self.recorded.get(scales_name(name)))
        return [(blocks_name(name), blocks), (scales_name(name), scales)]


def writer_for(source_scheme: Mxfp4 | None, recorded: dict | None, names: Iterable[str]) -> Mxfp4Writer:
    """The writer of a checkpoint whose source declared ``source_scheme`` and kept the ``recorded`` scales (a
    pai-zoo checkpoint's ``hf/`` folder): that scheme and its weights and scales when it came from an MXFP4 folder,
    else :data:`DEFAULT_CONFIG` on :func:`quantizable_weights` of the checkpoint tensor ``names``."""
    if source_scheme is not None and recorded is not None:
        return Mxfp4Writer(source_scheme, {n[: -len(SCALES_SUFFIX)] for n in recorded}, dict(recorded))
    scheme = source_scheme or Mxfp4()
    weights = quantizable_weights(names, scheme.not_converted)
    if not weights:
        raise PaiZooError("--quantize mxfp4 stores routed experts' mlp.experts.gate_up_proj and down_proj (gpt-oss's "
                          "layout); this model has none")
    return Mxfp4Writer(scheme, weights)


def recorded_scales(path) -> dict | None:
    """The MXFP4 scales a checkpoint converted from an MXFP4 folder kept (``hf/mxfp4_scales.safetensors``), by
    their HF names; ``None`` when it kept none."""
    return recorded_tensors(path, SCALES_FILE)


#: The decoding reader of this encoding (:func:`pai_zoo.formats.encodings.decoded`).
decoder = Mxfp4Checkpoint
