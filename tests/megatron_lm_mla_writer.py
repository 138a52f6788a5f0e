"""A test-side generator of NVIDIA Megatron-LM legacy (`--ckpt-format torch`) checkpoints of Hugging Face DeepSeek-V2
and DeepSeek-V3 models: multi-latent attention (`--multi-latent-attention`) and DeepSeek's mixture of experts.

Like megatron_lm_writer.py, this is a reference pai-zoo's Megatron-LM reader is tested against, so it does not use
pai-zoo: the HF -> Megatron mapping below is written from megatron-core's own modules (MLASelfAttention in
megatron/core/transformer/multi_latent_attention.py, the MLA branches of gpt_layer_specs.py, TopKRouter, MoELayer,
SharedExpertMLP). test_megatron_lm_mla_writer.py loads what it writes, strictly, into megatron-core's GPTModel.

Layout: `iter_0000001/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt`, each `{"args", "checkpoint_version", "iteration",
"model", "num_floating_point_operations_so_far"}` (no rng or optimizer state).

Per decoder layer `decoder.layers.{i}.` (megatron-core's local spec, `--transformer-impl local`):

- `input_layernorm.weight` [h]
- `self_attention.linear_proj.weight` [h, n * v_head_dim / tp] (HF o_proj; row-parallel: columns split)
- without a query LoRA (HF q_lora_rank None): `self_attention.linear_q_proj.weight` [n * (nope + rope) / tp, h]
  (HF q_proj; column-parallel: rows split by heads)
- with one: `self_attention.linear_q_down_proj.weight` [q_lora_rank / tp, h] (HF q_a_proj),
  `self_attention.linear_q_up_proj.weight` [n * (nope + rope) / tp, q_lora_rank] (HF q_b_proj, rows by heads) and
  `self_attention.q_layernorm.weight` [q_lora_rank] (HF q_a_layernorm)
- `self_attention.linear_kv_down_proj.weight` [(kv_lora_rank + rope) / tp, h] (HF kv_a_proj_with_mqa as is: the
  compressed KV rows, then the shared rope key rows)
- `self_attention.linear_kv_up_proj.weight` [n * (nope + v_head_dim) / tp, kv_lora_rank] (HF kv_b_proj, rows by heads)
- `self_attention.kv_layernorm.weight` [kv_lora_rank] (HF kv_a_layernorm)
- `pre_mlp_layernorm.weight` [h] (HF post_attention_layernorm)
- a dense layer (the first `first_k_dense_replace`): `mlp.linear_fc1.weight` [2 F / tp, h] (this rank's gate rows,
  then its up rows), `mlp.linear_fc2.weight` [h, F / tp]
- a MoE layer: `mlp.router.weight` [E, h] (HF mlp.gate.weight, replicated), `mlp.router.expert_bias` [E] float32
  (DeepSeek-V3's gate.e_score_correction_bias, replicated), `mlp.experts.local_experts.{j}.linear_fc1.weight`
  [2 Fe / tp, h] / `linear_fc2.weight` [h, Fe / tp] (SequentialMLP, expert TP = tp), and
  `mlp.shared_experts.linear_fc1.weight` [2 S / tp, h] / `linear_fc2.weight` [h, S / tp] (S = n_shared_experts * Fe)
- every linear layer's `_extra_state` (None).

Every tensor is in the args' params_dtype (the HF model's dtype), as a bf16 Megatron-LM run saves them through
Float16Module, the router weight too (HF keeps it in float32); the router's expert_bias stays float32, as
TopKRouter keeps it.

In the local spec linear_q_down_proj and linear_kv_down_proj are ColumnParallelLinear (gather_output=False; MLA
gathers their output itself), so tensor-parallel rank t holds the t-th contiguous chunk of their rows.

With `te_names=True` (`--transformer-impl transformer_engine`, megatron-core's
get_gpt_layer_with_transformer_engine_spec with multi_latent_attention and qk_layernorm, not mla_down_proj_fusion):
`input_layernorm.weight` stays separate (TENorm); q_layernorm / kv_layernorm are IdentityOp and their weights are the
fused `self_attention.linear_q_up_proj.layer_norm_weight` / `self_attention.linear_kv_up_proj.layer_norm_weight`
(TELayerNormColumnParallelLinear); `self_attention.core_attention._extra_state` is added; the down projections are
TELinear with parallel_mode='duplicated': every TP rank holds the full tensor. A dense layer's pre-MLP norm is
`mlp.linear_fc1.layer_norm_weight` (TELayerNormColumnParallelLinear, pre_mlp_layernorm IdentityOp); a MoE layer keeps
`pre_mlp_layernorm.weight` (TENorm).

All weights are copied without permutation: megatron-core's MLA rope (rope_utils `_apply_rotary_pos_emb_bshd`,
multi_latent_attention branch) takes the rotated channels as interleaved pairs (0::2, 1::2), as DeepSeek-V2's
complex rope and DeepSeek-V3 with `rope_interleave` do. A DeepSeek-V3 config with rope_interleave False (rotate-half
pairs i, i + rope/2) gets the rope rows of q and of the kv down projection interleaved so that Megatron's pairs are
HF's: new[2i] = old[i], new[2i + 1] = old[i + rope/2].

Multi-token-prediction layers of the HF model are not written (mtp_num_layers None).

megatron-core versions: the layout above is 0.16's. megatron-core 0.19 (QKNormConfigResolver) builds no local-spec
MLA with qk_layernorm and q_lora_rank None (a standalone q_layernorm without a q LoRA is refused, and the local
backend has no fused norm+linear for linear_q_proj); its TE spec then fuses a norm into linear_q_proj
(`linear_q_proj.layer_norm_weight` [h]), which DeepSeek models without a q LoRA do not have. Neither is written here.
Neither version's local DotProductAttention accepts MLA's k_channels / v_channels, so Megatron-LM trains MLA with
Transformer Engine; the local form is the one megatron-core's GPTModel loads (with another core attention) on a CPU.
"""

