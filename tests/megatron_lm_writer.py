"""A test-side generator of NVIDIA Megatron-LM checkpoint folders, from a Hugging Face Llama/Qwen2/Qwen3 model or a
mixture of experts (Mixtral, Qwen2-MoE, Qwen3-MoE).

This module is the reference that pai-zoo's Megatron-LM reader is checked against, so it is written independently
of pai-zoo's own conversion code: the HF -> Megatron mapping below is its own, from the layout Megatron-LM's
`tools/checkpoint` saver and `save_checkpoint` write (see ../shared/megatron-lm-fixtures/README.md).
test_megatron_lm_writer.py proves, against the real Megatron-LM fixtures, that it writes what Megatron-LM writes.

Two formats:

- `write_legacy`: the `torch` format, `iter_NNNNNNN/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt`, any TP x PP (x EP),
  virtual pipeline stages (`model0`, `model1`, ...), local or Transformer Engine key names, optional random state
  and optimizer state (`optimizer` entry and a `distrib_optim.pt` file).
- `write_torch_dist`: `torch.distributed.checkpoint` files with the layers stacked along a leading dimension, the
  shards of `tp` tensor-parallel ranks (one `__R_T.distcp` per rank R and writer thread T), `metadata.json`, and the
  common state in `common.pt` or (as newer Megatron-LM writes it) inside the DCP metadata as `common_state`.

`megatron_args` builds the argparse Namespace Megatron-LM pickles into each checkpoint, under Megatron-LM's names.

Mixture-of-experts layers (`decoder.layers.{i}.mlp.`): `router.weight` [E, h] (replicated), the experts (expert
tensor parallelism = tp: each expert's fc1 split as the dense [gate ; up], fc2 by columns) in one of three module
layouts (`write_legacy(experts=...)`: SequentialMLP, TEGroupedMLP, the legacy GroupedMLP), the Qwen2-MoE shared
expert (`shared_experts.gate_weight` [1, h], `shared_experts.linear_fc1/linear_fc2`), and a separate
`pre_mlp_layernorm.weight` even with TE names. Expert-parallel rank e's files hold its E/ep experts, numbered from 0.
"""

from __future__ import annotations

import argparse
import io
import json
import random
import re
import signal
from collections import OrderedDict
from pathlib import Path
from typing import Any

import numpy as np
import torch

CHECKPOINT_VERSION = 3.0
TRACKER = "latest_checkpointed_iteration.txt"
# the DCP key of the common state as megatron-core >= 0.19 stores it:
# ShardedObject("common_state", None, (1,), (0,)).unique_key
COMMON_STATE_KEY = "common_state/shard_0_1"
# what Megatron-LM's save_checkpoint puts beside `args` in the torch_dist common state
CONTENT_METADATA = {"singleton_local_shards": False, "chained_optim_avoid_prefix": True}
METADATA_JSON = {
    "sharded_backend": "torch_dist",
    "sharded_backend_version": 1,
    "common_backend": "torch",
    "common_backend_version": 1,
}
# every linear layer of a decoder layer, in the order a local-spec TransformerLayer registers them
LAYER_LINEARS = ("self_attention.linear_proj", "self_attention.linear_qkv", "mlp.linear_fc1", "mlp.linear_fc2")


# --------------------------------------------------------------------------------------------------------------
# HF config and dimensions


def _cfg(hf_config: Any) -> dict:
    if isinstance(hf_config, dict):
        return dict(hf_config)
    return hf_config.to_dict()


def _dims(hf_config: Any) -> dict:
    c = _cfg(hf_config)
    h, nh = c["hidden_size"], c["num_attention_heads"]
    ng = c.get("num_key_value_heads") or nh
    d = c.get("head_dim") or h // nh
    model_type = c.get("model_type", "llama")
    return {
        "L": c["num_hidden_layers"],
        "h": h,
        "F": c["intermediate_size"],
        "nh": nh,
        "ng": ng,
        "d": d,
        "vocab": c["vocab_size"],
        "tied": bool(c.get("tie_word_embeddings", False)),
        "qkv_bias": bool(next((c[k] for k in ("attention_bias", "qkv_bias") if c.get(k) is not None),
                              model_type in ("qwen2", "qwen2_moe"))),
        "qk_norm": model_type in ("qwen3", "qwen3_moe"),
        "max_pos": c.get("max_position_embeddings", 4096),
        "dtype": c.get("dtype") or c.get("torch_dtype") or "float32",
        **_moe_dims(c, model_type),
    }


def _moe_dims(c: dict, model_type: str) -> dict:
    """The mixture-of-experts fields of an HF config (E 0 for a dense model).

    E experts (`num_experts`, or `num_local_experts` as Mixtral and transformers 5's Qwen3-MoE call it) of width Fe
    (`moe_intermediate_size`; Mixtral's experts are `intermediate_size` wide), top-k routing, `renorm` (the top-k
    weights renormalised: Mixtral always, Qwen when `norm_topk_prob`), the shared expert's width S (Qwen2-MoE), and
    per layer whether it is a MoE layer (Qwen: not in `mlp_only_layers` and (i + 1) % `decoder_sparse_step` == 0).
    """
    experts = c.get("num_experts") or c.get("num_local_experts") or 0
    if not experts:
        return {"E": 0, "moe_layers": [False] * c["num_hidden_layers"]}
    mixtral = model_type == "mixtral"
    step = c.get("decoder_sparse_step") or 1
    dense = set(c.get("mlp_only_layers") or [])
    return {
        "E": experts,
        "Fe": c["intermediate_size"] if mixtral else c["moe_intermediate_size"],
        "topk": c["num_experts_per_tok"],
        "renorm": True if mixtral else bool(c.get("norm_topk_prob", False)),
        "S": c.get("shared_expert_intermediate_size") or None,
        "aux_loss": float(c.get("router_aux_loss_coef") or 0.0),
        "moe_layers": [i not in dense and (i + 1) % step == 0 for i in range(c["num_hidden_layers"])],
    }


EXPERT_STYLES = ("sequential", "te_grouped", "grouped")


