"""pai-zoo plugin for Qwen: three families.

* ``qwen``  - Qwen (v1), ``QWenLMHeadModel`` (remote code upstream; a reference model ships in this plugin).
* ``qwen2`` - Qwen1.5, Qwen2 and Qwen2.5, transformers' ``Qwen2ForCausalLM``.
* ``qwen3`` - Qwen3 dense, transformers' ``Qwen3ForCausalLM``.
* ``qwen2-moe`` - Qwen1.5-MoE and Qwen2-MoE, ``Qwen2MoeForCausalLM``: routed experts plus a gated shared expert.
* ``qwen3-moe`` - Qwen3-MoE, ``Qwen3MoeForCausalLM``: routed experts, per-head q/k norms.
* ``qwen3_5`` / ``qwen3_5_moe`` - the Qwen3.5 language models, ``Qwen3_5ForCausalLM`` / ``Qwen3_5MoeForCausalLM``:
  Gated DeltaNet and gated attention layers (:mod:`.qwen3_5`).
"""
from __future__ import annotations

from pai_zoo import (
    ConfigMap,
    ConfigTranslationError,
    Copy,
    Family,
    Field,
    Fixed,
    FusedQKV,
    GateUp,
    Output,
    Require,
    Rope,
    Vocab,
    WeightMap,
    hookimpl,
)
from pai_zoo.config_map import Rule, sliding_window
from pai_zoo.family import LazyClass
from pai_zoo.layouts import (
    HF_LAYER,
    MCORE_LAYER,
    SWIGLU_RMSNORM,
    SparseStep,
    llama_config_rules,
    llama_layout,
    llama_megatron_args,
    moe_config_rules,
    moe_layout,
    moe_megatron_args,
    qkv_bias,
)

from .presets import QWEN2_MOE_PRESETS, QWEN2_PRESETS, QWEN3_MOE_PRESETS, QWEN3_PRESETS, QWEN_V1_PRESETS
from .tokenizer_files import write_qwen2_tokenizer, write_qwen_tiktoken_tokenizer


class LayerWindows(Rule):
    """Qwen2/Qwen3 sliding windows: transformers' per-layer ``layer_types`` (``"sliding_attention"`` for layers
    from ``max_window_layers`` on when ``use_sliding_window``) and ``sliding_window`` <-> megatron's
    ``window_size`` ``(w - 1, 0)`` and per-layer ``window_attn_skip_freq`` (1 = sliding, 0 = full).

    ``use_sliding_window`` and ``max_window_layers`` only decide ``layer_types`` (transformers derives it from
    them), so they travel unchanged as passthrough keys.
    """

    hf_keys = ("sliding_window", "layer_types")
    KINDS = {"full_attention": 0, "sliding_attention": 1}

    def to_mcore(self, hf: dict, arch: dict) -> None:
        layers = hf["num_hidden_layers"]
        types = hf.get("layer_types") or ["full_attention"] * layers
        unknown = sorted(set(types) - set(self.KINDS))
        if unknown:
            raise ConfigTranslationError(
                f"layer_types {unknown} are not supported by megatron-core (only {sorted(self.KINDS)})"
            )
        if len(types) != layers:
            raise ConfigTranslationError(f"layer_types has {len(types)} entries for {layers} layers")
        sliding = [self.KINDS[t] for t in types]
        window = hf.get("sliding_window")
        if window is None:
            if any(sliding):
                raise ConfigTranslationError("layer_types has sliding_attention layers but sliding_window is null")
            return
        arch["window_size"] = [int(window) - 1, 0]
        if not all(sliding):
            arch["window_attn_skip_freq"] = sliding

    def to_hf(self, arch: dict, hf: dict) -> None:
        layers = arch["num_layers"]
        window = arch.get("window_size")
        if window is None:
            hf["sliding_window"], hf["layer_types"] = None, ["full_attention"] * layers
            return
        if list(window)[1] != 0:
            raise ConfigTranslationError(f"window_size={window}: Qwen's sliding window looks back only")
        pattern = arch.get("window_attn_skip_freq")
        if pattern is None:
            pattern = [1] * layers
        elif not isinstance(pattern, list):
            raise ConfigTranslationError(
                f"window_attn_skip_freq={pattern!r}: only a per-layer list maps to Qwen's layer_types"
            )
        names = {v: k for k, v in self.KINDS.items()}
        hf["sliding_window"], hf["layer_types"] = int(window[0]) + 1, [names[int(p)] for p in pattern]

    def describe(self) -> str:
        return "sliding_window, layer_types -> window_size, window_attn_skip_freq (per layer)"