from __future__ import annotations

import argparse
from collections import OrderedDict
from pathlib import Path
from typing import Any

import torch
from megatron_lm_writer import CHECKPOINT_VERSION, TRACKER, chunk_layers, megatron_args, rank_folder

# MLATransformerConfig's defaults for the YaRN fields Megatron-LM has no command-line flag for
MLA_YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32.0, "beta_slow": 1.0}


# --------------------------------------------------------------------------------------------------------------
# HF config


def _cfg(hf_config: Any) -> dict:
    return dict(hf_config) if isinstance(hf_config, dict) else hf_config.to_dict()


def mla_dims(hf_config: Any) -> dict:
    """The dimensions and routing of a DeepSeek-V2/V3 HF config."""
    c = _cfg(hf_config)
    model_type = c.get("model_type", "")
    if model_type not in ("deepseek_v2", "deepseek_v3"):
        raise ValueError(f"model_type {model_type!r}: a DeepSeek-V2 or -V3 config")
    if c.get("attention_bias"):
        raise ValueError("attention_bias: megatron-core's MLA has no q/kv down-projection or output biases here")
    L, nh = c["num_hidden_layers"], c["num_attention_heads"]
    k = c.get("first_k_dense_replace") or 0
    rope = c.get("rope_parameters") or c.get("rope_scaling") or {}
    yarn = rope.get("rope_type", rope.get("type")) == "yarn"
    theta = rope.get("rope_theta", c.get("rope_theta", 10000.0))
    n_group = c.get("n_group") or 1
    topk_group = c.get("topk_group") or n_group
    topk = c["num_experts_per_tok"]
    v3 = model_type == "deepseek_v3"
    if not v3 and c.get("topk_method", "greedy") == "group_limited_greedy" and n_group > 1:
        # DeepSeek-V2 ranks groups by their best expert; Megatron by the sum of its top (topk / group_topk) experts
        if topk // topk_group != 1:
            raise ValueError(f"DeepSeek-V2 group_limited_greedy with top-{topk} of {topk_group} groups: Megatron's "
                             "group score (a sum of the top topk/group_topk experts) is not V2's (the best expert)")
    grouped = n_group > 1 and (v3 or c.get("topk_method") == "group_limited_greedy")
    return {
        "v3": v3,
        "L": L,
        "h": c["hidden_size"],
        "nh": nh,
        "F": c["intermediate_size"],
        "vocab": c["vocab_size"],
        "tied": bool(c.get("tie_word_embeddings", False)),
        "max_pos": c.get("max_position_embeddings", 4096),
        "eps": float(c.get("rms_norm_eps", 1e-6)),
        "dtype": c.get("dtype") or c.get("torch_dtype") or "float32",
        "q_lora": c.get("q_lora_rank"),
        "kv_lora": c["kv_lora_rank"],
        "nope": c["qk_nope_head_dim"],
        "rope": c["qk_rope_head_dim"],
        "v": c["v_head_dim"],
        "interleaved": bool(c.get("rope_interleave", True)) if v3 else True,
        "yarn": yarn,
        "theta": float(theta),
        "factor": float(rope.get("factor", 1.0)) if yarn else 1.0,
        "mscale": float(rope.get("mscale") or 1.0) if yarn else 1.0,
        "mscale_all_dim": float(rope.get("mscale_all_dim") or 0.0) if yarn else 0.0,
        "orig_max_pos": rope.get("original_max_position_embeddings") if yarn else None,
        "beta_fast": float(rope.get("beta_fast") or 32.0) if yarn else None,
        "beta_slow": float(rope.get("beta_slow") or 1.0) if yarn else None,
        "E": c["n_routed_experts"],
        "Fe": c["moe_intermediate_size"],
        "S": (c.get("n_shared_experts") or 0) * c["moe_intermediate_size"] or None,
        "topk": topk,
        "scaling": float(c.get("routed_scaling_factor") or 1.0),
        "groups": (n_group, topk_group) if grouped else (None, None),
        "aux_loss": c.get("aux_loss_alpha"),
        "moe_layers": [i >= k for i in range(L)],
        "k_dense": k,
    }