def padded_vocab(vocab_size: int, tp: int = 1, divisible_by: int = 128) -> int:
    """Megatron-LM's `_vocab_size_with_padding`: round up to a multiple of divisible_by * tp."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple


def _torch_dtype(name: Any) -> torch.dtype:
    if isinstance(name, torch.dtype):
        return name
    return getattr(torch, str(name).replace("torch.", ""))


# --------------------------------------------------------------------------------------------------------------
# args


def megatron_args(hf_config: Any, **overrides: Any) -> argparse.Namespace:
    """The args Namespace Megatron-LM saves, for this HF config, under Megatron-LM's own field names.

    Like Megatron-LM's llama_mistral loader, `layernorm_epsilon` and `rotary_base` hold Megatron's defaults
    (1e-5 and 10000) whatever the HF model says; pass them in `overrides` to store other values. Every keyword
    in `overrides` replaces (or adds) that field.
    """
    from megatron.core.enums import ModelType
    from megatron.core.transformer.enums import AttnBackend

    dm = _dims(hf_config)
    tp = overrides.get("tensor_model_parallel_size", 1)
    pp = overrides.get("pipeline_model_parallel_size", 1)
    ep = overrides.get("expert_model_parallel_size", 1)
    vpp = overrides.get("virtual_pipeline_model_parallel_size")
    divisible = overrides.get("make_vocab_size_divisible_by", 128)
    params_dtype = _torch_dtype(overrides.get("params_dtype", dm["dtype"]))
    fields = {
        # architecture
        "num_layers": dm["L"],
        "encoder_num_layers": dm["L"],
        "decoder_num_layers": None,
        "hidden_size": dm["h"],
        "ffn_hidden_size": dm["F"],
        "num_attention_heads": dm["nh"],
        "group_query_attention": dm["ng"] != dm["nh"],
        "num_query_groups": dm["ng"],
        "kv_channels": dm["d"],
        "normalization": "RMSNorm",
        "layernorm_epsilon": 1e-5,
        "apply_layernorm_1p": False,
        "layernorm_zero_centered_gamma": False,
        "swiglu": True,
        "squared_relu": False,
        "openai_gelu": False,
        "quick_geglu": False,
        "add_bias_linear": False,
        "add_qkv_bias": dm["qkv_bias"],
        "qk_layernorm": dm["qk_norm"],
        "qk_l2_norm": False,
        "position_embedding_type": "rope",
        "rotary_base": 10000,
        "rotary_percent": 1.0,
        "rotary_interleaved": False,
        "rotary_seq_len_interpolation_factor": None,
        "rotary_scaling_factor": 1.0,
        "use_rope_scaling": False,
        "rope_scaling_factor": 8.0,
        "rope_type": None,
        "mrope_section": None,
        "no_rope_freq": None,
        "add_position_embedding": True,
        "use_rotary_position_embeddings": False,
        "max_position_embeddings": dm["max_pos"],
        "seq_length": dm["max_pos"],
        "encoder_seq_length": dm["max_pos"],
        "decoder_seq_length": None,
        "untie_embeddings_and_output_weights": not dm["tied"],
        "apply_residual_connection_post_layernorm": False,
        "apply_query_key_layer_scaling": False,
        "attention_softmax_in_fp32": False,
        "fp32_residual_connection": False,
        "attention_dropout": 0.1,
        "hidden_dropout": 0.1,
        "init_method_std": 0.02,
        "softmax_type": "vanilla",
        "window_size": None,
        "multi_latent_attention": False,
        **_moe_args(dm, tp),
        "mtp_num_layers": None,
        "is_hybrid_model": False,
        "hybrid_override_pattern": None,
        "heterogeneous_layers_config_path": None,
        "heterogeneous_layers_config_encoded_json": None,
        "spec": None,
        # vocabulary and tokenizer
        "vocab_size": dm["vocab"],
        "make_vocab_size_divisible_by": divisible,
        "padded_vocab_size": padded_vocab(dm["vocab"], tp, divisible),
        "tokenizer_type": "HuggingFaceTokenizer",
        "tokenizer_model": None,
        "vocab_file": None,
        "merge_file": None,
        "vocab_extra_ids": 0,
        "legacy_tokenizer": False,
        # precision
        "params_dtype": params_dtype,
        "bf16": params_dtype == torch.bfloat16,
        "fp16": params_dtype == torch.float16,
        "fp8": None,
        "fp4": None,
        "main_grads_dtype": torch.float32,
        "main_params_dtype": torch.float32,
        "exp_avg_dtype": torch.float32,
        "exp_avg_sq_dtype": torch.float32,
        # implementation
        "transformer_impl": "local",
        "use_legacy_models": False,
        "deprecated_use_mcore_models": False,
        "model_type": ModelType.encoder_or_decoder,
        "attention_backend": AttnBackend.auto,
        # parallelism
        "tensor_model_parallel_size": tp,
        "pipeline_model_parallel_size": pp,
        "transformer_pipeline_model_parallel_size": pp,
        "virtual_pipeline_model_parallel_size": vpp,
        "num_layers_per_virtual_pipeline_stage": dm["L"] // (pp * vpp) if vpp else None,
        "num_virtual_stages_per_pipeline_rank": vpp,
        "decoder_first_pipeline_num_layers": None,
        "decoder_last_pipeline_num_layers": None,
        "pipeline_model_parallel_layout": None,
        "account_for_embedding_in_pipeline_split": False,
        "account_for_loss_in_pipeline_split": False,
        "expert_model_parallel_size": ep,
        "expert_tensor_parallel_size": tp if dm["E"] else 1,
        "context_parallel_size": 1,
        "data_parallel_size": ep,
        "world_size": tp * pp * ep,
        "rank": 0,
        "local_rank": 0,
        "sequence_parallel": False,
        "use_distributed_optimizer": False,
        # checkpointing and training state
        "ckpt_format": "torch",
        "use_dist_ckpt": False,
        "auto_detect_ckpt_format": False,
        "save": "megatron_lm_writer",
        "load": None,
        "save_interval": 1,
        "no_save_optim": True,
        "no_save_rng": True,
        "no_load_optim": True,
        "no_load_rng": True,
        "use_checkpoint_args": False,
        "use_mp_args_from_checkpoint_args": False,
        "use_tokenizer_model_from_checkpoint_args": True,
        "finetune": False,
        "consumed_train_samples": 0,
        "consumed_valid_samples": 0,
        "skipped_train_samples": 0,
        "micro_batch_size": 1,
        "global_batch_size": 1024,
        "seed": 1234,
        "optimizer": "adam",
        "lr": None,
        "min_lr": 0.0,
        "weight_decay": 0.01,
        "clip_grad": 1.0,
        "train_iters": None,
        "use_cpu_initialization": True,
        "perform_initialization": False,
        "exit_signal": signal.SIGTERM,
        "distributed_backend": "nccl",
    }
    fields.update(overrides)
    return argparse.Namespace(**fields)


def _moe_args(dm: dict, tp: int) -> dict:
    """Megatron-LM's MoE arguments (`_add_moe_args` and the TransformerConfig fields it exposes); for a dense model
    the values Megatron-LM's defaults give."""
    fields = {
        "num_experts": None,
        "moe_ffn_hidden_size": None,
        "moe_router_topk": 2,
        "moe_router_pre_softmax": False,
        "moe_router_score_function": "softmax",
        "moe_shared_expert_intermediate_size": None,
        "moe_shared_expert_gate": False,
        "moe_layer_freq": 1,
        "moe_router_load_balancing_type": "aux_loss",
        "moe_aux_loss_coeff": 0.0,
        "moe_grouped_gemm": False,
        "moe_use_legacy_grouped_gemm": False,
        "moe_token_dispatcher_type": "allgather",
        "moe_router_dtype": None,
        "moe_router_topk_scaling_factor": None,
        "moe_router_enable_expert_bias": False,
        "moe_router_num_groups": None,
        "moe_router_group_topk": None,
    }
    if not dm["E"]:
        return fields
    freq = dm["moe_layers"]
    fields.update(
        num_experts=dm["E"],
        moe_ffn_hidden_size=dm["Fe"],
        moe_router_topk=dm["topk"],
        # softmax over all experts, then the top k (not renormalised): Megatron's pre-softmax routing
        moe_router_pre_softmax=not dm["renorm"],
        moe_shared_expert_intermediate_size=dm["S"],
        moe_shared_expert_gate=dm["S"] is not None,
        moe_layer_freq=1 if all(freq) else [int(x) for x in freq],
        moe_aux_loss_coeff=dm["aux_loss"],
        moe_token_dispatcher_type="alltoall",
    )
    return fields


