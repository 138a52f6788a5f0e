"""Where LoRA adapters go, found in a family's weight-mapping table: no family writes LoRA code.

A *target* is a megatron-core linear of a decoder layer (``linear_qkv``, ``linear_proj``, ``linear_fc1``,
``linear_fc2``, a shared expert's, MLA's projections ...) whose weight a table row fills from Hugging Face
projections (``QKV``: q, k, v; ``GateUp``: gate, up; ``Copy``: one). PEFT adapts each HF projection on its own, so
pai-zoo keeps one adapter per HF projection (its own A and B). Its B rows are placed into the fused output by the
same row that places the fused weight's rows: the row's ``to_hf`` run on the fused row indices says, for every HF
row, which fused row it is (:func:`fused_positions`).

Adapters are exchanged in two forms, both full (unsharded):

- *HF form*: ``{"model.layers.0.self_attn.q_proj": (A, B)}``, B's rows in HF order (PEFT's ``lora_B``);
- *mcore form*: ``{"decoder.layers.0.self_attention.linear_qkv.lora_adapters.q_proj.lora_A": A, ...lora_B: B}``,
  B's rows in the order they take in the fused weight, which is what tensor parallelism splits into contiguous
  blocks (the checkpoint's form).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..plugin.config_map import McoreConfig
from ..tables.mapping import MappingContext, Row
from .settings import LoraError

LAYER = "{layer}"
MCORE_LAYER = "decoder.layers.{layer}."
ADAPTERS = "lora_adapters"


@dataclass(frozen=True)
class Target:
    """One adaptable megatron-core linear, per decoder layer: its module path (``{layer}`` in it), the HF
    projections its weight is made of, and the table row that fuses them."""

    mcore: str
    hf: tuple[str, ...]
    row: Row

    @property
    def megatron_name(self) -> str:
        return self.mcore.rsplit(".", 1)[-1]

    @property
    def leaves(self) -> tuple[str, ...]:
        """The HF projections' own names (``q_proj``): PEFT's ``target_modules`` and the adapters' keys."""
        return tuple(h.rsplit(".", 1)[-1] for h in self.hf)

    @property
    def in_module(self) -> str:
        """The path inside a decoder layer (``self_attention.linear_qkv``)."""
        return self.mcore[len(MCORE_LAYER):]


def _module(weight_name: str) -> str | None:
    return weight_name[: -len(".weight")] if weight_name.endswith(".weight") else None


def lora_targets(table) -> list[Target]:
    """Every linear of a decoder layer that a row of ``table`` (a :class:`~pai_zoo.tables.mapping.WeightMap`) fills from
    HF projection weights, routed experts left out (transformers fuses them into one tensor, which PEFT's LoRA does
    not adapt), and so the sparse-attention indexer (its top-k indices take no gradient from the loss)."""
    found = []
    for row in table.rows:
        if not row.per_layer or row.per_expert or len(row.mcore) != 1 or not row.hf:
            continue
        mcore = _module(row.mcore[0])
        hf = tuple(_module(h) for h in row.hf)
        if mcore is None or not mcore.startswith(MCORE_LAYER) or None in hf or ".experts." in mcore \
                or ".indexer." in mcore:
            continue
        if not mcore.rsplit(".", 1)[-1].startswith("linear_"):
            continue
        found.append(Target(mcore, hf, row))
    return found


def select(targets: list[Target], names, family: str) -> dict[Target, tuple[int, ...]]:
    """The targets ``names`` choose, each with the indices of its HF projections that get an adapter. A megatron
    name (``linear_qkv``) chooses all of its projections, an HF name (``q_proj``) that one. A name no target has is
    refused, naming the valid ones."""
    chosen: dict[Target, set[int]] = {}
    unknown = []
    for name in names:
        hit = False
        for t in targets:
            if name == t.megatron_name:
                chosen.setdefault(t, set()).update(range(len(t.hf)))
                hit = True
            elif name in t.leaves:
                chosen.setdefault(t, set()).add(t.leaves.index(name))
                hit = True
        if not hit:
            unknown.append(name)
    if unknown:
        valid = sorted({t.megatron_name for t in targets} | {leaf for t in targets for leaf in t.leaves})
        raise LoraError(f"lora target modules {unknown}: family {family!r} has no such linear; use any of "
                        f"{', '.join(valid)}")
    return {t: tuple(sorted(i)) for t, i in chosen.items()}


def fused_positions(target: Target, ctx: MappingContext, fused_rows: int) -> list:
    """For each HF projection of ``target``, the fused weight's row index of each of its rows (a LongTensor per
    projection, in HF row order). Refused where the row is no permutation of rows (nothing to place B by)."""
    import torch

    index = torch.arange(fused_rows, dtype=torch.float64).unsqueeze(1)
    parts = target.row.to_hf([index], ctx)
    out = [p.reshape(-1).to(torch.long) for p in parts]
    seen = torch.cat(out).sort().values
    if len(parts) != len(target.hf) or not torch.equal(seen, torch.arange(fused_rows)):
        raise LoraError(f"{target.mcore}: its table row ({type(target.row).__name__}) does not place HF rows as a "
                        "permutation; LoRA cannot place the adapters' rows")
    return out