# --------------------------------------------------------------------------------------------------------------
# args


def mla_args(hf_config: Any, *, tp: int = 1, pp: int = 1, ep: int = 1, te_names: bool = False,
             yarn_config_fields: bool = True, **overrides: Any) -> argparse.Namespace:
    """The args Namespace Megatron-LM saves for a DeepSeek-V2/V3 run: megatron_lm_writer's base args, then
    Megatron-LM's MLA (`_add_mla_args`, `--rope-type`, `--rotary-*`) and MoE fields, which
    `core_transformer_config_from_args` copies by name into MLATransformerConfig.

    kv_channels: qk_head_dim + qk_pos_emb_head_dim, the query/key head width (MLASelfAttention never reads it; its
    heads are qk_head_dim + qk_pos_emb_head_dim wide for q/k and v_head_dim for v).

    yarn_config_fields: YaRN's `original_max_position_embeddings`, `beta_fast` and `beta_slow`, under
    MLATransformerConfig's field names. Megatron-LM has no flag for them with MLA (its `--yarn-*` flags are for
    non-MLA models), so a stock Megatron-LM run leaves them out and trains with the config defaults
    (MLA_YARN_DEFAULTS); core_transformer_config_from_args still copies them when an args Namespace carries them.
    Pass False for the stock args. Every keyword in `overrides` replaces (or adds) that field.
    """
    dm = mla_dims(hf_config)
    base = {  # the dense-model fields megatron_args reads, nothing of the MoE
        "model_type": "deepseek",
        "num_hidden_layers": dm["L"],
        "hidden_size": dm["h"],
        "num_attention_heads": dm["nh"],
        "num_key_value_heads": dm["nh"],
        "head_dim": dm["nope"] + dm["rope"],
        "intermediate_size": dm["F"],
        "vocab_size": dm["vocab"],
        "tie_word_embeddings": dm["tied"],
        "max_position_embeddings": dm["max_pos"],
        "dtype": dm["dtype"],
        "attention_bias": False,
    }
    n_groups, group_topk = dm["groups"]
    fields = {
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "expert_model_parallel_size": ep,
        "transformer_impl": "transformer_engine" if te_names else "local",
        # multi-latent attention
        "multi_latent_attention": True,
        "q_lora_rank": dm["q_lora"],
        "kv_lora_rank": dm["kv_lora"],
        "qk_head_dim": dm["nope"],
        "qk_pos_emb_head_dim": dm["rope"],
        "v_head_dim": dm["v"],
        "kv_channels": dm["nope"] + dm["rope"],
        "qk_layernorm": True,
        "num_query_groups": dm["nh"],
        "group_query_attention": False,
        "cache_mla_latents": False,
        "position_embedding_type": "rope",
        "rope_type": "yarn" if dm["yarn"] else "rope",
        "rotary_base": int(dm["theta"]) if float(dm["theta"]).is_integer() else dm["theta"],  # --rotary-base is int
        "rotary_percent": 1.0,
        "rotary_interleaved": False,
        "rotary_scaling_factor": dm["factor"],
        "mscale": dm["mscale"],
        "mscale_all_dim": dm["mscale_all_dim"],
        "normalization": "RMSNorm",
        "layernorm_epsilon": dm["eps"],
        "swiglu": True,
        "add_bias_linear": False,
        "add_qkv_bias": False,
        "ffn_hidden_size": dm["F"],
        "untie_embeddings_and_output_weights": not dm["tied"],
        # DeepSeek mixture of experts
        "num_experts": dm["E"],
        "moe_ffn_hidden_size": dm["Fe"],
        "moe_router_topk": dm["topk"],
        "moe_layer_freq": [int(x) for x in dm["moe_layers"]] if dm["k_dense"] else 1,
        "moe_shared_expert_intermediate_size": dm["S"],
        "moe_shared_expert_gate": False,
        "moe_shared_expert_overlap": False,
        # V3: sigmoid scores, top-k renormalised (megatron's sigmoid top-k always is); V2: softmax over all experts,
        # then the top-k, never renormalised
        "moe_router_score_function": "sigmoid" if dm["v3"] else "softmax",
        "moe_router_pre_softmax": not dm["v3"],
        "moe_router_enable_expert_bias": dm["v3"],
        "moe_router_bias_update_rate": 1e-3,
        "moe_router_topk_scaling_factor": dm["scaling"],
        "moe_router_num_groups": n_groups,
        "moe_router_group_topk": group_topk,
        "moe_router_dtype": "fp32",
        "moe_router_load_balancing_type": "seq_aux_loss" if dm["aux_loss"] is not None else "none",
        "moe_aux_loss_coeff": float(dm["aux_loss"]) if dm["aux_loss"] is not None else 0.0,
        "moe_grouped_gemm": False,
        "moe_use_legacy_grouped_gemm": False,
        "moe_token_dispatcher_type": "alltoall",
        "expert_tensor_parallel_size": tp,
        "mtp_num_layers": None,
    }
    if dm["yarn"] and yarn_config_fields:
        fields["original_max_position_embeddings"] = dm["orig_max_pos"] or MLA_YARN_DEFAULTS[
            "original_max_position_embeddings"]
        fields["beta_fast"] = dm["beta_fast"]
        fields["beta_slow"] = dm["beta_slow"]
    fields.update(overrides)
    return megatron_args(base, **fields)