# --------------------------------------------------------------------------------------------------------------
# HF state -> Megatron global (TP 1) tensors


def _hf_state(hf_model_or_state: Any) -> dict[str, torch.Tensor]:
    if isinstance(hf_model_or_state, torch.nn.Module):
        state = hf_model_or_state.state_dict()
    else:
        state = dict(hf_model_or_state)
    return {k: v.detach() for k, v in state.items()}


def megatron_global(hf_model_or_state: Any, hf_config: Any, padded_vocab_size: int) -> dict:
    """The full (TP 1) Megatron tensors: embedding, output (None when tied), final_norm, and one dict per layer.

    Layer dict keys: input_norm, qkv, qkv_bias (when the HF model has q/k/v biases), q_norm/k_norm (qk layernorm),
    proj, pre_mlp_norm, and for a dense layer fc1 ([gate ; up]), fc2; for a mixture-of-experts layer router [E, h],
    experts (one {fc1, fc2} dict per expert) and, with a Qwen2-MoE shared expert, shared_fc1, shared_fc2 and
    shared_gate [1, h]. HF expert tensors may be per expert, as `save_pretrained` writes them
    (`mlp.experts.{e}.gate_proj.weight`, Mixtral `block_sparse_moe.experts.{e}.w1.weight`), or transformers 5's fused
    in-memory form (`mlp.experts.gate_up_proj` [E, 2 Fe, h], gate rows first, and `mlp.experts.down_proj` [E, h, Fe]).
    """
    sd = _hf_state(hf_model_or_state)
    dm = _dims(hf_config)
    ng, d = dm["ng"], dm["d"]
    heads_per_group = dm["nh"] // ng

    def pad_rows(w: torch.Tensor) -> torch.Tensor:
        if w.shape[0] == padded_vocab_size:
            return w.clone()
        if w.shape[0] > padded_vocab_size:
            raise ValueError(f"vocabulary {w.shape[0]} > padded_vocab_size {padded_vocab_size}")
        out = torch.zeros((padded_vocab_size, *w.shape[1:]), dtype=w.dtype)
        out[: w.shape[0]] = w
        return out

    def group_qkv(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        # per query group: [its query heads ; its key head ; its value head], kv_channels rows per head
        q = q.reshape(ng, heads_per_group * d, *q.shape[1:])
        k = k.reshape(ng, d, *k.shape[1:])
        v = v.reshape(ng, d, *v.shape[1:])
        return torch.cat([q, k, v], dim=1).reshape(ng * (heads_per_group + 2) * d, *q.shape[2:]).contiguous()

    embed = sd["model.embed_tokens.weight"]
    out: dict = {
        "embedding": pad_rows(embed),
        "output": None if dm["tied"] else pad_rows(sd["lm_head.weight"]),
        "final_norm": sd["model.norm.weight"].clone(),
        "layers": [],
    }
    for i in range(dm["L"]):
        p = f"model.layers.{i}."
        a, m = p + "self_attn.", p + "mlp."
        layer = {
            "input_norm": sd[p + "input_layernorm.weight"].clone(),
            "qkv": group_qkv(sd[a + "q_proj.weight"], sd[a + "k_proj.weight"], sd[a + "v_proj.weight"]),
            "proj": sd[a + "o_proj.weight"].clone(),
            "pre_mlp_norm": sd[p + "post_attention_layernorm.weight"].clone(),
        }
        if dm["moe_layers"][i]:
            layer.update(_hf_moe(sd, p, dm))
        else:
            layer["fc1"] = torch.cat([sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"]], dim=0)
            layer["fc2"] = sd[m + "down_proj.weight"].clone()
        if a + "q_proj.bias" in sd:
            layer["qkv_bias"] = group_qkv(sd[a + "q_proj.bias"], sd[a + "k_proj.bias"], sd[a + "v_proj.bias"])
        if a + "q_norm.weight" in sd:
            layer["q_norm"] = sd[a + "q_norm.weight"].clone()
            layer["k_norm"] = sd[a + "k_norm.weight"].clone()
        out["layers"].append(layer)
    return out


def _hf_moe(sd: dict, p: str, dm: dict) -> dict:
    """One HF MoE layer's router, experts and shared expert as Megatron tensors (TP 1)."""
    E, Fe, h = dm["E"], dm["Fe"], dm["h"]
    m = p + "mlp."
    if p + "block_sparse_moe.gate.weight" in sd:  # Mixtral as saved: w1 gate, w3 up, w2 down
        b = p + "block_sparse_moe."
        router = sd[b + "gate.weight"]
        experts = [
            {
                "fc1": torch.cat([sd[f"{b}experts.{e}.w1.weight"], sd[f"{b}experts.{e}.w3.weight"]], dim=0),
                "fc2": sd[f"{b}experts.{e}.w2.weight"].clone(),
            }
            for e in range(E)
        ]
    else:
        router = sd[m + "gate.weight"]
        if m + "experts.gate_up_proj" in sd:  # transformers 5 in memory
            gate_up, down = sd[m + "experts.gate_up_proj"], sd[m + "experts.down_proj"]
            if tuple(gate_up.shape) != (E, 2 * Fe, h) or tuple(down.shape) != (E, h, Fe):
                raise ValueError(f"{m}experts: unexpected fused shapes {tuple(gate_up.shape)}, {tuple(down.shape)}")
            experts = [{"fc1": gate_up[e].clone(), "fc2": down[e].clone()} for e in range(E)]
        elif f"{m}experts.0.w1.weight" in sd:  # Mixtral per expert under mlp.
            experts = [
                {
                    "fc1": torch.cat([sd[f"{m}experts.{e}.w1.weight"], sd[f"{m}experts.{e}.w3.weight"]], dim=0),
                    "fc2": sd[f"{m}experts.{e}.w2.weight"].clone(),
                }
                for e in range(E)
            ]
        else:
            experts = [
                {
                    "fc1": torch.cat(
                        [sd[f"{m}experts.{e}.gate_proj.weight"], sd[f"{m}experts.{e}.up_proj.weight"]], dim=0
                    ),
                    "fc2": sd[f"{m}experts.{e}.down_proj.weight"].clone(),
                }
                for e in range(E)
            ]
    if tuple(router.shape) != (E, h):
        raise ValueError(f"{p}: router shape {tuple(router.shape)} != {(E, h)}")
    out = {"router": router.clone(), "experts": experts}
    if dm["S"] is not None:
        s = m + "shared_expert."
        out["shared_fc1"] = torch.cat([sd[s + "gate_proj.weight"], sd[s + "up_proj.weight"]], dim=0)
        out["shared_fc2"] = sd[s + "down_proj.weight"].clone()
        out["shared_gate"] = sd[m + "shared_expert_gate.weight"].clone()
    return out


def _swiglu_shard(fc1: torch.Tensor, t: int, tp: int) -> torch.Tensor:
    """Column-parallel SwiGLU fc1: rank t holds [gate rows chunk t ; up rows chunk t]."""
    gate, up = fc1.chunk(2, dim=0)
    return torch.cat([gate.chunk(tp, dim=0)[t], up.chunk(tp, dim=0)[t]], dim=0)


def _tp_layer(layer: dict, t: int, tp: int, ng: int) -> dict:
    """Tensor-parallel rank t's shard of one layer's tensors."""
    if ng % tp:
        raise ValueError(f"num_query_groups {ng} is not divisible by tp {tp}")

    def by_groups(x: torch.Tensor) -> torch.Tensor:  # rows split by whole query groups
        g = x.reshape(ng, -1, *x.shape[1:])
        return g.chunk(tp, dim=0)[t].reshape(-1, *x.shape[1:]).contiguous()

    def cols(x: torch.Tensor) -> torch.Tensor:  # row-parallel: columns split
        return x.chunk(tp, dim=1)[t].contiguous()

    out = {
        "input_norm": layer["input_norm"].clone(),
        "qkv": by_groups(layer["qkv"]),
        "proj": cols(layer["proj"]),
        "pre_mlp_norm": layer["pre_mlp_norm"].clone(),
    }
    if "fc1" in layer:
        out["fc1"] = _swiglu_shard(layer["fc1"], t, tp)
        out["fc2"] = cols(layer["fc2"])
    if "router" in layer:  # expert tensor parallelism = tp; router and shared-expert gate replicated
        out["router"] = layer["router"].clone()
        out["experts"] = [{"fc1": _swiglu_shard(x["fc1"], t, tp), "fc2": cols(x["fc2"])} for x in layer["experts"]]
    if "shared_fc1" in layer:
        out["shared_fc1"] = _swiglu_shard(layer["shared_fc1"], t, tp)
        out["shared_fc2"] = cols(layer["shared_fc2"])
        out["shared_gate"] = layer["shared_gate"].clone()
    if "qkv_bias" in layer:
        out["qkv_bias"] = by_groups(layer["qkv_bias"])
    for k in ("q_norm", "k_norm"):
        if k in layer:
            out[k] = layer[k].clone()
    return out


def _expert_keys(mlp: str, experts: list[dict], style: str) -> list[tuple[str, Any]]:
    """A MoE layer's local experts under one of Megatron's three expert modules (see write_legacy)."""
    ex = mlp + "experts."
    if style == "sequential":  # SequentialMLP: one local-spec MLP per local expert
        items = []
        for j, x in enumerate(experts):
            le = f"{ex}local_experts.{j}."
            items += [
                (le + "linear_fc1.weight", x["fc1"]),
                (le + "linear_fc1._extra_state", None),
                (le + "linear_fc2.weight", x["fc2"]),
                (le + "linear_fc2._extra_state", None),
            ]
        return items
    if style == "te_grouped":  # TEGroupedMLP: TE GroupedLinear's weight0..weightN-1, then its extra state
        items = [(f"{ex}linear_fc1.weight{j}", x["fc1"]) for j, x in enumerate(experts)]
        items.append((ex + "linear_fc1._extra_state", None))
        items += [(f"{ex}linear_fc2.weight{j}", x["fc2"]) for j, x in enumerate(experts)]
        items.append((ex + "linear_fc2._extra_state", None))
        return items
    if style == "grouped":
        # legacy GroupedMLP: weight1 [h, E_local * fc1 rows] whose .view(E_local, h, -1)[j] is expert j's fc1.T,
        # weight2 [E_local * Fe, h] whose .view(E_local, -1, h)[j] is expert j's fc2.T
        h = experts[0]["fc1"].shape[1]
        w1 = torch.stack([x["fc1"].t() for x in experts]).contiguous().view(h, -1)
        w2 = torch.stack([x["fc2"].t() for x in experts]).contiguous().view(-1, h)
        return [(ex + "weight1", w1), (ex + "weight2", w2)]
    raise ValueError(f"experts={style!r}: one of {EXPERT_STYLES}")


def _layer_keys(prefix: str, sh: dict, te_names: bool, experts: str = "sequential") -> list[tuple[str, Any]]:
    """One decoder layer's state-dict entries, in the order Megatron's modules register them."""
    sa, mlp = prefix + "self_attention.", prefix + "mlp."
    items: list[tuple[str, Any]] = []
    if not te_names:
        items.append((prefix + "input_layernorm.weight", sh["input_norm"]))
    if te_names:
        items.append((sa + "core_attention._extra_state", None))
    items += [(sa + "linear_proj.weight", sh["proj"]), (sa + "linear_proj._extra_state", None)]
    if te_names:
        items.append((sa + "linear_qkv.layer_norm_weight", sh["input_norm"]))
    items.append((sa + "linear_qkv.weight", sh["qkv"]))
    if "qkv_bias" in sh:
        items.append((sa + "linear_qkv.bias", sh["qkv_bias"]))
    items.append((sa + "linear_qkv._extra_state", None))
    if "q_norm" in sh:
        items += [(sa + "q_layernorm.weight", sh["q_norm"]), (sa + "k_layernorm.weight", sh["k_norm"])]
    if "router" in sh:
        # a MoE layer has its own pre-MLP norm module, with TE (TENorm) or local names alike; a module's own
        # parameters come before its children's: the shared experts' gate_weight before their linear_fc1
        items += [(prefix + "pre_mlp_layernorm.weight", sh["pre_mlp_norm"]), (mlp + "router.weight", sh["router"])]
        items += _expert_keys(mlp, sh["experts"], experts)
        if "shared_fc1" in sh:
            se = mlp + "shared_experts."
            items += [
                (se + "gate_weight", sh["shared_gate"]),
                (se + "linear_fc1.weight", sh["shared_fc1"]),
                (se + "linear_fc1._extra_state", None),
                (se + "linear_fc2.weight", sh["shared_fc2"]),
                (se + "linear_fc2._extra_state", None),
            ]
        return items
    if not te_names:
        items.append((prefix + "pre_mlp_layernorm.weight", sh["pre_mlp_norm"]))
    if te_names:
        items.append((mlp + "linear_fc1.layer_norm_weight", sh["pre_mlp_norm"]))
    items += [
        (mlp + "linear_fc1.weight", sh["fc1"]),
        (mlp + "linear_fc1._extra_state", None),
        (mlp + "linear_fc2.weight", sh["fc2"]),
        (mlp + "linear_fc2._extra_state", None),
    ]
    return items


def _chunk_state(
    g: dict, layers: list[int], *, t: int, tp: int, ng: int, pre: bool, post: bool, te_names: bool, tied: bool,
    e: int = 0, ep: int = 1, experts: str = "sequential",
) -> OrderedDict:
    """The model state dict of one model chunk: the given global layers, numbered from 0; expert-parallel rank e
    of ep holds the global experts e * E/ep ... (e + 1) * E/ep - 1, numbered from 0."""
    sd: OrderedDict = OrderedDict()
    if pre:
        sd["embedding.word_embeddings.weight"] = g["embedding"].chunk(tp, dim=0)[t].clone()
    for local, i in enumerate(layers):
        sh = _tp_layer(g["layers"][i], t, tp, ng)
        if "experts" in sh:
            if len(sh["experts"]) % ep:
                raise ValueError(f"{len(sh['experts'])} experts are not divisible by ep {ep}")
            per = len(sh["experts"]) // ep
            sh["experts"] = sh["experts"][e * per:(e + 1) * per]
        sd.update(_layer_keys(f"decoder.layers.{local}.", sh, te_names, experts))
    if post:
        sd["decoder.final_layernorm.weight"] = g["final_norm"].clone()
        if not tied:
            sd["output_layer.weight"] = g["output"].chunk(tp, dim=0)[t].clone()
        elif not pre:
            # a tied output layer on a later pipeline stage keeps its own copy of the embedding
            sd["output_layer.weight"] = g["embedding"].chunk(tp, dim=0)[t].clone()
        sd["output_layer._extra_state"] = None
    return sd


def chunk_layers(num_layers: int, pp: int, vpp: int | None, stage: int, chunk: int = 0) -> list[int]:
    """Global layer numbers of model chunk `chunk` on pipeline stage `stage` (Megatron's interleaved order)."""
    v = vpp or 1
    if num_layers % (pp * v):
        raise ValueError(f"num_layers {num_layers} is not divisible by pp * vpp = {pp * v}")
    per = num_layers // (pp * v)
    offset = chunk * (num_layers // v) + stage * per
    return list(range(offset, offset + per))


def rank_folder(t: int, p: int, e: int, *, pp: int, ep: int) -> str:
    """Megatron-LM's get_checkpoint_name: mp_rank_TT, _PPP when pipeline-parallel, _EEE when expert-parallel."""
    name = f"mp_rank_{t:02d}" if pp == 1 else f"mp_rank_{t:02d}_{p:03d}"
    return name + (f"_{e:03d}" if ep > 1 else "")


def _iter_dir(iteration: int, release: bool) -> str:
    return "release" if release else f"iter_{iteration:07d}"


def _write_tracker(dst: Path, iteration: int, release: bool) -> None:
    dst.mkdir(parents=True, exist_ok=True)
    (dst / TRACKER).write_text("release" if release else str(iteration))


def _rng_state() -> list[dict]:
    """Megatron's get_rng_state for one data-parallel rank: a list holding one dict."""
    return [
        {
            "random_rng_state": random.getstate(),
            "np_rng_state": np.random.get_state(),
            "torch_rng_state": torch.get_rng_state(),
            "cuda_rng_state": torch.get_rng_state(),  # a ByteTensor, as torch.cuda.get_rng_state() returns
            "rng_tracker_states": {"model-parallel-rng": torch.get_rng_state()},
        }
    ]


def _optimizer_state(model: dict) -> tuple[dict, dict]:
    """A plausible Adam state (the `optimizer` and `opt_param_scheduler` entries); readers ignore it."""
    tensors = [v for v in model.values() if isinstance(v, torch.Tensor)]
    state = {i: {"step": torch.tensor(1.0), "exp_avg": torch.zeros_like(v), "exp_avg_sq": torch.zeros_like(v)}
             for i, v in enumerate(tensors)}
    group = {"lr": 1e-4, "betas": (0.9, 0.999), "eps": 1e-8, "weight_decay": 0.01, "params": list(state)}
    optimizer = {"optimizer": {"state": state, "param_groups": [group]}, "fp32_from_fp16_params": []}
    scheduler = {"max_lr": 1e-4, "lr_warmup_steps": 0, "num_steps": 1, "lr_decay_style": "linear",
                 "lr_decay_steps": 1, "min_lr": 0.0, "start_wd": 0.01, "end_wd": 0.01, "wd_incr_style": "constant",
                 "wd_incr_steps": 1}
    return optimizer, scheduler


# --------------------------------------------------------------------------------------------------------------
# legacy torch format


def write_legacy(
    hf_model_or_state: Any,
    hf_config: Any,
    dst: str | Path,
    *,
    tp: int = 1,
    pp: int = 1,
    vpp: int | None = None,
    ep: int = 1,
    te_names: bool | None = None,
    experts: str = "sequential",
    iteration: int = 1,
    release: bool = False,
    with_rng: bool = True,
    with_optimizer: bool = False,
    padded_vocab_size: int | None = None,
    args_overrides: dict | None = None,
) -> Path:
    """Write a legacy (`--ckpt-format torch`) Megatron-LM checkpoint of an HF Llama/Qwen2/Qwen3, Mixtral, Qwen2-MoE
    or Qwen3-MoE model into dst.

    te_names: Transformer Engine key names (default: only for experts="te_grouped"). For mixture-of-experts layers,
    expert tensor parallelism is tp, and expert-parallel rank e (folder suffix _EEE) holds the global experts
    e * E/ep + j as local expert j, beside a copy of every non-expert tensor. experts: the expert module's keys,
    under `decoder.layers.{i}.mlp.experts.`:

    - "sequential" (SequentialMLP, moe_grouped_gemm False): `local_experts.{j}.linear_fc1.weight` [2 Fe/tp, h],
      `local_experts.{j}.linear_fc2.weight` [h, Fe/tp] and their `_extra_state`;
    - "te_grouped" (TEGroupedMLP): `linear_fc1.weight{j}`, `linear_fc2.weight{j}` of the same shapes, and one
      `linear_fc1._extra_state` / `linear_fc2._extra_state` each;
    - "grouped" (the legacy GroupedMLP): `weight1` [h, E_local * 2 Fe/tp], `weight2` [E_local * Fe/tp, h].

    Returns the iteration folder. See the module docstring for the layout.
    """
    if experts not in EXPERT_STYLES:
        raise ValueError(f"experts={experts!r}: one of {EXPERT_STYLES}")
    if te_names is None:
        te_names = experts == "te_grouped"
    if experts == "te_grouped" and not te_names:
        raise ValueError("TEGroupedMLP (experts='te_grouped') exists only in Transformer Engine models (te_names)")
    dst = Path(dst)
    dm = _dims(hf_config)
    overrides = dict(args_overrides or {})
    if dm["E"]:
        overrides.setdefault("moe_grouped_gemm", experts != "sequential")
        overrides.setdefault("moe_use_legacy_grouped_gemm", experts == "grouped")
        if ep > 1 and dm["E"] % ep:
            raise ValueError(f"{dm['E']} experts are not divisible by ep {ep}")
    overrides.setdefault("tensor_model_parallel_size", tp)
    overrides.setdefault("pipeline_model_parallel_size", pp)
    overrides.setdefault("virtual_pipeline_model_parallel_size", vpp)
    overrides.setdefault("expert_model_parallel_size", ep)
    overrides.setdefault("transformer_impl", "transformer_engine" if te_names else "local")
    if padded_vocab_size is not None:
        overrides.setdefault("padded_vocab_size", padded_vocab_size)
    if not with_rng:
        overrides.setdefault("no_save_rng", True)
    else:
        overrides.setdefault("no_save_rng", False)
    overrides.setdefault("no_save_optim", not with_optimizer)
    if with_optimizer:
        overrides.setdefault("use_distributed_optimizer", True)
    args = megatron_args(hf_config, **overrides)
    g = megatron_global(hf_model_or_state, hf_config, args.padded_vocab_size)

    _write_tracker(dst, iteration, release)
    it_dir = dst / _iter_dir(iteration, release)
    for p in range(pp):
        for t in range(tp):
            for e in range(ep):
                chunks = []
                for c in range(vpp or 1):
                    chunks.append(
                        _chunk_state(
                            g,
                            chunk_layers(dm["L"], pp, vpp, p, c),
                            t=t,
                            tp=tp,
                            ng=dm["ng"],
                            pre=p == 0 and c == 0,
                            post=p == pp - 1 and c == (vpp or 1) - 1,
                            te_names=te_names,
                            tied=dm["tied"],
                            e=e,
                            ep=ep,
                            experts=experts,
                        )
                    )
                ckpt: dict = {"args": args, "checkpoint_version": CHECKPOINT_VERSION, "iteration": iteration}
                if vpp:
                    for c, sd in enumerate(chunks):
                        ckpt[f"model{c}"] = sd
                else:
                    ckpt["model"] = chunks[0]
                if with_optimizer:
                    ckpt["optimizer"], ckpt["opt_param_scheduler"] = _optimizer_state(chunks[0])
                if with_rng:
                    ckpt["rng_state"] = _rng_state()
                ckpt["num_floating_point_operations_so_far"] = 0
                folder = it_dir / rank_folder(t, p, e, pp=pp, ep=ep)
                folder.mkdir(parents=True, exist_ok=True)
                torch.save(ckpt, folder / "model_optim_rng.pt")
                if with_optimizer:
                    numel = sum(v.numel() for sd in chunks for v in sd.values() if isinstance(v, torch.Tensor))
                    torch.save(
                        {
                            "per_bucket_numel": [[numel]],
                            "per_bucket_numel_unpadded": [[numel]],
                            0: {(torch.float32, torch.float32): {"param": torch.zeros(numel),
                                                                 "exp_avg": torch.zeros(numel),
                                                                 "exp_avg_sq": torch.zeros(numel)}},
                        },
                        folder / "distrib_optim.pt",
                    )
    return it_dir


# --------------------------------------------------------------------------------------------------------------
# torch_dist format


def dist_tensors(g: dict, te_names: bool = True) -> dict[str, torch.Tensor]:
    """The global torch_dist tensors, in the order Megatron-LM's .metadata lists them.

    The layers are stacked along dim 0 (`decoder.layers.*`), except in a model with both dense and MoE layers:
    megatron-core keys those per layer (`decoder.layers.{i}.*`, no layer axis), as its TransformerBlock does for a
    `moe_layer_freq` list.
    """
    layers = g["layers"]
    out = {"embedding.word_embeddings.weight": g["embedding"]}
    moe = ["router" in lay for lay in layers]
    if all(moe) or not any(moe):
        out.update(_stacked_layers(layers, te_names))
    else:
        for i, layer in enumerate(layers):
            for k, v in _stacked_layers([layer], te_names).items():
                out[k.replace("decoder.layers.", f"decoder.layers.{i}.", 1)] = v[0]
    out["decoder.final_layernorm.weight"] = g["final_norm"]
    if g["output"] is not None:
        out["output_layer.weight"] = g["output"]
    return out


def _stacked_layers(layers: list[dict], te_names: bool) -> dict[str, torch.Tensor]:
    """The `decoder.layers.*` tensors of layers of one kind (all dense or all MoE), stacked along dim 0."""

    def stack(k: str) -> torch.Tensor:
        return torch.stack([lay[k] for lay in layers]).contiguous()

    sa, mlp = "decoder.layers.self_attention.", "decoder.layers.mlp."
    in_norm = sa + "linear_qkv.layer_norm_weight" if te_names else "decoder.layers.input_layernorm.weight"
    mlp_norm = mlp + "linear_fc1.layer_norm_weight" if te_names else "decoder.layers.pre_mlp_layernorm.weight"
    out = {in_norm: stack("input_norm")}
    out[sa + "linear_proj.weight"] = stack("proj")
    out[sa + "linear_qkv.weight"] = stack("qkv")
    if "qkv_bias" in layers[0]:
        out[sa + "linear_qkv.bias"] = stack("qkv_bias")
    if "q_norm" in layers[0]:
        out[sa + "q_layernorm.weight"] = stack("q_norm")
        out[sa + "k_layernorm.weight"] = stack("k_norm")
    out[mlp_norm] = stack("pre_mlp_norm")
    if "router" in layers[0]:
        # megatron-core's SequentialMLP.sharded_state_dict: an expert axis after the layer axis
        ex = mlp + "experts.experts."
        out[mlp + "router.weight"] = stack("router")
        out[ex + "linear_fc1.weight"] = torch.stack([torch.stack([x["fc1"] for x in lay["experts"]])
                                                     for lay in layers]).contiguous()
        out[ex + "linear_fc2.weight"] = torch.stack([torch.stack([x["fc2"] for x in lay["experts"]])
                                                     for lay in layers]).contiguous()
        if "shared_fc1" in layers[0]:
            out[mlp + "shared_experts.linear_fc1.weight"] = stack("shared_fc1")
            out[mlp + "shared_experts.linear_fc2.weight"] = stack("shared_fc2")
            out[mlp + "shared_experts.gate_weight"] = stack("shared_gate")
    else:
        out[mlp + "linear_fc1.weight"] = stack("fc1")
        out[mlp + "linear_fc2.weight"] = stack("fc2")
    return out


def _tp_chunks(key: str, x: torch.Tensor, t: int, tp: int, num_layers: int) -> list[tuple[tuple, torch.Tensor]]:
    """(global offsets, tensor) of the pieces tensor-parallel rank t writes of global tensor `key`.

    Stacked layer tensors are written one layer at a time, as Megatron's ShardedTensors with a prepended layer axis.
    Replicated tensors are written by rank 0 only.
    """

    def piece(offsets: list[int], sl: tuple) -> tuple[tuple, torch.Tensor]:
        return tuple(offsets), x[sl].clone()

    own = re.match(r"decoder\.layers\.\d+\.", key)
    if own:  # a per-layer key (dense and MoE layers mixed): the stacked layout of one layer, less its layer axis
        stacked = _tp_chunks("decoder.layers." + key[own.end():], x.unsqueeze(0), t, tp, 1)
        return [(offs[1:], p[0]) for offs, p in stacked]

    if not key.startswith("decoder.layers."):
        if key.endswith("final_layernorm.weight"):
            return [piece([0], (slice(None),))] if t == 0 else []
        rows = x.shape[0] // tp  # embedding / output layer: vocabulary rows
        return [piece([t * rows, 0], (slice(t * rows, (t + 1) * rows),))]
    out = []
    if ".experts.experts." in key:  # [L, E, ...]: one piece per layer, expert (and gate/up half), as fc1/fc2
        for layer in range(num_layers):
            for e in range(x.shape[1]):
                at = (slice(layer, layer + 1), slice(e, e + 1))
                if key.endswith("linear_fc1.weight"):
                    half = x.shape[2] // 2
                    rows = half // tp
                    for base in (0, half):
                        r0 = base + t * rows
                        out.append(piece([layer, e, r0, 0], (*at, slice(r0, r0 + rows))))
                else:
                    cols = x.shape[3] // tp
                    out.append(piece([layer, e, 0, t * cols], (*at, slice(None), slice(t * cols, (t + 1) * cols))))
        return out
    for layer in range(num_layers):
        lay = slice(layer, layer + 1)
        if x.dim() == 2 and not key.endswith("linear_qkv.bias"):  # norms: replicated
            if t == 0:
                out.append(piece([layer, 0], (lay,)))
        elif key.endswith(("linear_qkv.weight", "linear_qkv.bias")):
            rows = x.shape[1] // tp
            offs = [layer, t * rows] + [0] * (x.dim() - 2)
            out.append(piece(offs, (lay, slice(t * rows, (t + 1) * rows))))
        elif key.endswith("linear_fc1.weight"):
            half = x.shape[1] // 2
            rows = half // tp
            for base in (0, half):  # this rank's gate rows, then its up rows
                out.append(piece([layer, base + t * rows, 0], (lay, slice(base + t * rows, base + (t + 1) * rows))))
        elif key.endswith(("linear_proj.weight", "linear_fc2.weight")):
            cols = x.shape[2] // tp
            out.append(piece([layer, 0, t * cols], (lay, slice(None), slice(t * cols, (t + 1) * cols))))
        else:  # q/k layernorm and anything else per layer: replicated
            if t == 0:
                out.append(piece([layer] + [0] * (x.dim() - 1), (lay,)))
    return out


def _extra_state_keys(dm: dict) -> list[str]:
    """The unique keys of the `_extra_state` byte entries (ShardedObjects) of the decoder layers: one per layer and
    linear layer, and one per layer, expert and expert linear layer (shard_{layer}.{expert}_{L}.{E}); per-layer
    keys (shard_0_1, shard_{expert}_{E}) when dense and MoE layers are mixed."""
    L, E = dm["L"], dm["E"]
    mixed = any(dm["moe_layers"]) and not all(dm["moe_layers"])
    keys = []
    for i in range(L):
        if dm["moe_layers"][i]:
            shared = ("mlp.shared_experts.linear_fc1", "mlp.shared_experts.linear_fc2") if dm["S"] else ()
            linears = LAYER_LINEARS[:2] + shared
        else:
            linears = LAYER_LINEARS
        prefix, at = (f"decoder.layers.{i}.", "0_1") if mixed else ("decoder.layers.", f"{i}_{L}")
        keys += [f"{prefix}{lin}._extra_state/shard_{at}" for lin in linears]
        if dm["moe_layers"][i]:
            for e in range(E):
                at = f"{e}_{E}" if mixed else f"{i}.{e}_{L}.{E}"
                keys += [f"{prefix}mlp.experts.experts.{lin}._extra_state/shard_{at}"
                         for lin in ("linear_fc1", "linear_fc2")]
    return keys


def _dcp_planner_class():
    from torch.distributed.checkpoint.default_planner import create_default_global_save_plan
    from torch.distributed.checkpoint.metadata import ChunkStorageMetadata, MetadataIndex, TensorProperties
    from torch.distributed.checkpoint.planner import SavePlan, SavePlanner, TensorWriteData, WriteItem, WriteItemType

    class RankPlanner(SavePlanner):
        """Plans the writes of one (emulated) rank: tensor pieces at global offsets, and byte objects."""

        def __init__(self, pieces: list[tuple[str, tuple | None, Any, tuple | None]]):
            self.data: dict = {}
            self.items = []
            for fqn, offsets, obj, size in pieces:
                if offsets is None:
                    self.data[(fqn, None)] = obj
                    self.items.append(WriteItem(index=MetadataIndex(fqn), type=WriteItemType.BYTE_IO))
                    continue
                offs = torch.Size(offsets)
                self.data[(fqn, tuple(offsets))] = obj
                write = TensorWriteData(
                    chunk=ChunkStorageMetadata(offsets=offs, sizes=obj.size()),
                    properties=TensorProperties.create_from_tensor(obj),
                    size=torch.Size(size),
                )
                self.items.append(
                    WriteItem(index=MetadataIndex(fqn, offs), type=WriteItemType.SHARD, tensor_data=write)
                )

        def set_up_planner(self, state_dict, storage_meta=None, is_coordinator=False):
            pass

        def create_local_plan(self):
            return SavePlan(self.items)

        def create_global_plan(self, all_plans):
            return create_default_global_save_plan(all_plans)

        def finish_plan(self, new_plan):
            return new_plan

        def resolve_data(self, write_item):
            off = write_item.index.offset
            obj = self.data[(write_item.index.fqn, None if off is None else tuple(off))]
            return io.BytesIO(obj) if isinstance(obj, bytes) else obj

    return RankPlanner


def _saved_bytes(obj: Any) -> bytes:
    buf = io.BytesIO()
    torch.save(obj, buf)
    return buf.getvalue()


def write_dcp(ckpt_dir: Path, ranks: list[list[tuple[str, tuple | None, Any, tuple | None]]], thread_count=2) -> None:
    """Write a torch.distributed.checkpoint folder as len(ranks) processes would, from one process.

    Each rank's entries are (key, global offsets or None for a byte object, tensor piece or bytes, global size).
    """
    from torch.distributed.checkpoint import FileSystemWriter

    planners = [_dcp_planner_class()(pieces) for pieces in ranks]
    writer = FileSystemWriter(ckpt_dir, thread_count=thread_count, sync_files=False)
    writer.set_up_storage_writer(True)
    local = [writer.prepare_local_plan(p.create_local_plan()) for p in planners]
    plans, metadata = planners[0].create_global_plan(local)
    plans = writer.prepare_global_plan(plans)
    results = []
    for planner, plan in zip(planners, plans):
        results.append(writer.write_data(planner.finish_plan(plan), planner).wait())
    writer.finish(metadata, results)


def write_torch_dist(
    hf_model_or_state: Any,
    hf_config: Any,
    dst: str | Path,
    *,
    tp: int = 1,
    te_names: bool = True,
    common_in_metadata: bool = False,
    iteration: int = 1,
    release: bool = False,
    padded_vocab_size: int | None = None,
    args_overrides: dict | None = None,
    thread_count: int = 2,
) -> Path:
    """Write a `--ckpt-format torch_dist` Megatron-LM checkpoint of an HF Llama/Qwen2 model into dst, or of a
    mixture-of-experts model (the keys megatron-core's SequentialMLP gives: `decoder.layers.mlp.router.weight`
    [L, E, h], `decoder.layers.mlp.experts.experts.linear_fc1.weight` [L, E, 2 Fe, h] and `...linear_fc2.weight`
    [L, E, h, Fe], `decoder.layers.mlp.shared_experts.*`; per layer, without the layer axis, `decoder.layers.{i}.*`
    when dense and MoE layers are mixed).

    tp: the number of tensor-parallel ranks whose shards are written (`__R_T.distcp` per rank R, thread T); the
    global tensors do not depend on it. te_names: the norms under `linear_qkv.layer_norm_weight` /
    `linear_fc1.layer_norm_weight`, as Megatron-LM writes them even for local layers (False: `input_layernorm` /
    `pre_mlp_layernorm`). common_in_metadata: the common state as the DCP byte entry `common_state/shard_0_1`
    (torch.save([common])) instead of `common.pt`. Returns the iteration folder.
    """
    dst = Path(dst)
    dm = _dims(hf_config)
    overrides = dict(args_overrides or {})
    overrides.setdefault("tensor_model_parallel_size", tp)
    overrides.setdefault("expert_tensor_parallel_size", tp)
    overrides.setdefault("ckpt_format", "torch_dist")
    overrides.setdefault("use_dist_ckpt", True)
    overrides.setdefault("iteration", iteration)
    if padded_vocab_size is not None:
        overrides.setdefault("padded_vocab_size", padded_vocab_size)
    args = megatron_args(hf_config, **overrides)
    if "model_type" not in overrides:
        del args.model_type  # Megatron-LM's torch_dist common state has no model_type field
    g = megatron_global(hf_model_or_state, hf_config, args.padded_vocab_size)
    tensors = dist_tensors(g, te_names=te_names)

    extra = _saved_bytes([None])
    common = {
        "args": args,
        "checkpoint_version": CHECKPOINT_VERSION,
        "iteration": iteration,
        "num_floating_point_operations_so_far": 0,
        "content_metadata": dict(CONTENT_METADATA),
    }
    ranks = []
    for t in range(tp):
        pieces = []
        for key, x in tensors.items():
            pieces += [(key, offs, piece, tuple(x.shape)) for offs, piece in _tp_chunks(key, x, t, tp, dm["L"])]
        if t == 0:
            pieces += [(key, None, extra, None) for key in _extra_state_keys(dm)]
            if common_in_metadata:
                pieces.append((COMMON_STATE_KEY, None, _saved_bytes([common]), None))
        ranks.append(pieces)

    _write_tracker(dst, iteration, release)
    it_dir = dst / _iter_dir(iteration, release)
    it_dir.mkdir(parents=True, exist_ok=True)
    write_dcp(it_dir, ranks, thread_count=thread_count)
    if not common_in_metadata:
        torch.save(common, it_dir / "common.pt")
    (it_dir / "metadata.json").write_text(json.dumps(METADATA_JSON))
    return it_dir


def randomise_weights(model: Any) -> Any:
    """Draw an HF model's weights for a test (in place): norms around 1 (so a misplaced norm shows in the outputs),
    every other weight N(0, 0.15), a router's score-correction bias N(0, 0.3). Returns the model, in eval mode."""
    with torch.no_grad():
        for name, p in model.named_parameters():
            if name.endswith("norm.weight"):
                p.copy_(1 + 0.2 * torch.randn_like(p))
            else:
                p.normal_(0, 0.15)
        for name, b in model.named_buffers():
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.3 * torch.randn_like(b))
    return model.eval()


def rename_dist_keys(folder: str | Path, local: str, te: str) -> int:
    """Replace `local` by `te` in the keys of the torch_dist checkpoint `folder` (its tracker's iteration), as a
    Transformer Engine layer spec names some tensors the local spec names otherwise; returns how many keys changed.
    The data files are untouched: DCP finds each chunk through `.metadata`."""
    import dataclasses
    import pickle

    tracked = (Path(folder) / TRACKER).read_text().strip()
    release = tracked == "release"
    meta_file = Path(folder) / _iter_dir(0 if release else int(tracked), release) / ".metadata"
    meta = pickle.loads(meta_file.read_bytes())
    renamed = {k: k.replace(local, te) for k in meta.state_dict_metadata if local in k}
    meta.state_dict_metadata = {renamed.get(k, k): v for k, v in meta.state_dict_metadata.items()}
    meta.storage_data = {dataclasses.replace(i, fqn=renamed.get(i.fqn, i.fqn)): v for i, v in meta.storage_data.items()}
    if isinstance(meta.planner_data, dict):
        meta.planner_data = {renamed.get(k, k): v for k, v in meta.planner_data.items()}
    meta_file.write_bytes(pickle.dumps(meta))
    return len(renamed)


__all__ = [
    "COMMON_STATE_KEY",
    "randomise_weights",
    "rename_dist_keys",
    "chunk_layers",
    "dist_tensors",
    "megatron_args",
    "megatron_global",
    "padded_vocab",
    "rank_folder",
    "write_dcp",
    "write_legacy",
    "write_torch_dist",
]
