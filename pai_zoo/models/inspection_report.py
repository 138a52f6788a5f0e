"""The report of ``inspect`` (:class:`Inspection`) and its shared lines, for :mod:`.inspection` and
:mod:`.inspection_fast`."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..plugin.megatron_args import shown

#: The architecture fields shown, in megatron-core's names.
SHOWN = ("num_layers", "hidden_size", "ffn_hidden_size", "num_attention_heads", "num_query_groups", "kv_channels",
         "vocab_size", "max_sequence_length", "normalization", "layernorm_epsilon", "gated_linear_unit",
         "activation_func", "add_qkv_bias", "add_bias_linear", "qk_layernorm", "position_embedding_type",
         "rotary_base", "rotary_percent", "share_embeddings_and_output_weights",
         # a mixture of experts
         "num_moe_experts", "moe_router_topk", "moe_ffn_hidden_size", "moe_router_score_function",
         "moe_router_pre_softmax", "moe_router_num_groups", "moe_router_group_topk", "moe_router_topk_scaling_factor",
         "moe_router_enable_expert_bias", "moe_shared_expert_intermediate_size", "moe_shared_expert_gate",
         "moe_layer_freq",
         # multi-token prediction
         "mtp_num_layers",
         # Gated DeltaNet linear attention and the gated full attention (Qwen3-Next, Qwen3.5)
         "linear_num_key_heads", "linear_num_value_heads", "linear_key_head_dim", "linear_value_head_dim",
         "linear_conv_kernel_dim", "attention_output_gate",
         # Mamba-2 mixers (Nemotron-H)
         "mamba_num_heads", "mamba_head_dim", "mamba_state_dim", "mamba_num_groups",
         # DeepSeek sparse attention's indexer (DeepSeek-V3.2, GLM-5)
         "dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk")


@dataclass
class Inspection:
    """The answer of :func:`inspect_checkpoint`, as lines for the CLI (:meth:`lines`)."""

    path: Path
    format: str
    family: str
    parameters: int
    dtype: str
    iteration: object = None
    layout: dict = field(default_factory=dict)
    architecture: dict = field(default_factory=dict)
    needs: list[str] = field(default_factory=list)  # what a conversion needs, or has to assume
    quantization: str | None = None  # how the stored weights are quantized (an FP8 block-scaled HF folder)
    mtp: str | None = None  # the multi-token-prediction layers the folder holds
    vision: str | None = None  # a vision-language model's tower: its parameters and what it reads
    verified: str | None = None  # what the file checks found (integrity.Verified.line)
    tokenizer: str | None = None  # the tokenizer and whether it fits the config
    layers: str | None = None  # the layer kinds of a hybrid model (pai_zoo.tables.layer_kinds.layers_line)

    def lines(self) -> list[str]:
        out = [f"checkpoint:   {self.path}", f"format:       {self.format}"]
        if self.iteration is not None:
            out.append(f"iteration:    {self.iteration}")
        if self.layout:
            out.append("layout:       " + ", ".join(f"{k.replace('_', ' ')} {v}" for k, v in self.layout.items()
                                                     if v is not None))
        out += [f"family:       {self.family}", f"parameters:   {self.parameters:,} ({self.dtype})"]
        if self.quantization:
            out.append(f"quantization: {self.quantization}")
        if self.mtp:
            out.append(f"MTP layers:   {self.mtp}")
        if self.vision:
            out.append(f"vision:       {self.vision}")
        if self.verified:
            out.append(f"files:        {self.verified}")
        if self.tokenizer:
            out.append(f"tokenizer:    {self.tokenizer}")
        if self.layers:
            out.append(f"layers:       {self.layers}")
        out.append("architecture:")
        out += [f"  {k:<36} {v}" for k, v in self.architecture.items()]
        out += ["conversion:"] + [f"  {n}" for n in (self.needs or ["needs nothing more"])]
        return out


def _architecture(arch: dict) -> dict:
    derived = ("kv_channels", "num_query_groups")  # absent means a value computed from the others
    return {k: shown(arch, k) for k in SHOWN if k in arch or k in derived}


def _vision_line(family, tower: int, projector: int) -> str:
    spec = family.vision
    return (f"{', '.join(spec.modalities)}: a tower of {tower:,} parameters (projector {projector:,}) on the first "
            "pipeline stage; TP splits its attention heads and MLP, the patch embedding and projector are "
            "replicated")