_QWEN2_RULES = (Field("attention_dropout", "attention_dropout", default=0.0), LayerWindows(), Rope())

QWEN2_CONFIG = ConfigMap(
    # Qwen2Config declares no head_dim, but transformers' Qwen2 attention and rotary embedding read one from
    # config.json when it is there (else hidden_size // num_attention_heads; megatron's kv_channels=None).
    *llama_config_rules(*_QWEN2_RULES, head_dim=None, mcore_fixed={"add_qkv_bias": True, "add_bias_linear": False}),
    passthrough=("use_sliding_window", "max_window_layers", "use_mrope"),
)

QWEN3_CONFIG = ConfigMap(
    # attention_bias would also put a bias on o_proj, which megatron-core ties to MLP biases Qwen3 lacks.
    *llama_config_rules(*_QWEN2_RULES, hf_fixed={"attention_bias": False},
                        mcore_fixed={"add_qkv_bias": False, "add_bias_linear": False, "qk_layernorm": True}),
    passthrough=("use_sliding_window", "max_window_layers"),
)

L, M = HF_LAYER, MCORE_LAYER


def _attention_rows(config) -> list:
    """Qwen2's QKV bias or Qwen3's per-head q/k norms, as the config has them."""
    rows = [qkv_bias()] if config.get("add_qkv_bias") else []
    if config.get("qk_layernorm"):
        rows += [
            Copy(L + "self_attn.q_norm.weight", M + "self_attention.q_layernorm.weight"),
            Copy(L + "self_attn.k_norm.weight", M + "self_attention.k_layernorm.weight"),
        ]
    return rows


def qwen2_weights(config) -> WeightMap:
    """Qwen2's table (QKV bias); Qwen3's adds the per-head q/k norms and has no QKV bias."""
    return WeightMap(*llama_layout(), *_attention_rows(config))


# -- Qwen2-MoE, Qwen3-MoE ---------------------------------------------------------------------------------------
class FullAttentionOnly(Rule):
    """Qwen2-MoE without sliding windows (as its published checkpoints): ``use_sliding_window`` false, every
    ``layer_types`` entry ``full_attention``; transformers then sets ``sliding_window`` to 0, written back so.
    ``max_window_layers`` only matters with sliding windows (a passthrough key)."""

    hf_keys = ("use_sliding_window", "sliding_window", "layer_types")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        types = hf.get("layer_types") or []
        if hf.get("use_sliding_window") or any(t != "full_attention" for t in types):
            raise ConfigTranslationError("Qwen2-MoE with sliding windows (use_sliding_window) is not supported")

    def to_hf(self, arch: dict, hf: dict) -> None:
        if arch.get("window_size") is not None:
            raise ConfigTranslationError(f"window_size={arch['window_size']}: Qwen2-MoE here has no sliding windows")
        hf["use_sliding_window"], hf["sliding_window"] = False, 0
        hf["layer_types"] = ["full_attention"] * arch["num_layers"]

    def describe(self) -> str:
        return "use_sliding_window false, layer_types all full_attention (no window)"


QWEN2_MOE_CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        Field("qkv_bias", "add_qkv_bias", default=True),
        FullAttentionOnly(),
        Rope(),
        # dense layers among the MoE layers: decoder_sparse_step, mlp_only_layers -> moe_layer_freq.
        *moe_config_rules(shared_ffn="shared_expert_intermediate_size", dense_layers=SparseStep()),
        head_dim=None,
        mcore_fixed={"add_bias_linear": False},
    ),
    # max_window_layers: only with sliding windows (refused); output_router_logits: whether transformers returns
    # the router logits (and adds its aux loss), no effect on the logits.
    passthrough=("max_window_layers", "output_router_logits"),
)

QWEN3_MOE_CONFIG = ConfigMap(
    *llama_config_rules(
        Field("attention_dropout", "attention_dropout", default=0.0),
        sliding_window(),
        Rope(),
        # transformers 5 calls num_experts num_local_experts (config.json may hold either; attribute_map).
        *moe_config_rules("num_local_experts", dense_layers=SparseStep()),
        # Qwen3MoeConfig declares no head_dim; its attention reads one from config.json when it is there.
        head_dim=None,
        hf_fixed={"attention_bias": False},
        mcore_fixed={"add_qkv_bias": False, "add_bias_linear": False, "qk_layernorm": True},
    ),
    # use_sliding_window only decides sliding_window (transformers sets it to None when false), which applies
    # to every layer; max_window_layers is unused by Qwen3-MoE's modeling code.
    passthrough=("use_sliding_window", "max_window_layers", "output_router_logits"),
)


