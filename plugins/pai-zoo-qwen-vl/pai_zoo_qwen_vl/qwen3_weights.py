"""Qwen3-VL / Qwen3-VL-MoE weight tables, in the published checkpoints' names (transformers 5 keeps them in memory
too): the language model under ``model.language_model.`` in Qwen3's Llama layout with per-head q/k norms, ``lm_head``,
and the tower ``model.visual.*`` <-> ``vision_model.*`` (:mod:`pai_zoo_qwen_vl.qwen3_vision`), one row per tower
tensor.

The MoE language model has Qwen3-MoE's router and its experts stored stacked (:class:`EitherWayExperts`): the
published checkpoints hold ``mlp.experts.gate_up_proj`` as ``[E, hidden, 2 * ffn]`` and ``down_proj`` as
``[E, ffn, hidden]``; transformers 5 transposes them on load when their shape says so (its ``Transpose`` with
``check_dims``) and holds and saves ``[E, 2 * ffn, hidden]`` / ``[E, hidden, ffn]``. Both are read; pai-zoo writes
transformers' own layout (a published folder converted back is transformers' ``save_pretrained`` of it).
"""
from __future__ import annotations

from pai_zoo import Copy, GateUp, WeightMap
from pai_zoo.config_map import McoreConfig
from pai_zoo.layouts import HF_LAYER, MCORE_LAYER, llama_layout
from pai_zoo.mapping import StackedExperts, on_layers
from pai_zoo.tables.mapping.patch_tower_rows import patch_block_rows

from .qwen3_config import qwen3_tower_settings

V, MV = "model.visual.", "vision_model."
LM = "model.language_model."


def _language_model(rows: list) -> list:
    """``rows`` with their ``model.`` names under ``model.language_model.``."""
    for row in rows:
        row.hf = tuple(LM + n[len("model."):] if n.startswith("model.") else n for n in row.hf)
    return rows


def _qk_norms() -> list:
    return [Copy(HF_LAYER + "self_attn.q_norm.weight", MCORE_LAYER + "self_attention.q_layernorm.weight"),
            Copy(HF_LAYER + "self_attn.k_norm.weight", MCORE_LAYER + "self_attention.k_layernorm.weight")]


def _merger_rows(hf: str, mc: str) -> list:
    return [Copy(hf + f"{m}.{p}", mc + f"{m}.{p}") for m in ("norm", "linear_fc1", "linear_fc2")
            for p in ("weight", "bias")]


def qwen3_tower_rows(config: McoreConfig) -> list:
    """The tower's rows: patch embedding, learned positions, every block, the merger and the DeepStack mergers."""
    s = qwen3_tower_settings(config)
    rows = [Copy(V + f"patch_embed.proj.{p}", MV + f"patch_embed.proj.{p}") for p in ("weight", "bias")]
    rows.append(Copy(V + "pos_embed.weight", MV + "pos_embed.weight"))
    heads = (s["heads"], s["heads"], s["dim"] // s["heads"])
    for i in range(s["depth"]):
        rows += patch_block_rows(f"{V}blocks.{i}.", f"{MV}blocks.{i}.", heads, norm_bias=True, qkv_bias=True,
                                 proj_bias=True, mlp_bias=True, mlp_names=("linear_fc1", "linear_fc2"))
    rows += _merger_rows(V + "merger.", MV + "merger.")
    for j in range(len(s["deepstack"])):
        rows += _merger_rows(f"{V}deepstack_merger_list.{j}.", f"{MV}deepstack_merger_list.{j}.")
    return rows


class EitherWayExperts(StackedExperts):
    """Stacked experts ``[E, out, in]`` (transformers' layout, megatron's per expert) or ``[E, in, out]`` (the
    published checkpoints'), told apart by shape as transformers does (square: transformers' layout)."""

    def __init__(self, hf: str, mcore: str, experts: int, out: int, inner: int):
        super().__init__(hf, mcore, experts, transposed=False)
        self.shape = (experts, out, inner)

    def to_mcore(self, tensors, ctx):
        (t,) = tensors
        if t.dim() == 3 and tuple(t.shape) != self.shape and tuple(t.shape) == (self.shape[0], *self.shape[:0:-1]):
            t = t.transpose(1, 2)
        return super().to_mcore([t], ctx)


def qwen3_vl_weights(config: McoreConfig) -> WeightMap:
    """Qwen3-VL dense: Qwen3's language model (q/k norms, no biases) and the tower."""
    return WeightMap(*_language_model(llama_layout() + _qk_norms()), *qwen3_tower_rows(config))


def qwen3_vl_moe_weights(config: McoreConfig) -> WeightMap:
    """Qwen3-VL-MoE: the router ``mlp.gate``, the stacked experts, dense MLPs on ``mlp_only_layers``."""
    experts, hidden = int(config["num_moe_experts"]), int(config["hidden_size"])
    ffn = int(config["moe_ffn_hidden_size"])
    E = MCORE_LAYER + "mlp.experts.local_experts.{expert}."
    mlp = on_layers(
        "moe",
        Copy(HF_LAYER + "mlp.gate.weight", MCORE_LAYER + "mlp.router.weight"),
        EitherWayExperts(HF_LAYER + "mlp.experts.gate_up_proj", E + "linear_fc1.weight", experts, 2 * ffn, hidden),
        EitherWayExperts(HF_LAYER + "mlp.experts.down_proj", E + "linear_fc2.weight", experts, hidden, ffn),
    )
    mlp += on_layers("dense", GateUp(HF_LAYER + "mlp.{gate,up}_proj.weight", MCORE_LAYER + "mlp.linear_fc1.weight"),
                     Copy(HF_LAYER + "mlp.down_proj.weight", MCORE_LAYER + "mlp.linear_fc2.weight"))
    return WeightMap(*_language_model(llama_layout(mlp=mlp) + _qk_norms()), *qwen3_tower_rows(config))
