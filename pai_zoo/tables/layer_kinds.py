"""Each decoder layer's parts and their parameters and state, per kind, for ``pai-zoo train --plan`` (no torch).

A layer of a GPT model is attention + MLP. Hybrid models mix other kinds:

* **Gated DeltaNet** linear attention (megatron-core's ``experimental_attention_variant: gated_delta_net``, the
  layers flagged 1 in ``linear_attention_freq``): ``in_proj`` (q, k, v, the output gate z, beta and alpha),
  the depthwise causal ``conv1d`` over q, k and v, ``dt_bias`` and ``A_log`` per value head, the gated ``out_norm``
  (one value head wide, replicated) and ``out_proj``; everything but ``out_norm`` split over TP by heads. Its state
  is a ``[value heads, key dim, value dim]`` matrix per sequence and the conv's last ``kernel - 1`` inputs.
* **Mamba-2** mixers (``M`` in :data:`pai_zoo.plugin.hybrid.HYBRID_PATTERN`): ``in_proj`` (z, x, B, C, dt),
  ``conv1d`` over x, B and C, ``A_log``, ``D`` and ``dt_bias`` per head, the gated norm over the inner width and
  ``out_proj``; split over TP by heads and groups. Its state is ``[heads, head dim, state dim]`` per sequence plus
  the conv's last inputs.
* attention-only (``*``) and MLP-only (``-``) layers of a hybrid pattern, and the gated full attention
  (``attention_output_gate``: the query projection also gives one gate per query channel).
"""
from __future__ import annotations

from ..plugin.hybrid import CHUNK_SIZE, CONV_BIAS, CONV_KERNEL, HYBRID_PATTERN

__all__ = ["layer_parts", "layer_parameter_counts", "layers_line", "recurrent_state_bytes"]


def _norm(a: dict, width: int) -> int:
    return width * (2 if a.get("normalization", "LayerNorm") == "LayerNorm" else 1)


def layer_parts(config) -> list[tuple[str, ...]]:
    """Each layer's parts: ``("attention", "mlp")`` for a GPT layer, ``("linear_attention", "mlp")`` for a Gated
    DeltaNet one, ``("mamba",)``, ``("attention",)``, ``("mlp",)`` or ``("moe",)`` for a hybrid pattern's.
    ``config``: an :class:`~pai_zoo.plugin.config_map.McoreConfig` or its ``arch`` dict."""
    a = getattr(config, "arch", config)
    n = int(a["num_layers"])
    pattern = a.get(HYBRID_PATTERN)
    if pattern:
        kinds = {"M": ("mamba",), "*": ("attention",), "-": ("mlp",), "E": ("moe",)}
        return [kinds[c] for c in str(pattern).replace("|", "")[:n]]
    flags = a.get("linear_attention_freq") if a.get("experimental_attention_variant") == "gated_delta_net" else None
    if isinstance(flags, int):
        flags = [0 if (i + 1) % flags == 0 else 1 for i in range(n)]
    return [("linear_attention" if flags and flags[i] else "attention", "mlp") for i in range(n)]


def _attention(config, tp: int) -> int:
    a = config.arch
    h, heads, groups, kv = a["hidden_size"], config.num_attention_heads, config.num_query_groups, config.kv_channels
    bias = bool(a.get("add_bias_linear", True))
    qkv_bias = bool(a.get("add_qkv_bias", bias))
    qkv_rows = kv * ((2 if a.get("attention_output_gate") else 1) * heads + 2 * groups)
    count = _norm(a, h) + (h * qkv_rows + (qkv_rows if qkv_bias else 0)) // tp
    count += heads * kv * h // tp + (h if bias else 0)
    if a.get("qk_layernorm"):
        count += 2 * _norm(a, kv)
    return count


def _mlp(config, tp: int) -> int:
    a = config.arch
    h = a["hidden_size"]
    ffn = a.get("ffn_hidden_size") or 4 * h
    bias = bool(a.get("add_bias_linear", True))
    glu = 2 if a.get("gated_linear_unit") else 1
    return _norm(a, h) + (h * ffn * glu + (ffn * glu if bias else 0)) // tp + ffn * h // tp + (h if bias else 0)


def _linear_attention(config, tp: int) -> int:
    a = config.arch
    h = a["hidden_size"]
    dk, dv = a.get("linear_key_head_dim", 128), a.get("linear_value_head_dim", 128)
    nk, nv = a.get("linear_num_key_heads", 16), a.get("linear_num_value_heads", 32)
    qk, v = dk * nk, dv * nv
    conv = (2 * qk + v) * a.get("linear_conv_kernel_dim", 4)
    return _norm(a, h) + (h * (2 * qk + 2 * v + 2 * nv) + conv + 2 * nv + v * h) // tp + _norm(a, dv)


