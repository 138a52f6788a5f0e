"""DeepSeek Sparse Attention's lightning indexer (DeepSeek-V3.2, GLM-5), the config rule (L0;
:mod:`pai_zoo.mcore.sparse_attention` builds it).

transformers' ``index_n_heads``, ``index_head_dim``, ``index_topk`` are megatron-core's ``dsa_indexer_n_heads``,
``dsa_indexer_head_dim``, ``dsa_indexer_topk`` (fields of ``TransformerConfig`` in 0.16 and 0.19). What only
megatron-core 0.19 can say, or nothing in megatron-core, is kept under core keys:

* :data:`ROPE_INTERLEAVED` -- the indexer's RoPE on its first ``qk_rope_head_dim`` channels: DeepSeek-V3.2
  half-split (False), GLM-5 interleaved pairs (True); 0.19's ``dsa_indexer_rope_interleaved``.
* :data:`INDEXER_LAYERS` -- GLM-5's ``indexer_types``: per layer 1 (``full``: the layer's own indexer) or 0
  (``shared``: the top-k of the nearest full layer before it, no indexer weights). 0.19's
  ``dsa_indexer_topk_freq`` / ``dsa_indexer_skip_topk_offset`` say the same for a periodic pattern
  (:func:`topk_schedule`). Absent: every layer has its indexer.

transformers' indexer scores with a ReLU on each head (0.19's ``dsa_indexer_scoring_relu``, on) and without the
Hadamard rotation of DeepSeek's reference (0.19's ``dsa_indexer_rotate_activation``; an orthogonal map, so the
scores are the same); its key norm is a LayerNorm of eps 1e-6.
"""
from __future__ import annotations

from .config_map import CORE_KEY_PREFIX, Rule
from .errors import ConfigTranslationError

__all__ = ["INDEXER_FIELDS", "INDEXER_LAYERS", "ROPE_INTERLEAVED", "IndexerRule", "indexer_layers",
           "topk_schedule"]

#: transformers' indexer keys -> megatron-core's fields.
INDEXER_FIELDS = {"index_n_heads": "dsa_indexer_n_heads", "index_head_dim": "dsa_indexer_head_dim",
                  "index_topk": "dsa_indexer_topk"}
ROPE_INTERLEAVED = CORE_KEY_PREFIX + "dsa_indexer_rope_interleaved"
INDEXER_LAYERS = CORE_KEY_PREFIX + "dsa_indexer_layers"
#: GLM-5's config keys that derive ``indexer_types`` when it is absent (kept as they were, for the way back).
SCHEDULE_KEYS = ("index_topk_freq", "index_skip_topk_offset", "index_topk_pattern")
SCHEDULE = CORE_KEY_PREFIX + "dsa_indexer_schedule"
FULL, SHARED, INDEXED = "full", "shared", "indexed_attention"


def indexer_layers(arch: dict) -> list[int]:
    """Per layer 1 (own indexer) or 0 (reuses the previous full layer's top-k)."""
    return list(arch.get(INDEXER_LAYERS) or [1] * int(arch["num_layers"]))


def topk_schedule(layers: list[int]) -> tuple[int, int] | None:
    """megatron-core 0.19's ``(dsa_indexer_topk_freq, dsa_indexer_skip_topk_offset)`` giving ``layers`` (layer
    ``n``, 1-based, reuses the top-k when ``max(n - max(offset, 1), 0) % freq != 0``), or None if none does."""
    n = len(layers)
    for freq in range(1, n + 1):
        for offset in range(1, n + 1):  # megatron-core reads 0 as 1; transformers' index_skip_topk_offset agrees
            if all(layers[i] == int(max(i + 1 - offset, 0) % freq == 0) for i in range(n)):
                return freq, offset
    return None


def _positive(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, int) or value < 1:
        raise ConfigTranslationError(f"{name}={value!r}: the indexer's {name} must be a positive integer")
    return value