# --------------------------------------------------------------------------------------------------------------
# HF state -> Megatron global (TP 1) tensors


def _hf_state(hf_model_or_state: Any) -> dict[str, torch.Tensor]:
    """HF tensors under the checkpoint's per-expert names (transformers 5 fuses experts in memory)."""
    if isinstance(hf_model_or_state, torch.nn.Module):
        from transformers.core_model_loading import revert_weight_conversion

        state = revert_weight_conversion(hf_model_or_state, hf_model_or_state.state_dict())
    else:
        state = dict(hf_model_or_state)
    return {k: v.detach() for k, v in state.items()}


def _rope_interleave_perm(rope: int) -> torch.Tensor:
    """Row order that makes rotate-half pairs (i, i + rope/2) Megatron's interleaved pairs (2i, 2i + 1)."""
    half = rope // 2
    return torch.stack([torch.arange(half), torch.arange(half) + half], dim=1).reshape(-1)


def mla_global(hf_model_or_state: Any, hf_config: Any, padded_vocab_size: int) -> dict:
    """The full (TP 1) Megatron tensors: embedding, output (None when tied), final_norm, and one dict per layer
    (input_norm, proj, q or q_down/q_norm/q_up, kv_down, kv_norm, kv_up, pre_mlp_norm, and fc1/fc2 for a dense layer,
    router, expert_bias (V3), experts [{fc1, fc2}], shared_fc1/shared_fc2 for a MoE layer)."""
    sd = _hf_state(hf_model_or_state)
    dm = mla_dims(hf_config)
    nh, nope, rope = dm["nh"], dm["nope"], dm["rope"]
    perm = None if dm["interleaved"] else _rope_interleave_perm(rope)

    def pad_rows(w: torch.Tensor) -> torch.Tensor:
        if w.shape[0] > padded_vocab_size:
            raise ValueError(f"vocabulary {w.shape[0]} > padded_vocab_size {padded_vocab_size}")
        out = torch.zeros((padded_vocab_size, *w.shape[1:]), dtype=w.dtype)
        out[: w.shape[0]] = w
        return out

    def q_rows(w: torch.Tensor) -> torch.Tensor:  # [n * (nope + rope), in]
        if perm is None:
            return w.clone()
        heads = w.reshape(nh, nope + rope, -1).clone()
        heads[:, nope:] = heads[:, nope:][:, perm]
        return heads.reshape(w.shape)

    def kv_down_rows(w: torch.Tensor) -> torch.Tensor:  # [kv_lora + rope, h]
        if perm is None:
            return w.clone()
        out = w.clone()
        out[dm["kv_lora"]:] = w[dm["kv_lora"]:][perm]
        return out

    def swiglu(prefix: str) -> tuple[torch.Tensor, torch.Tensor]:
        fc1 = torch.cat([sd[prefix + "gate_proj.weight"], sd[prefix + "up_proj.weight"]], dim=0)
        return fc1, sd[prefix + "down_proj.weight"].clone()

    out: dict = {
        "embedding": pad_rows(sd["model.embed_tokens.weight"]),
        "output": None if dm["tied"] else pad_rows(sd["lm_head.weight"]),
        "final_norm": sd["model.norm.weight"].clone(),
        "layers": [],
    }
    for i in range(dm["L"]):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        layer = {"input_norm": sd[p + "input_layernorm.weight"].clone(), "proj": sd[a + "o_proj.weight"].clone()}
        if dm["q_lora"] is None:
            layer["q"] = q_rows(sd[a + "q_proj.weight"])
        else:
            layer["q_down"] = sd[a + "q_a_proj.weight"].clone()
            layer["q_norm"] = sd[a + "q_a_layernorm.weight"].clone()
            layer["q_up"] = q_rows(sd[a + "q_b_proj.weight"])
        layer["kv_down"] = kv_down_rows(sd[a + "kv_a_proj_with_mqa.weight"])
        layer["kv_norm"] = sd[a + "kv_a_layernorm.weight"].clone()
        layer["kv_up"] = sd[a + "kv_b_proj.weight"].clone()
        layer["pre_mlp_norm"] = sd[p + "post_attention_layernorm.weight"].clone()
        if not dm["moe_layers"][i]:
            layer["fc1"], layer["fc2"] = swiglu(m)
        else:
            layer["router"] = sd[m + "gate.weight"].clone()
            if dm["v3"]:
                layer["expert_bias"] = sd[m + "gate.e_score_correction_bias"].to(torch.float32).clone()
            if m + "experts.gate_up_proj" in sd:  # transformers 5's fused in-memory form: gate rows, then up rows
                gate_up, down = sd[m + "experts.gate_up_proj"], sd[m + "experts.down_proj"]
                layer["experts"] = [{"fc1": gate_up[e].clone(), "fc2": down[e].clone()} for e in range(dm["E"])]
            else:
                layer["experts"] = [dict(zip(("fc1", "fc2"), swiglu(f"{m}experts.{e}."))) for e in range(dm["E"])]
            if dm["S"]:
                layer["shared_fc1"], layer["shared_fc2"] = swiglu(m + "shared_experts.")
        out["layers"].append(layer)
    return out