def fused_rows_of(target: Target, config: McoreConfig) -> int:
    """The global output rows of ``target``'s weight, from the model's config."""
    heads, groups, d = config.num_attention_heads, config.num_query_groups, config.kv_channels
    gated = 2 if config.get("gated_linear_unit") else 1
    inside = target.in_module
    if inside == "self_attention.linear_qkv":  # with an output gate, every query head has its gate head too
        return (heads * (2 if config.get("attention_output_gate") else 1) + 2 * groups) * d
    if inside in ("self_attention.linear_proj", "mlp.linear_fc2", "mlp.shared_experts.linear_fc2"):
        return int(config["hidden_size"])
    if inside == "mlp.linear_fc1":
        return gated * int(config.get("ffn_hidden_size") or 4 * int(config["hidden_size"]))
    if inside == "mlp.shared_experts.linear_fc1":
        return gated * int(config["moe_shared_expert_intermediate_size"])
    return 0  # elsewhere: the adapters' own rows (every projection has one), see mcore_order


def mcore_order(target: Target, ctx: MappingContext, fused_rows: int) -> list:
    """For each HF projection, its HF row indices sorted by their place in the fused weight: B in mcore form is
    ``B_hf[order]``."""
    return [p.argsort() for p in fused_positions(target, ctx, fused_rows)]


def _layer_names(target: Target, layer: int, leaf: str) -> tuple[str, str, str]:
    base = f"{target.mcore.replace(LAYER, str(layer))}.{ADAPTERS}.{leaf}"
    return f"{base}.lora_A", f"{base}.lora_B", target.hf[target.leaves.index(leaf)].replace(LAYER, str(layer))


def _fused_rows(target: Target, config: McoreConfig, hf_adapters: dict, layer: int) -> int:
    rows = fused_rows_of(target, config)
    if rows:
        return rows
    have = [hf_adapters.get(h.replace(LAYER, str(layer))) for h in target.hf]
    if any(a is None for a in have):
        raise LoraError(f"{target.mcore}: an adapter of every projection ({', '.join(target.leaves)}) is needed to "
                        "know the fused weight's rows")
    return sum(a[1].shape[0] for a in have)


def to_mcore_form(hf_adapters: dict, targets, config: McoreConfig, ctx: MappingContext) -> dict:
    """HF form -> mcore form (see the module docstring). Every adapter must belong to a target of ``targets``."""
    out, used = {}, set()
    for t in targets:
        for layer in range(ctx.num_layers):
            pairs = {leaf: hf_adapters.get(t.hf[i].replace(LAYER, str(layer))) for i, leaf in enumerate(t.leaves)}
            if not any(p is not None for p in pairs.values()):
                continue
            order = mcore_order(t, ctx, _fused_rows(t, config, hf_adapters, layer))
            for i, (leaf, pair) in enumerate(pairs.items()):
                if pair is None:
                    continue
                a_name, b_name, hf_name = _layer_names(t, layer, leaf)
                a, b = pair
                if b.shape[0] != order[i].numel():
                    raise LoraError(f"{hf_name}: lora_B has {b.shape[0]} rows; the model's {leaf} has "
                                    f"{order[i].numel()}")
                out[a_name], out[b_name] = a, b[order[i]]
                used.add(hf_name)
    unknown = sorted(set(hf_adapters) - used)
    if unknown:
        raise LoraError(f"adapters for {unknown[:3]}{' ...' if len(unknown) > 3 else ''}: the model has no such "
                        "adaptable projection (an adapter of another architecture or size?)")
    return out


def to_hf_form(mcore_adapters: dict, targets, config: McoreConfig, ctx: MappingContext) -> dict:
    """mcore form -> HF form."""
    out = {}
    for t in targets:
        for layer in range(ctx.num_layers):
            names = {leaf: _layer_names(t, layer, leaf) for leaf in t.leaves}
            if not any(n[0] in mcore_adapters for n in names.values()):
                continue
            rows = fused_rows_of(t, config) or sum(
                mcore_adapters[n[1]].shape[0] for n in names.values() if n[1] in mcore_adapters)
            order = mcore_order(t, ctx, rows)
            for i, (leaf, (a_name, b_name, hf_name)) in enumerate(names.items()):
                if a_name not in mcore_adapters:
                    continue
                b = mcore_adapters[b_name]
                hf_b = b.new_empty(b.shape)
                hf_b[order[i]] = b
                out[hf_name] = (mcore_adapters[a_name], hf_b)
    return out

