"""pai-zoo plugin for DeepSeek-V2 and DeepSeek-V3 (``DeepseekV2ForCausalLM``, ``DeepseekV3ForCausalLM``).

Written against pai-zoo's public plugin API only. Multi-latent attention (MLA) is megatron-core's
``MLASelfAttention``, which megatron-core's local spec cannot run as it is; this plugin's layer spec supplies what
it lacks as ``ModuleSpec`` modules of its own (:mod:`pai_zoo_deepseek.modules`). The routed experts are
megatron-core's ``MoELayer`` (the core's MoE rules and rows: sigmoid or softmax scores, grouped routing, expert
bias, routed scaling, shared experts, first-k dense layers).
"""
from __future__ import annotations

from pai_zoo import (
    ConfigMap,
    ConfigTranslationError,
    Copy,
    Family,
    Field,
    Fixed,
    FixedIfPresent,
    LazyClass,
    Output,
    Rope,
    Rule,
    Vocab,
    WeightMap,
    hookimpl,
)
from pai_zoo.config_map import FAMILY_KEY_PREFIX, ROPE_SCALING
from pai_zoo.layouts import (
    HF_LAYER,
    MCORE_LAYER,
    SWIGLU_RMSNORM,
    FirstKDense,
    MtpLayers,
    llama_shape_rules,
    moe_config_rules,
    moe_layout,
)

from . import megatron_lm
from .kimi_tokenizer import write_kimi_tokenizer
from .presets import DEEPSEEK_PRESETS, KIMI_PRESETS
from .tokenizer_files import write_deepseek_tokenizer

#: The arch key of the MLA RoPE's transformers parameters (less the theta), read by the layer spec.
MLA_ROPE = FAMILY_KEY_PREFIX + "rope_scaling"

#: DeepSeek-V2's grouped routing, and the arch key that asks the layer spec for its router.
GROUP_MAX, TOPK_METHOD = "group_limited_greedy", FAMILY_KEY_PREFIX + "topk_method"

#: HF MLA shape keys -> the arch keys the layer spec gives megatron-core's MLATransformerConfig.
MLA_FIELDS = {
    "q_lora_rank": "q_lora_rank",
    "kv_lora_rank": "kv_lora_rank",
    "qk_nope_head_dim": "qk_head_dim",
    "qk_rope_head_dim": "qk_pos_emb_head_dim",
    "v_head_dim": "v_head_dim",
}


class MlaShape(Rule):
    """MLA's shape: ``q_lora_rank`` (``None``: a plain ``q_proj``), ``kv_lora_rank``, ``qk_nope_head_dim``,
    ``qk_rope_head_dim``, ``v_head_dim`` -> ``family.*`` keys in megatron-core's MLA names; transformers' derived
    ``qk_head_dim`` (nope + rope) and ``head_dim`` (the rotated width) must agree with them and are written back
    so. Every head has its own keys and values (``num_key_value_heads`` = ``num_attention_heads``)."""

    hf_keys = (*MLA_FIELDS, "qk_head_dim", "head_dim", "num_key_value_heads")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        for key, name in MLA_FIELDS.items():
            if key not in hf and key != "q_lora_rank":
                raise ConfigTranslationError(f"config.json has no {key!r} (multi-latent attention's shape)")
            arch[FAMILY_KEY_PREFIX + name] = hf.get(key)
        nope, rope = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"]
        if rope % 2:
            raise ConfigTranslationError(f"qk_rope_head_dim={rope}: the rotated channels are pairs, so it must be even")
        for key, value in (("qk_head_dim", nope + rope), ("head_dim", rope)):
            if hf.get(key, value) != value:
                raise ConfigTranslationError(f"{key}={hf[key]}: DeepSeek's {key} is {value} "
                                             f"(qk_nope_head_dim={nope}, qk_rope_head_dim={rope})")
        heads = hf["num_attention_heads"]
        if hf.get("num_key_value_heads", heads) != heads:
            raise ConfigTranslationError(f"num_key_value_heads={hf['num_key_value_heads']}: multi-latent attention "
                                         f"gives each of the {heads} heads its own keys and values")

    def to_hf(self, arch: dict, hf: dict) -> None:
        for key, name in MLA_FIELDS.items():
            hf[key] = arch[FAMILY_KEY_PREFIX + name]
        nope, rope = hf["qk_nope_head_dim"], hf["qk_rope_head_dim"]
        hf["qk_head_dim"], hf["head_dim"] = nope + rope, rope
        hf["num_key_value_heads"] = arch["num_attention_heads"]

    def describe(self) -> str:
        return "q_lora_rank, kv_lora_rank, qk_nope/rope_head_dim, v_head_dim -> MLA fields (family.*)"