# --------------------------------------------------------------------------------------------------------------
# tensor parallelism and key names


def _swiglu_shard(fc1: torch.Tensor, t: int, tp: int) -> torch.Tensor:
    """Column-parallel SwiGLU fc1: rank t holds [gate rows chunk t ; up rows chunk t]."""
    gate, up = fc1.chunk(2, dim=0)
    return torch.cat([gate.chunk(tp, dim=0)[t], up.chunk(tp, dim=0)[t]], dim=0)


def _rows(x: torch.Tensor, t: int, tp: int) -> torch.Tensor:
    if x.shape[0] % tp:
        raise ValueError(f"{x.shape[0]} rows are not divisible by tp {tp}")
    return x.chunk(tp, dim=0)[t].clone()


def _cols(x: torch.Tensor, t: int, tp: int) -> torch.Tensor:
    if x.shape[1] % tp:
        raise ValueError(f"{x.shape[1]} columns are not divisible by tp {tp}")
    return x.chunk(tp, dim=1)[t].contiguous().clone()


def _tp_layer(layer: dict, t: int, tp: int, te_names: bool) -> dict:
    """Tensor-parallel rank t's shard of one layer (heads divide evenly; the head-major rows split contiguously)."""
    out = {}
    for k, x in layer.items():
        if k in ("input_norm", "pre_mlp_norm", "q_norm", "kv_norm", "router", "expert_bias"):
            out[k] = x.clone()  # replicated
        elif k in ("q", "q_up", "kv_up"):  # column-parallel, rows by heads
            out[k] = _rows(x, t, tp)
        elif k in ("q_down", "kv_down"):  # local ColumnParallelLinear: rows; TE TELinear 'duplicated': whole
            out[k] = x.clone() if te_names else _rows(x, t, tp)
        elif k in ("proj", "fc2", "shared_fc2"):  # row-parallel: columns
            out[k] = _cols(x, t, tp)
        elif k in ("fc1", "shared_fc1"):
            out[k] = _swiglu_shard(x, t, tp)
        elif k == "experts":  # expert tensor parallelism = tp
            out[k] = [{"fc1": _swiglu_shard(e["fc1"], t, tp), "fc2": _cols(e["fc2"], t, tp)} for e in x]
        else:  # pragma: no cover - a tensor this writer does not know
            raise KeyError(k)
    return out