def qwen_moe_weights(config) -> WeightMap:
    """Qwen2/3-MoE: per-expert ``mlp.experts.{e}.{gate,up,down}_proj`` and the router ``mlp.gate``; Qwen2-MoE
    adds the shared expert and its sigmoid gate, Qwen2 the QKV bias, Qwen3 the q/k norms."""
    shared = config.get("moe_shared_expert_intermediate_size")
    rows = llama_layout(mlp=moe_layout(shared="shared_expert." if shared else None,
                                       shared_gate="shared_expert_gate.weight" if shared else None))
    return WeightMap(*rows, *_attention_rows(config))


# -- Qwen (v1) ----------------------------------------------------------------------------------------------
def _halve(size: int) -> int:
    if size % 2:
        raise ConfigTranslationError(
            f"intermediate_size={size}: Qwen's MLP width is intermediate_size // 2, so it must be even"
        )
    return size // 2


QWEN_V1_CONFIG = ConfigMap(
    Field("vocab_size", "vocab_size"),
    Field("hidden_size", "hidden_size"),
    # QWenMLP's w1, w2 are Linear(hidden, intermediate_size // 2): the config holds twice the real width.
    Field("intermediate_size", "ffn_hidden_size", encode=_halve, decode=lambda width: 2 * width),
    Field("num_hidden_layers", "num_layers"),
    Field("num_attention_heads", "num_attention_heads"),
    Field("kv_channels", "kv_channels"),
    Field("seq_length", "max_sequence_length"),
    Field("layer_norm_epsilon", "layernorm_epsilon"),
    Field("tie_word_embeddings", "share_embeddings_and_output_weights", default=False),
    Field("rotary_emb_base", "rotary_base"),
    Field("rotary_pct", "rotary_percent"),
    Field("no_bias", "add_bias_linear", encode=lambda no_bias: not no_bias, decode=lambda bias: not bias),
    Field("attn_dropout_prob", "attention_dropout", default=0.0),
    Require(
        lambda hf: hf["kv_channels"] * hf["num_attention_heads"] == hf["hidden_size"],
        "Qwen (v1) splits c_attn into hidden_size-wide q, k, v: "
        "kv_channels x num_attention_heads must equal hidden_size",
    ),
    Fixed(
        hf={"scale_attn_weights": True, "emb_dropout_prob": 0.0},
        mcore={**SWIGLU_RMSNORM, "position_embedding_type": "rope", "add_qkv_bias": True},
    ),
    # Neither changes the model within seq_length tokens: max_position_embeddings is unused by Qwen's code, and
    # use_dynamic_ntk / use_logn_attn act only at inference on sequences longer than seq_length (megatron-core
    # has neither; see README). The rest are kernel and dtype switches.
    passthrough=(
        "max_position_embeddings",
        "use_dynamic_ntk",
        "use_logn_attn",
        "use_flash_attn",
        "bf16",
        "fp16",
        "fp32",
        "onnx_safe",
        "softmax_in_fp32",
        "use_cache_quantization",
        "use_cache_kernel",
    ),
)

T, H = "transformer.", "transformer.h.{layer}."


def qwen_v1_weights(config) -> WeightMap:
    """Qwen (v1): fused ``c_attn`` ``[q; k; v]`` with bias; ``w2`` is the SwiGLU gate, ``w1`` the up projection."""
    rows = [
        Vocab(T + "wte.weight", "embedding.word_embeddings.weight"),
        Copy(H + "ln_1.weight", M + "input_layernorm.weight"),
        FusedQKV(H + "attn.c_attn.weight", M + "self_attention.linear_qkv.weight"),
        FusedQKV(H + "attn.c_attn.bias", M + "self_attention.linear_qkv.bias"),
        Copy(H + "attn.c_proj.weight", M + "self_attention.linear_proj.weight"),
        Copy(H + "ln_2.weight", M + "pre_mlp_layernorm.weight"),
        GateUp(H + "mlp.{w2,w1}.weight", M + "mlp.linear_fc1.weight"),
        Copy(H + "mlp.c_proj.weight", M + "mlp.linear_fc2.weight"),
        Copy(T + "ln_f.weight", "decoder.final_layernorm.weight"),
        Output("lm_head.weight", "output_layer.weight"),
    ]
    if config.get("add_bias_linear"):
        rows += [
            Copy(H + "attn.c_proj.bias", M + "self_attention.linear_proj.bias"),
            GateUp(H + "mlp.{w2,w1}.bias", M + "mlp.linear_fc1.bias"),
            Copy(H + "mlp.c_proj.bias", M + "mlp.linear_fc2.bias"),
        ]
    return WeightMap(*rows)


