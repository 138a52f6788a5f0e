"""Weight rows of one block of the patch towers the M-RoPE vision-language families share (Qwen2-VL, Qwen2.5-VL,
Qwen3-VL, GLM-4.1V/4.5V): transformers' ``blocks.{i}.*`` (under the family's tower prefix) <-> megatron-core's
``TransformerLayer`` (:func:`pai_zoo.mcore.patch_tower.tower_blocks`), one row per tensor.

==================================  =========================================================
transformers ``blocks.{i}.``         megatron-core ``blocks.{i}.``
==================================  =========================================================
``norm1.*``, ``norm2.*``             ``input_layernorm.*``, ``pre_mlp_layernorm.*``
``attn.qkv.*`` (``[q; k; v]``)        ``self_attention.linear_qkv.*`` (grouped per head)
``attn.proj.*``                      ``self_attention.linear_proj.*``
``mlp.{gate,up}_proj.*``, ``mlp.     ``mlp.linear_fc1.*`` (``[gate; up]``), ``mlp.linear_fc2.*``
down_proj.*`` (SwiGLU)
``mlp.<fc1>.*``, ``mlp.<fc2>.*``     ``mlp.linear_fc1.*``, ``mlp.linear_fc2.*``
==================================  =========================================================

No torch at import.
"""
from __future__ import annotations

from .rows import Copy, FusedQKV, GateUp

__all__ = ["patch_block_rows"]


def patch_block_rows(hf: str, mc: str, heads: tuple[int, int, int], *, norm_bias: bool, qkv_bias: bool,
                     proj_bias: bool, mlp_bias: bool, mlp_names: tuple[str, str] | None = None) -> list:
    """The rows of one tower block from ``hf`` (``<tower>blocks.{i}.``) to ``mc``. ``heads``: the tower's
    ``(heads, heads, head_dim)``; ``mlp_names``: the plain MLP's two linears (``("fc1", "fc2")``), or None for
    SwiGLU (``gate_proj``/``up_proj`` fused into ``linear_fc1``, ``down_proj``); each ``*_bias`` adds the biases."""
    def params(bias: bool) -> tuple[str, ...]:
        return ("weight", "bias") if bias else ("weight",)

    rows = [Copy(hf + f"{n}.{p}", mc + f"{m}.{p}") for n, m in (("norm1", "input_layernorm"),
                                                                ("norm2", "pre_mlp_layernorm"))
            for p in params(norm_bias)]
    rows += [FusedQKV(hf + f"attn.qkv.{p}", mc + f"self_attention.linear_qkv.{p}", heads=heads)
             for p in params(qkv_bias)]
    rows += [Copy(hf + f"attn.proj.{p}", mc + f"self_attention.linear_proj.{p}") for p in params(proj_bias)]
    if mlp_names is None:
        rows += [GateUp(hf + "mlp.{gate,up}_proj." + p, mc + "mlp.linear_fc1." + p) for p in params(mlp_bias)]
        rows += [Copy(hf + "mlp.down_proj." + p, mc + "mlp.linear_fc2." + p) for p in params(mlp_bias)]
    else:
        rows += [Copy(hf + f"mlp.{n}.{p}", mc + f"mlp.linear_{k}.{p}") for n, k in zip(mlp_names, ("fc1", "fc2"))
                 for p in params(mlp_bias)]
    return rows