def _linear(name: str, w: Any, te_fused_norm: Any = None) -> list[tuple[str, Any]]:
    """A linear layer's entries; with a fused TE norm, its layer_norm_weight first (TELayerNormColumnParallelLinear)."""
    items = [] if te_fused_norm is None else [(name + ".layer_norm_weight", te_fused_norm)]
    return items + [(name + ".weight", w), (name + "._extra_state", None)]


def layer_items(prefix: str, sh: dict, te_names: bool) -> list[tuple[str, Any]]:
    """One decoder layer's state-dict entries in megatron-core's module order: TransformerLayer (input_layernorm,
    self_attention, pre_mlp_layernorm, mlp); MLASelfAttention (core_attention, linear_proj from
    MultiLatentAttention, then linear_q_proj | linear_q_down_proj + linear_q_up_proj, linear_kv_down_proj,
    linear_kv_up_proj, q_layernorm, kv_layernorm); MoELayer (router, experts, shared_experts)."""
    sa, mlp = prefix + "self_attention.", prefix + "mlp."
    items: list[tuple[str, Any]] = [(prefix + "input_layernorm.weight", sh["input_norm"])]
    if te_names:
        items.append((sa + "core_attention._extra_state", None))
    items += _linear(sa + "linear_proj", sh["proj"])
    if "q" in sh:
        items += _linear(sa + "linear_q_proj", sh["q"])
    else:
        items += _linear(sa + "linear_q_down_proj", sh["q_down"])
        items += _linear(sa + "linear_q_up_proj", sh["q_up"], sh["q_norm"] if te_names else None)
    items += _linear(sa + "linear_kv_down_proj", sh["kv_down"])
    items += _linear(sa + "linear_kv_up_proj", sh["kv_up"], sh["kv_norm"] if te_names else None)
    if not te_names:
        if "q_norm" in sh:
            items.append((sa + "q_layernorm.weight", sh["q_norm"]))
        items.append((sa + "kv_layernorm.weight", sh["kv_norm"]))
    if "router" not in sh:  # dense
        if not te_names:
            items.append((prefix + "pre_mlp_layernorm.weight", sh["pre_mlp_norm"]))
        items += _linear(mlp + "linear_fc1", sh["fc1"], sh["pre_mlp_norm"] if te_names else None)
        items += _linear(mlp + "linear_fc2", sh["fc2"])
        return items
    items.append((prefix + "pre_mlp_layernorm.weight", sh["pre_mlp_norm"]))  # TENorm in a TE MoE layer too
    items.append((mlp + "router.weight", sh["router"]))
    if "expert_bias" in sh:
        items.append((mlp + "router.expert_bias", sh["expert_bias"]))
    for j, x in enumerate(sh["experts"]):
        le = f"{mlp}experts.local_experts.{j}."
        items += _linear(le + "linear_fc1", x["fc1"]) + _linear(le + "linear_fc2", x["fc2"])
    if "shared_fc1" in sh:
        items += _linear(mlp + "shared_experts.linear_fc1", sh["shared_fc1"])
        items += _linear(mlp + "shared_experts.linear_fc2", sh["shared_fc2"])
    return items