def _mamba_dims(a: dict) -> tuple[int, int, int, int, int]:
    """(heads, head dim, groups, state dim, inner width) of a Mamba-2 mixer."""
    head_dim, groups, state = a.get("mamba_head_dim", 64), a.get("mamba_num_groups", 8), a.get("mamba_state_dim", 128)
    heads = a.get("mamba_num_heads") or 2 * a["hidden_size"] // head_dim
    return heads, head_dim, groups, state, heads * head_dim


def _mamba(config, tp: int) -> int:
    a = config.arch
    h = a["hidden_size"]
    heads, _, groups, state, inner = _mamba_dims(a)
    conv_dim = inner + 2 * groups * state
    kernel = a.get(CONV_KERNEL) or 4
    conv_bias = conv_dim if a.get(CONV_BIAS, True) else 0
    in_proj = h * (2 * inner + 2 * groups * state + heads)
    return _norm(a, h) + (in_proj + conv_dim * kernel + conv_bias + 3 * heads + inner + inner * h) // tp


def layer_parameter_counts(config, tp: int = 1, moe: int | None = None) -> list[int]:
    """Each layer's parameters on one tensor-parallel rank, by its parts (:func:`layer_parts`); ``moe``: what a
    mixture-of-experts part counts (``None``: the dense MLP's count)."""
    count = {"attention": _attention, "linear_attention": _linear_attention, "mamba": _mamba, "mlp": _mlp}
    return [sum(moe if part == "moe" and moe is not None else count.get(part, _mlp)(config, tp) for part in parts)
            for parts in layer_parts(config)]


def recurrent_state_bytes(config, tp: int = 1, sequence_length: int = 0, batch: int = 1) -> tuple[float, float]:
    """``(inference, training)`` bytes of the recurrent layers' state on one TP rank, in fp32: the state a generation
    keeps per sequence (delta-rule or SSM state plus the conv's last ``kernel - 1`` inputs, every recurrent layer), and
    what a training step's chunked kernels keep for the backward pass of ``batch`` sequences of ``sequence_length``
    (one state per chunk of 64 tokens, every recurrent layer). ``(0, 0)`` for a model without recurrent layers."""
    a = config.arch
    inference = chunks = 0
    per_chunk = max(1, -(-sequence_length // int(a.get(CHUNK_SIZE) or 64))) if sequence_length else 0
    for parts in layer_parts(config):
        if "linear_attention" in parts:
            dk, dv = a.get("linear_key_head_dim", 128), a.get("linear_value_head_dim", 128)
            nk, nv = a.get("linear_num_key_heads", 16), a.get("linear_num_value_heads", 32)
            state = nv * dk * dv
            conv = (2 * dk * nk + dv * nv) * (a.get("linear_conv_kernel_dim", 4) - 1)
        elif "mamba" in parts:
            heads, head_dim, groups, dstate, inner = _mamba_dims(a)
            state = heads * head_dim * dstate
            conv = (inner + 2 * groups * dstate) * ((a.get(CONV_KERNEL) or 4) - 1)
        else:
            continue
        inference += 4 * (state + conv) / tp
        chunks += 4 * state * per_chunk * batch / tp
    return inference, chunks


#: how :func:`layers_line` names each kind of layer
_NAMES = {("attention", "mlp"): "attention", ("linear_attention", "mlp"): "Gated DeltaNet", ("mamba",): "Mamba-2",
          ("attention",): "attention only", ("mlp",): "MLP only", ("moe",): "MoE only"}


def layers_line(arch: dict) -> str | None:
    """``inspect``'s line for a model whose layers are not all alike: each kind and how many, and the order
    (``"Gated DeltaNet x3, attention x1: LLLA"``); ``None`` when every layer is a GPT layer. Sparse attention
    (``dsa``) says so on every attention layer."""
    parts = layer_parts(arch)
    sparse = arch.get("experimental_attention_variant") == "dsa" or bool(arch.get("dsa_indexer_topk"))
    if all(p == ("attention", "mlp") for p in parts) and not sparse:
        return None
    counts: dict[str, int] = {}
    for p in parts:
        counts[_NAMES[p]] = counts.get(_NAMES[p], 0) + 1
    line = ", ".join(f"{name} x{n}" for name, n in counts.items())
    if arch.get(HYBRID_PATTERN):
        return f"{line}: pattern {arch[HYBRID_PATTERN]} (M Mamba-2, * attention, - MLP, E MoE)"
    if sparse:  # pai-zoo's DSA families keep megatron-core's dsa_indexer_* without the variant (their own modules)
        return f"{line}, with DeepSeek sparse attention (an indexer picks {arch.get('dsa_indexer_topk')} keys)"
    order = "".join("L" if p[0] == "linear_attention" else "A" for p in parts)
    return f"{line}: {order} (L Gated DeltaNet, A attention{', gated' if arch.get('attention_output_gate') else ''})"