class MlaRope(Rope):
    """The core's :class:`~pai_zoo.Rope` rule for MLA: the decoupled RoPE lives in each attention, not in the
    model (``position_embedding_type`` none), so a YaRN's parameters go to ``family.rope_scaling`` for the layer
    spec instead of the core's model-level key. Only the default RoPE and YaRN (DeepSeek's) are supported."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        super().to_mcore(hf, arch)
        arch["position_embedding_type"] = "none"
        if "rotary_percent" in arch:
            raise ConfigTranslationError("partial_rotary_factor: DeepSeek rotates the qk_rope_head_dim channels, "
                                         "all of them")
        scaling = arch.pop(ROPE_SCALING, None)
        if scaling is not None:
            kind = scaling.get("rope_type", scaling.get("type"))
            if kind != "yarn":
                raise ConfigTranslationError(f"rope_parameters.rope_type={kind!r}: DeepSeek's MLA here supports "
                                             "the default RoPE and yarn only")
            arch[MLA_ROPE] = scaling

    def to_hf(self, arch: dict, hf: dict) -> None:
        if arch.get("position_embedding_type") != "none":
            raise ConfigTranslationError(f"position_embedding_type={arch.get('position_embedding_type')!r}: "
                                         "DeepSeek's RoPE is the attention's own (none at the model level)")
        model = {k: v for k, v in arch.items() if k not in (MLA_ROPE, "position_embedding_type")}
        if arch.get(MLA_ROPE):
            model[ROPE_SCALING] = arch[MLA_ROPE]
        super().to_hf(model, hf)

    def describe(self) -> str:
        return "rope_parameters -> rotary_base, family.rope_scaling (default or yarn, in every MLA attention)"


class V2TopkMethod(Rule):
    """DeepSeek-V2's ``topk_method``: ``greedy`` (top-k of the softmax over every expert; the group keys are kept
    as they were) or ``group_limited_greedy``: ``topk_group`` of ``n_group`` groups, ranked by their best expert,
    then the top-k among their experts -> megatron's ``moe_router_num_groups``/``moe_router_group_topk`` and
    ``family.topk_method``, which gives the MoE layers :class:`~pai_zoo_deepseek.modules.GroupMaxRouter`
    (megatron-core ranks groups by the sum of their top ``topk // group_topk``, which is another routing)."""

    hf_keys = ("topk_method", "n_group", "topk_group")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        method = hf.get("topk_method", "greedy")
        if method == "greedy":
            for key in ("n_group", "topk_group"):
                if key in hf:
                    arch[FAMILY_KEY_PREFIX + key] = hf[key]
            return
        if method != GROUP_MAX:
            raise ConfigTranslationError(f"topk_method={method!r}: DeepSeek-V2 routes with greedy or {GROUP_MAX}")
        groups, chosen = hf.get("n_group"), hf.get("topk_group")
        experts, topk = arch["num_moe_experts"], arch["moe_router_topk"]
        if not groups or not chosen or experts % groups or chosen > groups or topk > chosen * (experts // groups):
            raise ConfigTranslationError(
                f"topk_method={method}: n_group={groups}, topk_group={chosen} with {experts} experts top-{topk}: "
                "the groups must divide the experts and the chosen groups hold at least top-k experts")
        arch["moe_router_num_groups"], arch["moe_router_group_topk"] = groups, chosen
        arch[TOPK_METHOD] = method

    def to_hf(self, arch: dict, hf: dict) -> None:
        if arch.get(TOPK_METHOD) == GROUP_MAX:
            hf["topk_method"], hf["n_group"], hf["topk_group"] = (
                GROUP_MAX, arch["moe_router_num_groups"], arch["moe_router_group_topk"])
            return
        if arch.get("moe_router_num_groups"):
            raise ConfigTranslationError(
                "moe_router_num_groups is set: megatron-core's grouped routing (groups ranked by the sum of their "
                f"top experts) is not DeepSeek-V2's {GROUP_MAX} (groups ranked by their best expert)")
        hf["topk_method"] = "greedy"
        for key in ("n_group", "topk_group"):
            if FAMILY_KEY_PREFIX + key in arch:
                hf[key] = arch[FAMILY_KEY_PREFIX + key]

    def describe(self) -> str:
        return f"topk_method, n_group, topk_group -> grouped routing ({GROUP_MAX}: groups ranked by their best)"


class UnusedByV2Router(Rule):
    """``norm_topk_prob`` in a DeepSeek-V2 config: transformers' V2 router never renormalises and never reads it.
    Kept as it was (``family.norm_topk_prob``), a rule of this family rather than a passthrough key, since for
    other routers the key does change the computation."""

    hf_keys = ("norm_topk_prob",)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        if "norm_topk_prob" in hf:
            arch[FAMILY_KEY_PREFIX + "norm_topk_prob"] = hf["norm_topk_prob"]

    def to_hf(self, arch: dict, hf: dict) -> None:
        if FAMILY_KEY_PREFIX + "norm_topk_prob" in arch:
            hf["norm_topk_prob"] = arch[FAMILY_KEY_PREFIX + "norm_topk_prob"]

    def describe(self) -> str:
        return "norm_topk_prob: unused by DeepSeek-V2's router (never renormalised), kept"


def _common_rules(*moe_rules: Rule, hf_fixed: dict) -> list[Rule]:
    return [
        *llama_shape_rules(gqa=False, tie_default=False),  # MLA's head sizes: MlaShape
        Field("attention_dropout", "attention_dropout", default=0.0),
        MlaShape(),
        MlaRope(),
        *moe_rules,
        Fixed(hf={"hidden_act": "silu", "attention_bias": False, **hf_fixed},
              mcore={**SWIGLU_RMSNORM, "add_bias_linear": False, "add_qkv_bias": False}),
    ]


#: Keys that do not change the logits: whether transformers returns router logits, Megatron-era tensor-parallel
#: pretraining switch, and the published config's expert-parallel size.
_TRAINING_ONLY = ("output_router_logits", "pretraining_tp", "ep_size")


def _remote_code_keys(scoring: str) -> list[Rule]:
    """Published config.json keys of DeepSeek's own modeling code, supported with the value transformers'
    modeling has built in (kept as they were when present)."""
    return [
        FixedIfPresent("scoring_func", scoring, f"transformers' model of this version scores experts by {scoring}"),
        FixedIfPresent("moe_layer_freq", 1, "every layer after first_k_dense_replace is a mixture of experts"),
    ]


#: transformers' DeepSeek routers compute in float32 whatever the model's dtype. The published configs' aux loss
#: (``aux_loss_alpha``, ``seq_aux``: DeepSeek's sequence-wise balance loss) is megatron-core's ``seq_aux_loss``,
#: which pai-zoo's training then adds (transformers' models compute none).
_EXPERTS = dict(experts="n_routed_experts", expert_ffn="moe_intermediate_size", aux_loss="aux_loss_alpha",
                seq_aux="seq_aux", scaling="routed_scaling_factor", shared_count="n_shared_experts",
                dense_layers=FirstKDense(), router_fp32=True)

DEEPSEEK_V2_CONFIG = ConfigMap(
    # V2's router never renormalises (its config's norm_topk_prob is unused by the modeling code: UnusedByV2Router).
    *_common_rules(*moe_config_rules(norm_topk=None, always_renormalised=False, score="softmax", **_EXPERTS),
                   V2TopkMethod(), UnusedByV2Router(), *_remote_code_keys("softmax"), hf_fixed={"mlp_bias": False}),
    passthrough=_TRAINING_ONLY,
)

DEEPSEEK_V3_CONFIG = ConfigMap(
    *_common_rules(*moe_config_rules(norm_topk="norm_topk_prob", score="sigmoid", groups=("n_group", "topk_group"),
                                     expert_bias=True, **_EXPERTS),
                   MtpLayers(), FixedIfPresent("rope_interleave", True, "DeepSeek-V3's checkpoints interleave the "
                                           "rotated channels in pairs"),
                   FixedIfPresent("topk_method", "noaux_tc", "DeepSeek-V3 routes by sigmoid scores plus the expert "
                                  "bias (noaux_tc), as transformers does"),
                   *_remote_code_keys("sigmoid"), hf_fixed={}),
    passthrough=_TRAINING_ONLY,
)

L, M = HF_LAYER, MCORE_LAYER
A, S = L + "self_attn.", M + "self_attention."


def deepseek_weights(config) -> WeightMap:
    """MLA's projections (all copied: megatron-core's MLA keeps DeepSeek's layouts, ``kv_a_proj_with_mqa``
    holding the compressed KV then the shared rotated key as ``linear_kv_down_proj`` does), the dense MLP of the
    first-k layers, the routed and shared experts, the router and (V3) its score-correction bias."""
    if config.get(FAMILY_KEY_PREFIX + "q_lora_rank") is None:
        query = [Copy(A + "q_proj.weight", S + "linear_q_proj.weight")]
    else:
        query = [
            Copy(A + "q_a_proj.weight", S + "linear_q_down_proj.weight"),
            Copy(A + "q_a_layernorm.weight", S + "q_layernorm.weight"),
            Copy(A + "q_b_proj.weight", S + "linear_q_up_proj.weight"),
        ]
    bias = "gate.e_score_correction_bias" if config.get("moe_router_enable_expert_bias") else None
    return WeightMap(
        Vocab("model.embed_tokens.weight", "embedding.word_embeddings.weight"),
        Copy(L + "input_layernorm.weight", M + "input_layernorm.weight"),
        *query,
        Copy(A + "kv_a_proj_with_mqa.weight", S + "linear_kv_down_proj.weight"),
        Copy(A + "kv_a_layernorm.weight", S + "kv_layernorm.weight"),
        Copy(A + "kv_b_proj.weight", S + "linear_kv_up_proj.weight"),
        Copy(A + "o_proj.weight", S + "linear_proj.weight"),
        Copy(L + "post_attention_layernorm.weight", M + "pre_mlp_layernorm.weight"),
        *moe_layout(shared="shared_experts.", expert_bias=bias),
        Copy("model.norm.weight", "decoder.final_layernorm.weight"),
        Output("lm_head.weight", "output_layer.weight"),
    )


def mla_fields(config) -> dict:
    """The MLA fields of megatron-core's ``MLATransformerConfig`` for ``config`` (plus ``rope_scaling``, which
    :class:`~pai_zoo_deepseek.modules.DeepseekMLA` applies): the shape, the RoPE base, YaRN's factor and
    ``mscale_all_dim`` (megatron-core's softmax scale, as transformers'), q/kv norms with transformers' eps."""
    scaling = config.get(MLA_ROPE)
    fields = {name: config.get(FAMILY_KEY_PREFIX + name) for name in MLA_FIELDS.values()}
    fields.update(
        multi_latent_attention=True,
        qk_layernorm=True,  # q_a_layernorm, kv_a_layernorm
        layernorm_epsilon=1e-6,  # transformers builds both without rms_norm_eps
        rotary_base=config.get("rotary_base", 10000.0),
        rotary_scaling_factor=float(scaling["factor"]) if scaling else 1.0,
        mscale_all_dim=float((scaling or {}).get("mscale_all_dim") or 0.0),
        rope_scaling=dict(scaling) if scaling else None,
    )
    return fields


def layer_spec(config):
    """megatron-core's local layers with the plugin's MLA attention; MoE layers after the first-k dense ones."""
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from pai_zoo.layouts import moe_pattern
    from pai_zoo.mcore.specs import block_spec, default_layer_spec, submodules_of

    from .modules import DeepseekMLA, GroupMaxRouter, MLACoreAttention

    attention = get_gpt_layer_local_spec(multi_latent_attention=True, qk_layernorm=True,
                                         normalization="RMSNorm").submodules.self_attention
    attention.module = DeepseekMLA
    attention.params = {**attention.params, "mla": mla_fields(config)}
    attention.submodules.core_attention = MLACoreAttention
    base = {"normalization": "RMSNorm", "num_moe_experts": config.get("num_moe_experts")}
    moe, dense = default_layer_spec(base), default_layer_spec({**base, "num_moe_experts": None})
    for spec in (moe, dense):
        spec.submodules.self_attention = attention
    if config.get(TOPK_METHOD) == GROUP_MAX:
        submodules_of(moe.submodules.mlp).router = GroupMaxRouter
    return block_spec(config, [moe if kind else dense for kind in moe_pattern(config.arch)])


def _family(version: int, presets: dict, tiny: str, odd: str | None, config_map: ConfigMap, description: str):
    return Family(
        name=f"deepseek-v{version}",
        aliases=(f"deepseek_v{version}",),
        hf_architectures=(f"DeepseekV{version}ForCausalLM",),
        model_types=(f"deepseek_v{version}",),
        presets=presets,
        tiny=tiny,
        odd=odd,
        config_map=config_map,
        weight_map=deepseek_weights,
        layer_spec=layer_spec,
        test_tokenizer=write_deepseek_tokenizer,
        description=description,
        megatron_args=megatron_lm.claims("sigmoid" if version == 3 else "softmax"),
        megatron_lm_rules=(megatron_lm.MegatronLmMla(),),
    )


def _presets(version: int) -> dict:
    return {k: v for k, v in DEEPSEEK_PRESETS.items() if v["model_type"] == f"deepseek_v{version}"}


DEEPSEEK_V2 = _family(2, _presets(2), "deepseek-v2-tiny", "deepseek-v2-odd", DEEPSEEK_V2_CONFIG,
                      "DeepSeek-V2 and V2-Lite (DeepseekV2ForCausalLM): MLA, softmax-routed and shared experts")
DEEPSEEK_V3 = _family(3, _presets(3), "deepseek-v3-tiny", "deepseek-v3-odd", DEEPSEEK_V3_CONFIG,
                      "DeepSeek-V3 (DeepseekV3ForCausalLM): MLA with q LoRA, sigmoid grouped routing with expert bias")


#: Kimi-K2: DeepSeek-V3's architecture and config keys under ``model_type: kimi_k2`` (transformers has no such type:
#: its DeepseekV3Config writing kimi_k2 back, and its DeepseekV3ForCausalLM, no remote code), a tiktoken tokenizer.
#: A Megatron-LM checkpoint's args cannot tell it from DeepSeek-V3: ``--family kimi-k2`` picks it.
KIMI_K2 = Family(
    name="kimi-k2",
    aliases=("kimi_k2",),
    hf_architectures=("DeepseekV3ForCausalLM",),
    model_types=("kimi_k2",),
    presets=KIMI_PRESETS,
    tiny="kimi-k2-tiny",
    odd="kimi-k2-odd",
    config_map=DEEPSEEK_V3_CONFIG,
    weight_map=deepseek_weights,
    layer_spec=layer_spec,
    hf_config_class=LazyClass("pai_zoo_deepseek.kimi_hf:KimiK2Config"),
    hf_model_class=LazyClass("transformers:DeepseekV3ForCausalLM"),
    test_tokenizer=write_kimi_tokenizer,
    description="Kimi-K2 (DeepseekV3ForCausalLM, model_type kimi_k2): DeepSeek-V3's MLA and sigmoid-routed experts "
                "with 384 experts in one group; tiktoken tokenizer",
    megatron_lm_rules=(megatron_lm.MegatronLmMla(),),
)


from .dsa import DEEPSEEK_V32  # noqa: E402 (DeepSeek-V3's rules and table, defined above)


@hookimpl
def pai_zoo_families():
    return [DEEPSEEK_V2, DEEPSEEK_V3, KIMI_K2, DEEPSEEK_V32]


@hookimpl
def pai_zoo_tokenizer(family, path):
    """Kimi-K2 folders carry ``tiktoken.model`` and remote tokenizer code: read the rank file with Kimi's split
    pattern and special tokens instead (:func:`pai_zoo_deepseek.kimi_tokenizer.load_kimi_tiktoken`)."""
    if family.name != KIMI_K2.name:
        return None
    from .kimi_tokenizer import kimi_tiktoken_file, load_kimi_tiktoken

    return load_kimi_tiktoken(path) if kimi_tiktoken_file(path) is not None else None
