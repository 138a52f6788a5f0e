"""Weight-table rows and config rules shared by families whose Hugging Face checkpoints use the Llama
layout (``model.embed_tokens``, ``model.layers.N.{input_layernorm, self_attn, post_attention_layernorm,
mlp}``, ``model.norm``, ``lm_head``; config keys ``hidden_size``, ``num_key_value_heads``, ``rms_norm_eps``
...; a SwiGLU MLP and RMSNorm): Llama, Mistral, Qwen2/3, GLM-4, Baichuan; and their mixture-of-experts
members (Mixtral, Qwen2-MoE, Qwen3-MoE: :func:`moe_layout`, :func:`moe_config_rules`)."""
from __future__ import annotations

from typing import Any

from .config_map import REQUIRED, Field, Fixed, Rule
from .errors import ConfigTranslationError
from .mapping import QKV, Copy, GateUp, Output, Row, Vocab

#: Per-layer name prefixes: Hugging Face's Llama layout and megatron-core's GPT model.
HF_LAYER, MCORE_LAYER = "model.layers.{layer}.", "decoder.layers.{layer}."


def llama_layout(qkv: Row | None = None, fc1: Row | None = None, mlp: list[Row] | None = None) -> list[Row]:
    """The Llama layout's rows. ``qkv`` and ``fc1`` replace the rows of the fused attention input
    (default: separate ``q/k/v_proj``) and the MLP input (default: separate ``gate/up_proj``); ``mlp``
    replaces both MLP rows (a mixture of experts: :func:`moe_layout`)."""
    L, M = HF_LAYER, MCORE_LAYER
    rows = [
        Vocab("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
        Copy(L + "input_layernorm.weight", M + "input_layernorm.weight"),
        qkv or QKV(L + "self_attn.{q,k,v}_proj.weight", M + "self_attention.linear_qkv.weight"),
        Copy(L + "self_attn.o_proj.weight", M + "self_attention.linear_proj.weight"),
        Copy(L + "post_attention_layernorm.weight", M + "pre_mlp_layernorm.weight"),
        fc1 or GateUp(L + "mlp.{gate,up}_proj.weight", M + "mlp.linear_fc1.weight"),
        Copy(L + "mlp.down_proj.weight", M + "mlp.linear_fc2.weight"),
        Copy("model.norm.weight", "decoder.final_layernorm.weight"),
        Output("lm_head.weight", "output_layer.weight"),
    ]
    if mlp is not None:
        rows[5:7] = list(mlp)
    return rows


def moe_layout(
    prefix: str = "mlp.",
    router: str = "gate.weight",
    experts: str = "experts.{expert}.",
    gate_up: str = "{gate,up}_proj.weight",
    down: str = "down_proj.weight",
    shared: str | None = None,
    shared_gate: str | None = None,
) -> list[Row]:
    """The rows of a mixture-of-experts MLP in checkpoint (``save_pretrained``) names under
    ``model.layers.{layer}.`` + ``prefix``: the router ``router`` -> megatron's ``mlp.router.weight``; each
    routed expert ``experts`` (``{expert}`` is every expert) with its ``gate_up`` brace pair and ``down`` ->
    ``mlp.experts.local_experts.{expert}.linear_fc1/fc2.weight`` (``SequentialMLP``); a shared expert
    ``shared`` (its ``{gate,up}_proj`` and ``down_proj``) -> ``mlp.shared_experts.linear_fc1/fc2.weight``, and
    its sigmoid gate ``shared_gate`` -> ``mlp.shared_experts.gate_weight``.

    Qwen2/3-MoE keep the defaults; Mixtral is ``moe_layout("block_sparse_moe.", gate_up="{w1,w3}.weight",
    down="w2.weight")``."""
    L, M = HF_LAYER + prefix, MCORE_LAYER + "mlp."
    E = M + "experts.local_experts.{expert}."
    rows: list[Row] = [
        Copy(L + router, M + "router.weight"),
        GateUp(L + experts + gate_up, E + "linear_fc1.weight"),
        Copy(L + experts + down, E + "linear_fc2.weight"),
    ]
    if shared:
        rows += [
            GateUp(L + shared + "{gate,up}_proj.weight", M + "shared_experts.linear_fc1.weight"),
            Copy(L + shared + "down_proj.weight", M + "shared_experts.linear_fc2.weight"),
        ]
    if shared_gate:
        rows.append(Copy(L + shared_gate, M + "shared_experts.gate_weight"))
    return rows


class ExpertWidthIsFfnWidth(Rule):
    """Mixtral's experts are ``intermediate_size`` wide: megatron's ``moe_ffn_hidden_size`` is set to the
    ``ffn_hidden_size`` that the shape fields translate (megatron-core would default to it, with a warning).
    On the way back the two must agree (``intermediate_size`` is written once, by the shape field)."""

    hf_keys = ("intermediate_size",)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        arch["moe_ffn_hidden_size"] = hf["intermediate_size"]

    def to_hf(self, arch: dict, hf: dict) -> None:
        width = arch.get("moe_ffn_hidden_size", arch["ffn_hidden_size"])
        if width != arch["ffn_hidden_size"]:
            raise ConfigTranslationError(f"moe_ffn_hidden_size={width} != ffn_hidden_size="
                                         f"{arch['ffn_hidden_size']}: this family's experts are intermediate_size wide")

    def describe(self) -> str:
        return "intermediate_size -> moe_ffn_hidden_size (the experts' width, = ffn_hidden_size)"


#: megatron-core switches of a mixture of experts on the local spec: experts as ``SequentialMLP`` (no
#: grouped GEMM, so the CPU and every GPU run it), the ``alltoall`` dispatcher (expert parallelism), token drop off.
MOE_FIXED = {"moe_grouped_gemm": False, "moe_token_dispatcher_type": "alltoall", "moe_router_score_function": "softmax",
             "moe_router_load_balancing_type": "aux_loss"}


def moe_config_rules(
    experts: str = "num_experts",
    topk: str = "num_experts_per_tok",
    expert_ffn: str | None = "moe_intermediate_size",
    aux_loss: str = "router_aux_loss_coef",
    norm_topk: str | None = "norm_topk_prob",
    shared_ffn: str | None = None,
) -> list[Rule]:
    """Config rules of a softmax top-k router: the expert count, top-k, the experts' FFN width (``None``: the
    config's ``intermediate_size``, :class:`ExpertWidthIsFfnWidth`), the aux-loss coefficient, and the
    renormalisation of the top-k probabilities: ``norm_topk`` is the HF flag (True: softmax over the top-k
    logits, megatron's ``moe_router_pre_softmax=False``; False: top-k of the softmax over all experts,
    ``pre_softmax=True``);
    ``None``: always renormalised (Mixtral). ``shared_ffn``: a shared expert of that HF width, gated by a
    sigmoid (``moe_shared_expert_gate``)."""
    rules: list[Rule] = [
        Field(experts, "num_moe_experts"),
        Field(topk, "moe_router_topk"),
        Field(aux_loss, "moe_aux_loss_coeff", default=0.0),
    ]
    rules.append(Field(expert_ffn, "moe_ffn_hidden_size") if expert_ffn else ExpertWidthIsFfnWidth())
    if norm_topk:
        rules.append(Field(norm_topk, "moe_router_pre_softmax", default=False,
                           encode=lambda norm: not norm, decode=lambda pre_softmax: not pre_softmax))
    else:
        rules.append(Fixed(hf={}, mcore={"moe_router_pre_softmax": False}))
    if shared_ffn:
        rules += [Field(shared_ffn, "moe_shared_expert_intermediate_size"),
                  Fixed(hf={}, mcore={"moe_shared_expert_gate": True})]
    rules.append(Fixed(hf={}, mcore=dict(MOE_FIXED)))
    return rules


def qkv_bias(layer: str = HF_LAYER) -> Row:
    """The ``q/k/v_proj`` biases into ``linear_qkv.bias``."""
    return QKV(layer + "self_attn.{q,k,v}_proj.bias", MCORE_LAYER + "self_attention.linear_qkv.bias")


#: megatron-core's SwiGLU MLP and RMSNorm, as the Llama layout's families have them.
SWIGLU_RMSNORM = {"gated_linear_unit": True, "activation_func": "silu", "normalization": "RMSNorm"}


def llama_megatron_args(**values: Any) -> tuple[dict[str, Any], ...]:
    """A :attr:`Family.megatron_args` claim of the Llama layout: SwiGLU, RMSNorm, RoPE, no linear biases,
    no q/k norms, changed by ``values`` (``add_qkv_bias=True`` for Qwen2)."""
    claim = {**SWIGLU_RMSNORM, "position_embedding_type": "rope", "add_bias_linear": False, "add_qkv_bias": False,
             "qk_layernorm": False, "layernorm_zero_centered_gamma": False}
    return ({**claim, **values},)


def llama_config_rules(
    *family_rules: Rule,
    gqa: bool = True,
    head_dim: Any = REQUIRED,
    max_positions: bool = True,
    tie_default: Any = REQUIRED,
    hf_fixed: dict[str, Any] | None = None,
    mcore_fixed: dict[str, Any] | None = None,
) -> list[Rule]:
    """The Llama layout's config rules: the shape fields, then ``family_rules``, then one :class:`Fixed`
    (``hidden_act`` silu -> :data:`SWIGLU_RMSNORM`, plus ``hf_fixed`` / ``mcore_fixed``).

    ``gqa=False`` leaves out ``num_key_value_heads`` and ``head_dim`` (a config without either);
    ``head_dim`` and ``tie_default`` are the defaults of ``head_dim`` and ``tie_word_embeddings``
    (:data:`REQUIRED`: the key must be there); ``max_positions=False`` leaves ``max_position_embeddings``
    to a family rule."""
    rules: list[Rule] = [
        Field("vocab_size", "vocab_size"),
        Field("hidden_size", "hidden_size"),
        Field("intermediate_size", "ffn_hidden_size"),
        Field("num_hidden_layers", "num_layers"),
        Field("num_attention_heads", "num_attention_heads"),
    ]
    if gqa:
        rules += [Field("num_key_value_heads", "num_query_groups"), Field("head_dim", "kv_channels", default=head_dim)]
    if max_positions:
        rules.append(Field("max_position_embeddings", "max_sequence_length"))
    rules += [
        Field("rms_norm_eps", "layernorm_epsilon"),
        Field("tie_word_embeddings", "share_embeddings_and_output_weights", default=tie_default),
        *family_rules,
        Fixed(hf={"hidden_act": "silu", **(hf_fixed or {})}, mcore={**SWIGLU_RMSNORM, **(mcore_fixed or {})}),
    ]
    return rules