class IndexerRule(Rule):
    """``index_n_heads``, ``index_head_dim``, ``index_topk`` <-> ``dsa_indexer_*``; ``layer_types`` (every layer
    ``indexed_attention``); ``interleaved``: the family's indexer RoPE (:data:`ROPE_INTERLEAVED`); ``shared``:
    the family has ``indexer_types`` (:data:`INDEXER_LAYERS`)."""

    def __init__(self, interleaved: bool, shared: bool = False, family: str = "this family"):
        self.interleaved, self.shared, self.family = interleaved, shared, family
        self.hf_keys = (*INDEXER_FIELDS, "layer_types", *(("indexer_types", *SCHEDULE_KEYS) if shared else ()))

    def __repr__(self) -> str:
        return f"IndexerRule(interleaved={self.interleaved}, shared={self.shared})"

    def describe(self) -> str:
        shared = ", indexer_types (full / shared)" if self.shared else ""
        return (f"index_n_heads, index_head_dim, index_topk -> dsa_indexer_n_heads/head_dim/topk{shared} "
                f"(DeepSeek sparse attention, {'interleaved' if self.interleaved else 'half-split'} indexer RoPE)")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        for key, field in INDEXER_FIELDS.items():
            if key not in hf:
                raise ConfigTranslationError(f"config.json has no {key!r} (the sparse-attention indexer's)")
            arch[field] = _positive(key, hf[key])
        rot = hf.get("qk_rope_head_dim") or 0
        if rot > hf["index_head_dim"]:
            raise ConfigTranslationError(f"index_head_dim={hf['index_head_dim']} < qk_rope_head_dim={rot}: the "
                                         "indexer rotates its first qk_rope_head_dim channels")
        n = int(hf["num_hidden_layers"])
        types = hf.get("layer_types")
        if types is not None and list(types) != [INDEXED] * n:
            raise ConfigTranslationError(f"layer_types={types!r}: {self.family} has sparse attention "
                                         f"({INDEXED!r}) in every layer")
        arch[ROPE_INTERLEAVED] = self.interleaved
        if not self.shared:
            return
        kinds = hf.get("indexer_types")
        if kinds is None:
            kinds = [FULL] * n
        if len(kinds) != n or any(k not in (FULL, SHARED) for k in kinds) or kinds[0] != FULL:
            raise ConfigTranslationError(f"indexer_types={kinds!r}: one entry per layer ({n}), {FULL!r} or "
                                         f"{SHARED!r}, the first {FULL!r} (a shared layer reuses an earlier top-k)")
        layers = [int(k == FULL) for k in kinds]
        if not all(layers):
            if hf.get("num_nextn_predict_layers"):
                raise ConfigTranslationError(
                    f"indexer_types={kinds!r} with num_nextn_predict_layers={hf['num_nextn_predict_layers']}: a "
                    "multi-token-prediction layer beside shared indexer layers is not supported (which top-k it "
                    "would use is not defined); set num_nextn_predict_layers 0 or every layer 'full'")
            arch[INDEXER_LAYERS] = layers
        schedule = {k: hf[k] for k in SCHEDULE_KEYS if k in hf}
        if schedule:
            arch[SCHEDULE] = schedule

    def to_hf(self, arch: dict, hf: dict) -> None:
        for key, field in INDEXER_FIELDS.items():
            hf[key] = arch[field]
        if bool(arch.get(ROPE_INTERLEAVED)) != self.interleaved:
            raise ConfigTranslationError(
                f"dsa_indexer_rope_interleaved={bool(arch.get(ROPE_INTERLEAVED))}: {self.family}'s indexer rotates "
                f"{'interleaved pairs' if self.interleaved else 'half-split channels'}")
        n = int(arch["num_layers"])
        hf["layer_types"] = [INDEXED] * n
        layers = indexer_layers(arch)
        if not self.shared:
            if not all(layers):
                raise ConfigTranslationError(f"{INDEXER_LAYERS}: {self.family} runs an indexer in every layer")
            return
        hf["indexer_types"] = [FULL if f else SHARED for f in layers]
        hf.update(arch.get(SCHEDULE) or {})