def chunk_state(g: dict, layers: list[int], *, t: int, tp: int, e: int, ep: int, pre: bool, post: bool,
                te_names: bool, tied: bool) -> OrderedDict:
    """The model state dict of one (TP t, EP e) rank's pipeline stage: the given global layers numbered from 0;
    EP rank e holds the global experts e * E/ep + j as local expert j."""
    sd: OrderedDict = OrderedDict()
    if pre:
        sd["embedding.word_embeddings.weight"] = _rows(g["embedding"], t, tp)
    for local, i in enumerate(layers):
        sh = _tp_layer(g["layers"][i], t, tp, te_names)
        if "experts" in sh:
            per = len(sh["experts"]) // ep
            sh["experts"] = sh["experts"][e * per:(e + 1) * per]
        sd.update(layer_items(f"decoder.layers.{local}.", sh, te_names))
    if post:
        sd["decoder.final_layernorm.weight"] = g["final_norm"].clone()
        if not tied:
            sd["output_layer.weight"] = _rows(g["output"], t, tp)
        elif not pre:  # a tied output layer on a later stage keeps its own copy of the embedding
            sd["output_layer.weight"] = _rows(g["embedding"], t, tp)
        sd["output_layer._extra_state"] = None
    return sd


def _in_dtype(g: dict, dtype: torch.dtype) -> dict:
    """Every tensor in the model's params dtype, as megatron-core holds them (the router weight too, which HF keeps
    in float32), except the router's expert_bias, which TopKRouter keeps in float32."""

    def cast(x: Any, key: str = "") -> Any:
        if isinstance(x, torch.Tensor):
            return x if key == "expert_bias" else x.to(dtype)
        if isinstance(x, dict):
            return {k: cast(v, k) for k, v in x.items()}
        if isinstance(x, list):
            return [cast(v) for v in x]
        return x

    return cast(g)


# --------------------------------------------------------------------------------------------------------------
# legacy torch format


def write_legacy_mla(
    hf_model: Any,
    hf_config: Any,
    dst: str | Path,
    *,
    tp: int = 1,
    pp: int = 1,
    ep: int = 1,
    te_names: bool = False,
    iteration: int = 1,
    yarn_config_fields: bool = True,
    args_overrides: dict | None = None,
) -> Path:
    """Write a legacy (`--ckpt-format torch`) Megatron-LM checkpoint of an HF DeepSeek-V2/V3 model (or its state
    dict, per-expert or fused expert names) into dst; returns the iteration folder. See the module docstring for
    the keys and how each is split; `mla_args` for the args (yarn_config_fields, args_overrides)."""
    dst = Path(dst)
    dm = mla_dims(hf_config)
    if dm["nh"] % tp:
        raise ValueError(f"{dm['nh']} attention heads are not divisible by tp {tp}")
    if dm["E"] % ep:
        raise ValueError(f"{dm['E']} experts are not divisible by ep {ep}")
    args = mla_args(hf_config, tp=tp, pp=pp, ep=ep, te_names=te_names, yarn_config_fields=yarn_config_fields,
                    **dict(args_overrides or {}))
    g = _in_dtype(mla_global(hf_model, hf_config, args.padded_vocab_size), args.params_dtype)

    dst.mkdir(parents=True, exist_ok=True)
    (dst / TRACKER).write_text(str(iteration))
    it_dir = dst / f"iter_{iteration:07d}"
    for p in range(pp):
        layers = chunk_layers(dm["L"], pp, None, p)
        for t in range(tp):
            for e in range(ep):
                model = chunk_state(g, layers, t=t, tp=tp, e=e, ep=ep, pre=p == 0, post=p == pp - 1,
                                    te_names=te_names, tied=dm["tied"])
                ckpt = {"args": args, "checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration,
                        "model": model, "num_floating_point_operations_so_far": 0}
                folder = it_dir / rank_folder(t, p, e, pp=pp, ep=ep)
                folder.mkdir(parents=True, exist_ok=True)
                torch.save(ckpt, folder / "model_optim_rng.pt")
    return it_dir


__all__ = ["MLA_YARN_DEFAULTS", "chunk_state", "layer_items", "mla_args", "mla_dims", "mla_global",
           "write_legacy_mla"]
