"""Model FLOPs per token and accelerator peaks, for the model FLOPs utilisation (MFU) in logs and benchmarks."""
from __future__ import annotations

import torch

from ..plugin.config_map import McoreConfig

#: Dense peak FLOP/s per device by name fragment and dtype (vendor data sheets, without sparsity).
PEAK_FLOPS = {
    "H200": {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12},
    "H100": {torch.bfloat16: 989e12, torch.float16: 989e12, torch.float32: 67e12},
    "A100": {torch.bfloat16: 312e12, torch.float16: 312e12, torch.float32: 19.5e12},
}


def peak_flops(device_name: str, dtype: torch.dtype) -> float | None:
    for fragment, peaks in PEAK_FLOPS.items():
        if fragment in device_name:
            return peaks.get(dtype)
    return None


def model_flops_per_token(config: McoreConfig, sequence_length: int) -> float:
    """Training FLOPs per token (forward + backward = 3x forward): 6 x the matmul parameters
    plus causal attention scores and values, as in Megatron-LM's MFU accounting."""
    a = config.arch
    h, layers = a["hidden_size"], a["num_layers"]
    heads, groups, kv = a["num_attention_heads"], config.num_query_groups, config.kv_channels
    ffn = a.get("ffn_hidden_size") or 4 * h
    glu = 3 if a.get("gated_linear_unit") else 2
    attn = h * kv * (heads + 2 * groups) + heads * kv * h
    mlp = glu * h * ffn
    vocab = a["vocab_size"] * h
    matmul_params = layers * (attn + mlp) + vocab
    attention = layers * 2 * heads * kv * sequence_length  # QK^T and AV per token, causal half of 2x
    return 6 * matmul_params + 6 * attention
