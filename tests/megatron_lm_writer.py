"""A test-side generator of NVIDIA Megatron-LM checkpoint folders, from a Hugging Face Llama/Qwen2 model.

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
"""

from __future__ import annotations

import argparse
import io
import json
import random
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
        "qkv_bias": bool(c.get("attention_bias", model_type in ("qwen2", "qwen2_moe"))),
        "qk_norm": model_type in ("qwen3",),
        "max_pos": c.get("max_position_embeddings", 4096),
        "dtype": c.get("dtype") or c.get("torch_dtype") or "float32",
    }


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
        "num_experts": None,
        "moe_ffn_hidden_size": None,
        "moe_router_topk": 2,
        "moe_shared_expert_intermediate_size": None,
        "moe_layer_freq": 1,
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
        "expert_tensor_parallel_size": 1,
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
    proj, pre_mlp_norm, fc1, fc2.
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
            "fc1": torch.cat([sd[m + "gate_proj.weight"], sd[m + "up_proj.weight"]], dim=0),
            "fc2": sd[m + "down_proj.weight"].clone(),
        }
        if a + "q_proj.bias" in sd:
            layer["qkv_bias"] = group_qkv(sd[a + "q_proj.bias"], sd[a + "k_proj.bias"], sd[a + "v_proj.bias"])
        if a + "q_norm.weight" in sd:
            layer["q_norm"] = sd[a + "q_norm.weight"].clone()
            layer["k_norm"] = sd[a + "k_norm.weight"].clone()
        out["layers"].append(layer)
    return out


def _tp_layer(layer: dict, t: int, tp: int, ng: int) -> dict:
    """Tensor-parallel rank t's shard of one layer's tensors."""
    if ng % tp:
        raise ValueError(f"num_query_groups {ng} is not divisible by tp {tp}")

    def by_groups(x: torch.Tensor) -> torch.Tensor:  # rows split by whole query groups
        g = x.reshape(ng, -1, *x.shape[1:])
        return g.chunk(tp, dim=0)[t].reshape(-1, *x.shape[1:]).contiguous()

    gate, up = layer["fc1"].chunk(2, dim=0)
    out = {
        "input_norm": layer["input_norm"].clone(),
        "qkv": by_groups(layer["qkv"]),
        "proj": layer["proj"].chunk(tp, dim=1)[t].contiguous(),
        "pre_mlp_norm": layer["pre_mlp_norm"].clone(),
        "fc1": torch.cat([gate.chunk(tp, dim=0)[t], up.chunk(tp, dim=0)[t]], dim=0),
        "fc2": layer["fc2"].chunk(tp, dim=1)[t].contiguous(),
    }
    if "qkv_bias" in layer:
        out["qkv_bias"] = by_groups(layer["qkv_bias"])
    for k in ("q_norm", "k_norm"):
        if k in layer:
            out[k] = layer[k].clone()
    return out


def _layer_keys(prefix: str, sh: dict, te_names: bool) -> list[tuple[str, Any]]:
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
    g: dict, layers: list[int], *, t: int, tp: int, ng: int, pre: bool, post: bool, te_names: bool, tied: bool
) -> OrderedDict:
    """The model state dict of one model chunk: the given global layers, numbered from 0."""
    sd: OrderedDict = OrderedDict()
    if pre:
        sd["embedding.word_embeddings.weight"] = g["embedding"].chunk(tp, dim=0)[t].clone()
    for local, i in enumerate(layers):
        sd.update(_layer_keys(f"decoder.layers.{local}.", _tp_layer(g["layers"][i], t, tp, ng), te_names))
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
    te_names: bool = False,
    iteration: int = 1,
    release: bool = False,
    with_rng: bool = True,
    with_optimizer: bool = False,
    padded_vocab_size: int | None = None,
    args_overrides: dict | None = None,
) -> Path:
    """Write a legacy (`--ckpt-format torch`) Megatron-LM checkpoint of an HF Llama/Qwen2 model into dst.

    Returns the iteration folder. See the module docstring for the layout.
    """
    dst = Path(dst)
    dm = _dims(hf_config)
    overrides = dict(args_overrides or {})
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
                    )
                )
            for e in range(ep):
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
    """The global torch_dist tensors (layers stacked along dim 0), in the order Megatron-LM's .metadata lists them."""
    layers = g["layers"]

    def stack(k: str) -> torch.Tensor:
        return torch.stack([lay[k] for lay in layers]).contiguous()

    sa, mlp = "decoder.layers.self_attention.", "decoder.layers.mlp."
    in_norm = sa + "linear_qkv.layer_norm_weight" if te_names else "decoder.layers.input_layernorm.weight"
    mlp_norm = mlp + "linear_fc1.layer_norm_weight" if te_names else "decoder.layers.pre_mlp_layernorm.weight"
    out = {"embedding.word_embeddings.weight": g["embedding"], in_norm: stack("input_norm")}
    out[sa + "linear_proj.weight"] = stack("proj")
    out[sa + "linear_qkv.weight"] = stack("qkv")
    if "qkv_bias" in layers[0]:
        out[sa + "linear_qkv.bias"] = stack("qkv_bias")
    if "q_norm" in layers[0]:
        out[sa + "q_layernorm.weight"] = stack("q_norm")
        out[sa + "k_layernorm.weight"] = stack("k_norm")
    out[mlp_norm] = stack("pre_mlp_norm")
    out[mlp + "linear_fc1.weight"] = stack("fc1")
    out[mlp + "linear_fc2.weight"] = stack("fc2")
    out["decoder.final_layernorm.weight"] = g["final_norm"]
    if g["output"] is not None:
        out["output_layer.weight"] = g["output"]
    return out


def _tp_chunks(key: str, x: torch.Tensor, t: int, tp: int, num_layers: int) -> list[tuple[tuple, torch.Tensor]]:
    """(global offsets, tensor) of the pieces tensor-parallel rank t writes of global tensor `key`.

    Stacked layer tensors are written one layer at a time, as Megatron's ShardedTensors with a prepended layer axis.
    Replicated tensors are written by rank 0 only.
    """

    def piece(offsets: list[int], sl: tuple) -> tuple[tuple, torch.Tensor]:
        return tuple(offsets), x[sl].clone()

    if not key.startswith("decoder.layers."):
        if key.endswith("final_layernorm.weight"):
            return [piece([0], (slice(None),))] if t == 0 else []
        rows = x.shape[0] // tp  # embedding / output layer: vocabulary rows
        return [piece([t * rows, 0], (slice(t * rows, (t + 1) * rows),))]
    out = []
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
    """Write a `--ckpt-format torch_dist` Megatron-LM checkpoint of an HF Llama/Qwen2 model into dst.

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
            for layer in range(dm["L"]):
                for lin in LAYER_LINEARS:
                    pieces.append((f"decoder.layers.{lin}._extra_state/shard_{layer}_{dm['L']}", None, extra, None))
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


__all__ = [
    "COMMON_STATE_KEY",
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