QWEN = Family(
    name="qwen",
    aliases=("qwen-v1", "qwen1"),
    hf_architectures=("QWenLMHeadModel",),
    model_types=("qwen",),
    presets=QWEN_V1_PRESETS,
    tiny="qwen-v1-tiny",
    odd="qwen-v1-odd",
    config_map=QWEN_V1_CONFIG,
    weight_map=qwen_v1_weights,
    hf_model_class=LazyClass("pai_zoo_qwen.modeling_qwen:QWenLMHeadModel"),
    hf_config_class=LazyClass("pai_zoo_qwen.modeling_qwen:QWenConfig"),
    test_tokenizer=write_qwen_tiktoken_tokenizer,
    description="Qwen (v1): QWenLMHeadModel, qwen.tiktoken tokenizer",
)

QWEN2 = Family(
    name="qwen2",
    aliases=("qwen1.5", "qwen2.5"),
    hf_architectures=("Qwen2ForCausalLM",),
    model_types=("qwen2",),
    presets=QWEN2_PRESETS,
    tiny="qwen2-tiny",
    odd="qwen2-odd",
    config_map=QWEN2_CONFIG,
    weight_map=qwen2_weights,
    test_tokenizer=write_qwen2_tokenizer,
    megatron_args=llama_megatron_args(add_qkv_bias=True),
    description="Qwen1.5, Qwen2 and Qwen2.5 (Qwen2ForCausalLM)",
)

QWEN3 = Family(
    name="qwen3",
    hf_architectures=("Qwen3ForCausalLM",),
    model_types=("qwen3",),
    presets=QWEN3_PRESETS,
    tiny="qwen3-tiny",
    odd="qwen3-odd",
    config_map=QWEN3_CONFIG,
    weight_map=qwen2_weights,
    test_tokenizer=write_qwen2_tokenizer,
    megatron_args=llama_megatron_args(qk_layernorm=True),
    description="Qwen3 dense (Qwen3ForCausalLM)",
)


QWEN2_MOE = Family(
    name="qwen2-moe",
    aliases=("qwen1.5-moe", "qwen2_moe"),
    hf_architectures=("Qwen2MoeForCausalLM",),
    model_types=("qwen2_moe",),
    presets=QWEN2_MOE_PRESETS,
    tiny="qwen2-moe-tiny",
    odd="qwen2-moe-odd",
    config_map=QWEN2_MOE_CONFIG,
    weight_map=qwen_moe_weights,
    megatron_args=moe_megatron_args(add_qkv_bias=True),
    test_tokenizer=write_qwen2_tokenizer,
    description="Qwen1.5-MoE and Qwen2-MoE (Qwen2MoeForCausalLM): routed experts and a gated shared expert",
)

QWEN3_MOE = Family(
    name="qwen3-moe",
    aliases=("qwen3_moe",),
    hf_architectures=("Qwen3MoeForCausalLM",),
    model_types=("qwen3_moe",),
    presets=QWEN3_MOE_PRESETS,
    tiny="qwen3-moe-tiny",
    odd="qwen3-moe-odd",
    config_map=QWEN3_MOE_CONFIG,
    weight_map=qwen_moe_weights,
    megatron_args=moe_megatron_args(qk_layernorm=True),
    test_tokenizer=write_qwen2_tokenizer,
    description="Qwen3-MoE (Qwen3MoeForCausalLM)",
)


@hookimpl
def pai_zoo_families():
    from .qwen3_5 import QWEN3_5, QWEN3_5_MOE
    from .qwen3_next import QWEN3_NEXT

    return [QWEN, QWEN2, QWEN3, QWEN2_MOE, QWEN3_MOE, QWEN3_NEXT, QWEN3_5, QWEN3_5_MOE]


@hookimpl
def pai_zoo_tokenizer(family, path):
    """Qwen (v1) folders carry ``qwen.tiktoken`` (no tokenizer.json): read it with Qwen's split pattern and special
    tokens. Other Qwen folders use the core's loader."""
    if family.name not in ("qwen", "qwen2", "qwen3"):
        return None
    from .tokenizer_files import qwen_tiktoken_file

    rank_file = qwen_tiktoken_file(path)
    if rank_file is None:
        return None
    from .tokenizer_files import load_qwen_tiktoken

    return load_qwen_tiktoken(rank_file)
