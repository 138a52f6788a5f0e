"""Chunked local attention (Llama 4), the config rule (L0; :mod:`pai_zoo.mcore.chunked_attention` builds it).

On a chunked layer a token attends, causally, only to the tokens of its own chunk of ``attention_chunk_size`` c:
key j is visible from query i when ``floor(i / c) == floor(j / c)`` (indices in the sequence after any left
padding, as transformers' ``chunked_overlay``). transformers names the layers in ``layer_types``
(``"chunked_attention"`` / ``"full_attention"``); megatron-core has no such option, so the rule keeps one arch key,
:data:`ATTENTION_CHUNK` ``{"size": c, "layers": [1 chunked / 0 full, per layer]}``.
"""
from __future__ import annotations

from typing import Callable

from .config_map import CORE_KEY_PREFIX, Rule
from .errors import ConfigTranslationError

__all__ = ["ATTENTION_CHUNK", "CHUNKED", "FULL", "ChunkedLayerTypes", "chunked_layers"]

CHUNKED, FULL = "chunked_attention", "full_attention"
#: arch key of chunked attention: ``{"size": attention_chunk_size, "layers": [0/1 per layer]}``.
ATTENTION_CHUNK = CORE_KEY_PREFIX + "attention_chunk"


def chunked_layers(arch: dict) -> tuple[int | None, list[int]]:
    """``(chunk size, per-layer flags)`` of an arch; ``(None, [0, ...])`` without chunked attention."""
    chunk = arch.get(ATTENTION_CHUNK) or {}
    return chunk.get("size"), list(chunk.get("layers") or [0] * int(arch["num_layers"]))


class ChunkedLayerTypes(Rule):
    """``attention_chunk_size`` c and ``layer_types`` (``chunked_attention`` / ``full_attention``) <->
    :data:`ATTENTION_CHUNK`. ``derive(hf)``: the ``layer_types`` the family's config class derives when the key
    is absent (Llama 4: chunked on the RoPE layers while c is set); ``None`` refuses such a config."""

    hf_keys = ("layer_types", "attention_chunk_size")

    def __init__(self, derive: Callable[[dict], list[str]] | None = None, family: str = "this family"):
        self.derive, self.family = derive, family

    def __repr__(self) -> str:
        return f"ChunkedLayerTypes(family={self.family!r})"

    def describe(self) -> str:
        return f"attention_chunk_size c, layer_types (chunked_attention / full_attention) -> {ATTENTION_CHUNK}"

    def to_mcore(self, hf: dict, arch: dict) -> None:
        n = hf["num_hidden_layers"]
        size = hf.get("attention_chunk_size")
        types = hf.get("layer_types")
        if types is None:
            if self.derive is None:
                raise ConfigTranslationError(f"config.json has no layer_types; {self.family} needs one entry per "
                                             f"layer ({CHUNKED!r} or {FULL!r})")
            types = self.derive(hf)
        if not isinstance(types, (list, tuple)) or len(types) != n:
            raise ConfigTranslationError(f"config.json has layer_types={types!r}; {self.family} needs one entry per "
                                         f"layer (num_hidden_layers={n})")
        unknown = sorted({t for t in types if t not in (CHUNKED, FULL)})
        if unknown:
            raise ConfigTranslationError(f"config.json's layer_types has {unknown}; {self.family} supports "
                                         f"{CHUNKED!r} and {FULL!r}")
        flags = [int(t == CHUNKED) for t in types]
        if size is not None and (isinstance(size, bool) or not isinstance(size, int) or size < 1):
            raise ConfigTranslationError(f"config.json has attention_chunk_size={size!r}; it must be a positive "
                                         "integer")
        if size is None and any(flags):
            raise ConfigTranslationError("config.json's layer_types has chunked_attention layers but "
                                         "attention_chunk_size is null; set the chunk size")
        arch[ATTENTION_CHUNK] = {"size": size, "layers": flags}

    def to_hf(self, arch: dict, hf: dict) -> None:
        size, flags = chunked_layers(arch)
        hf["attention_chunk_size"] = size
        hf["layer_types"] = [CHUNKED if f else FULL for f in flags]
