"""Weight-table rows and config rules shared by families whose Hugging Face checkpoints use the Llama
layout (``model.embed_tokens``, ``model.layers.N.{input_layernorm, self_attn, post_attention_layernorm,
mlp}``, ``model.norm``, ``lm_head``; config keys ``hidden_size``, ``num_key_value_heads``, ``rms_norm_eps``
...; a SwiGLU MLP and RMSNorm): Llama, Mistral, Qwen2/3, GLM-4, Baichuan; and their mixture-of-experts
members (Mixtral, Qwen2-MoE, Qwen3-MoE: :func:`moe_layout`, :func:`moe_config_rules`)."""
from __future__ import annotations

from typing import Any

from ..plugin.config_map import FAMILY_KEY_PREFIX, NORM_PLACEMENT, QK_NORM, REQUIRED, Field, Fixed, Require, Rule
from ..plugin.errors import ConfigTranslationError
from ..plugin.megatron_args import MIXTURE_OF_EXPERTS, MULTI_LATENT_ATTENTION
from .mapping import QKV, Copy, GateUp, Output, Row, Vocab, WeightMap, on_layers
from .moe_layers import (  # the MoE-layer rules, importable from here too (their home: pai_zoo.tables.moe_layers)
    EveryLayerMoe,
    FirstKDense,  # noqa: F401
    MoeLayerRange,  # noqa: F401
    SparseStep,  # noqa: F401
    moe_pattern,  # noqa: F401
)
from .moe_layers import remembered as _remembered

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
    expert_bias: str | None = None,
    dense: tuple[str, str] | None = ("mlp.{gate,up}_proj.weight", "mlp.down_proj.weight"),
) -> list[Row]:
    """The rows of a mixture-of-experts MLP in checkpoint (``save_pretrained``) names under
    ``model.layers.{layer}.`` + ``prefix``: the router ``router`` -> megatron's ``mlp.router.weight``; each
    routed expert ``experts`` (``{expert}`` is every expert) with its ``gate_up`` brace pair and ``down`` ->
    ``mlp.experts.local_experts.{expert}.linear_fc1/fc2.weight`` (``SequentialMLP``); a shared expert
    ``shared`` (its ``{gate,up}_proj`` and ``down_proj``) -> ``mlp.shared_experts.linear_fc1/fc2.weight``, and
    its sigmoid gate ``shared_gate`` -> ``mlp.shared_experts.gate_weight``; the router's score-correction bias
    ``expert_bias`` (``gate.e_score_correction_bias``) -> ``mlp.router.expert_bias``.

    These rows expand for the MoE layers only; ``dense`` (``{gate,up}`` pair, down, under ``model.layers.{layer}.``)
    are the dense layers' MLP rows among them (megatron's ``moe_layer_freq``: :func:`moe_layer_rules`), which
    expand for no layer when every layer is a MoE layer.

    Qwen2/3-MoE keep the defaults; Mixtral is ``moe_layout("block_sparse_moe.", gate_up="{w1,w3}.weight",
    down="w2.weight")``."""
    L, M = HF_LAYER + prefix, MCORE_LAYER + "mlp."
    E = M + "experts.local_experts.{expert}."
    rows: list[Row] = [
        Copy(L + router, M + "router.weight"),
        GateUp(L + experts + gate_up, E + "linear_fc1.weight"),
        Copy(L + experts + down, E + "linear_fc2.weight"),
    ]
    if expert_bias:
        rows.append(Copy(L + expert_bias, M + "router.expert_bias"))
    if shared:
        rows += [
            GateUp(L + shared + "{gate,up}_proj.weight", M + "shared_experts.linear_fc1.weight"),
            Copy(L + shared + "down_proj.weight", M + "shared_experts.linear_fc2.weight"),
        ]
    if shared_gate:
        rows.append(Copy(L + shared_gate, M + "shared_experts.gate_weight"))
    rows = on_layers("moe", *rows)
    if dense:
        rows += on_layers("dense", GateUp(HF_LAYER + dense[0], M + "linear_fc1.weight"),
                          Copy(HF_LAYER + dense[1], M + "linear_fc2.weight"))
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
MOE_FIXED = {"moe_grouped_gemm": False, "moe_token_dispatcher_type": "alltoall"}


class Renormalisation(Rule):
    """Whether the top-k weights are renormalised to sum to 1, for the score function (``score``, or the
    ``moe_router_score_function`` a rule before this one set).

    softmax: ``norm`` (HF flag) True is a softmax over the top-k logits, megatron's
    ``moe_router_pre_softmax=False``; False the top-k of the softmax over all experts, ``pre_softmax=True``.
    sigmoid: megatron-core always renormalises the sigmoid top-k scores (top-k > 1), so the flag must be True.
    ``norm`` ``None``: the family has no flag, ``always`` says what it does (Mixtral: always renormalised)."""

    def __init__(self, norm: str | None, score: str, always: bool = True):
        self.norm, self.score, self.always = norm, score, always
        self.hf_keys = (norm,) if norm else ()

    def to_mcore(self, hf: dict, arch: dict) -> None:
        value = hf.get(self.norm, self.always) if self.norm else self.always
        if value is None:
            value = self.always
        topk = arch.get("moe_router_topk")
        if arch.get("moe_router_score_function", self.score) == "sigmoid":
            if not value and topk != 1:
                raise ConfigTranslationError(
                    f"{self.norm or 'the router'}=False with sigmoid scores: megatron-core always renormalises the "
                    "top-k sigmoid scores (moe_router_topk > 1); this model's are not renormalised")
            if value and topk == 1:
                raise ConfigTranslationError(f"{self.norm}=True with top-1 sigmoid routing: transformers scales "
                                             "the chosen expert by 1, megatron-core by its sigmoid score")
            arch["moe_router_pre_softmax"] = False
        else:
            if value and topk == 1:
                raise ConfigTranslationError(
                    f"{self.norm or 'renormalised'} top-1 softmax routing weighs the chosen expert by 1, which "
                    "megatron-core does not (it needs moe_router_pre_softmax for top-1)")
            arch["moe_router_pre_softmax"] = not value
        if self.norm and hf.get(self.norm, 0) is None:
            arch[FAMILY_KEY_PREFIX + self.norm] = None

    def to_hf(self, arch: dict, hf: dict) -> None:
        pre_softmax = bool(arch.get("moe_router_pre_softmax", False))
        sigmoid = arch.get("moe_router_score_function", self.score) == "sigmoid"
        value = True if sigmoid else not pre_softmax
        if sigmoid and pre_softmax:
            raise ConfigTranslationError("moe_router_pre_softmax=True with sigmoid scores has no Hugging Face form")
        if not self.norm:
            if value != self.always:
                raise ConfigTranslationError(f"moe_router_pre_softmax={pre_softmax}: this family's router "
                                             f"{'always' if self.always else 'never'} renormalises the top-k weights")
            return
        hf[self.norm] = None if (FAMILY_KEY_PREFIX + self.norm) in arch else value

    def describe(self) -> str:
        if self.score == "sigmoid":
            return f"{self.norm or '(renormalised)'} true -> sigmoid top-k renormalised (moe_router_pre_softmax off)"
        return f"{self.norm or '(always renormalised)'} -> moe_router_pre_softmax (inverted)"


class GroupedRouting(Rule):
    """Grouped (node-limited) routing: ``n_group`` groups of experts, ``topk_group`` of them chosen per token by
    the sum of each group's top ``group_score_topk`` scores (transformers: 2), then top-k within them ->
    megatron's ``moe_router_num_groups``/``moe_router_group_topk``, whose group score sums the top
    ``moe_router_topk // moe_router_group_topk`` scores: the two must agree, else refused. One group (or
    none) is plain top-k routing (no megatron groups); the HF values are kept for the way back."""

    def __init__(self, n_group: str = "n_group", topk_group: str = "topk_group", group_score_topk: int = 2):
        self.n_group, self.topk_group, self.group_score_topk = n_group, topk_group, group_score_topk
        self.hf_keys = (n_group, topk_group)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        groups, chosen = hf.get(self.n_group), hf.get(self.topk_group)
        if groups in (None, 1) and chosen in (None, 1):
            for key in self.hf_keys:
                if key in hf:
                    arch[FAMILY_KEY_PREFIX + key] = hf[key]
            return
        experts, topk = arch["num_moe_experts"], arch["moe_router_topk"]
        if not groups or not chosen or experts % groups or chosen > groups:
            raise ConfigTranslationError(f"{self.n_group}={groups}, {self.topk_group}={chosen}: {experts} experts "
                                         f"need a group count dividing them and {self.topk_group} <= {self.n_group}")
        if topk % chosen or topk // chosen != self.group_score_topk:
            raise ConfigTranslationError(
                f"{self.n_group}={groups}, {self.topk_group}={chosen}, top-k {topk}: this model scores a group by its "
                f"top {self.group_score_topk} experts, megatron-core by its top moe_router_topk // "
                f"moe_router_group_topk = {topk // chosen}")
        arch["moe_router_num_groups"], arch["moe_router_group_topk"] = groups, chosen

    def to_hf(self, arch: dict, hf: dict) -> None:
        if arch.get("moe_router_num_groups"):
            hf[self.n_group], hf[self.topk_group] = arch["moe_router_num_groups"], arch["moe_router_group_topk"]
            return
        for key in self.hf_keys:
            hf[key] = arch.get(FAMILY_KEY_PREFIX + key, 1)

    def describe(self) -> str:
        return f"{self.n_group}, {self.topk_group} -> moe_router_num_groups, moe_router_group_topk (grouped top-k)"


class SharedExpertCount(Rule):
    """``n_shared_experts`` shared experts as wide as a routed one (GLM-4.5, DeepSeek: one MLP of ``n x
    moe_intermediate_size``, ungated) -> megatron's ``moe_shared_expert_intermediate_size`` (0 or none: no
    shared expert). Back: the width over ``moe_ffn_hidden_size``, which must divide it."""

    def __init__(self, count: str = "n_shared_experts"):
        self.count = count
        self.hf_keys = (count,)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        n = hf.get(self.count)
        if n:
            arch["moe_shared_expert_intermediate_size"] = int(n) * arch["moe_ffn_hidden_size"]
        elif self.count in hf:
            arch[FAMILY_KEY_PREFIX + self.count] = n
        arch["moe_shared_expert_gate"] = False

    def to_hf(self, arch: dict, hf: dict) -> None:
        if arch.get("moe_shared_expert_gate"):
            raise ConfigTranslationError("moe_shared_expert_gate=True: this family's shared experts have no gate")
        width = arch.get("moe_shared_expert_intermediate_size")
        if not width:
            hf[self.count] = arch.get(FAMILY_KEY_PREFIX + self.count, 0)
            return
        expert = arch["moe_ffn_hidden_size"]
        if width % expert:
            raise ConfigTranslationError(f"moe_shared_expert_intermediate_size={width} is not a whole number of "
                                         f"experts of moe_ffn_hidden_size={expert} ({self.count})")
        hf[self.count] = width // expert

    def describe(self) -> str:
        return f"{self.count} -> moe_shared_expert_intermediate_size (n x moe_ffn_hidden_size, ungated)"


class SharedExpertWidth(Rule):
    """A shared expert of HF width ``width`` (Qwen2-MoE's ``shared_expert_intermediate_size``; 0: none), gated by
    a sigmoid -> ``moe_shared_expert_intermediate_size``, ``moe_shared_expert_gate``."""

    def __init__(self, width: str):
        self.width = width
        self.hf_keys = (width,)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        if self.width not in hf:
            raise ConfigTranslationError(f"config.json has no {self.width!r} (the shared expert's width)")
        if hf[self.width]:
            arch["moe_shared_expert_intermediate_size"] = hf[self.width]
            arch["moe_shared_expert_gate"] = True

    def to_hf(self, arch: dict, hf: dict) -> None:
        width = arch.get("moe_shared_expert_intermediate_size") or 0
        if width and not arch.get("moe_shared_expert_gate"):
            raise ConfigTranslationError("moe_shared_expert_gate=False: this family's shared expert is gated")
        hf[self.width] = width

    def describe(self) -> str:
        return f"{self.width} -> moe_shared_expert_intermediate_size, moe_shared_expert_gate (sigmoid-gated)"


class AuxLoss(Rule):
    """A load-balancing loss whose coefficient ``coeff`` and sequence-wise flag ``seq`` the config may omit
    (DeepSeek's ``aux_loss_alpha``, ``seq_aux``): absent, no loss (``moe_router_load_balancing_type`` none);
    present, ``moe_aux_loss_coeff`` with megatron-core's ``seq_aux_loss`` (the loss per sequence, DeepSeek-V2's)
    or ``aux_loss`` (per batch). Which keys were present is kept, so the way back writes exactly those."""

    def __init__(self, coeff: str, seq: str):
        self.coeff, self.seq = coeff, seq
        self.hf_keys = (coeff, seq)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        for key in self.hf_keys:
            if key in hf:
                arch[FAMILY_KEY_PREFIX + key] = True  # present
        if hf.get(self.coeff) is None:
            arch.update(moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0)
            return
        arch["moe_aux_loss_coeff"] = float(hf[self.coeff])
        arch["moe_router_load_balancing_type"] = "seq_aux_loss" if hf.get(self.seq) else "aux_loss"

    def to_hf(self, arch: dict, hf: dict) -> None:
        kind = arch.get("moe_router_load_balancing_type", "none")
        if kind not in ("none", "aux_loss", "seq_aux_loss"):
            raise ConfigTranslationError(f"moe_router_load_balancing_type={kind!r}: this family's configs have only "
                                         f"a batch or sequence aux loss ({self.coeff}, {self.seq})")
        if kind != "none" or _remembered(arch, self.coeff):
            hf[self.coeff] = float(arch.get("moe_aux_loss_coeff", 0.0)) if kind != "none" else 0.0
        if kind == "seq_aux_loss" or _remembered(arch, self.seq):
            hf[self.seq] = kind == "seq_aux_loss"

    def describe(self) -> str:
        return (f"{self.coeff}, {self.seq} -> moe_aux_loss_coeff, moe_router_load_balancing_type "
                "(seq_aux_loss / aux_loss; none when absent)")


def _whole(value: Any) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= 1


def moe_config_rules(
    experts: str = "num_experts",
    topk: str = "num_experts_per_tok",
    expert_ffn: str | None = "moe_intermediate_size",
    aux_loss: str | None = "router_aux_loss_coef",
    norm_topk: str | None = "norm_topk_prob",
    shared_ffn: str | None = None,
    *,
    always_renormalised: bool = True,
    score: str = "softmax",
    score_key: str | None = None,
    groups: tuple[str, str] | None = None,
    group_score_topk: int = 2,
    scaling: str | None = None,
    expert_bias: bool = False,
    shared_count: str | None = None,
    dense_layers: Rule | None = None,
    router_fp32: bool = False,
    seq_aux: str | None = None,
) -> list[Rule]:
    """Config rules of a mixture-of-experts router and its experts, every field lossless both ways:

    * ``experts``, ``topk``: the routed-expert count and top-k (``num_moe_experts``, ``moe_router_topk``);
    * ``expert_ffn``: the experts' FFN width (``moe_ffn_hidden_size``; ``None``: ``intermediate_size``,
      :class:`ExpertWidthIsFfnWidth`);
    * ``aux_loss``: the aux-loss coefficient (``moe_aux_loss_coeff``, load balancing ``aux_loss``; ``None``: the
      config has none, no load-balancing loss); with ``seq_aux``, the key of a sequence-wise flag, both keys may
      be absent (:class:`AuxLoss`);
    * ``norm_topk``: the renormalisation flag (:class:`Renormalisation`; ``None``: no flag, ``always_renormalised``);
    * ``score``: ``"softmax"`` or ``"sigmoid"`` scores (``moe_router_score_function``), or read from the HF key
      ``score_key`` (DeepSeek's ``scoring_func``) with ``score`` as its default;
    * ``groups``: the grouped-routing keys (``("n_group", "topk_group")``, :class:`GroupedRouting`, a group scored
      by its top ``group_score_topk``);
    * ``scaling``: the routed scaling factor key (``routed_scaling_factor`` -> ``moe_router_topk_scaling_factor``);
    * ``expert_bias``: the router has a score-correction bias (``e_score_correction_bias`` ->
      ``moe_router_enable_expert_bias``; its row: :func:`moe_layout`'s ``expert_bias``; sigmoid scores only);
    * ``shared_ffn``: a sigmoid-gated shared expert of that HF width (:class:`SharedExpertWidth`), or
      ``shared_count``: that many ungated shared experts of the routed width (:class:`SharedExpertCount`);
    * ``dense_layers``: the rule placing dense layers among the MoE layers (:class:`SparseStep`,
      :class:`FirstKDense`, :class:`MoeLayerRange`); ``None``: every layer is MoE (:class:`EveryLayerMoe`);
    * ``router_fp32``: the router computes in fp32 whatever the model's dtype (``moe_router_dtype`` fp32).
    """
    if score not in ("softmax", "sigmoid"):
        raise ValueError(f"score must be softmax or sigmoid, not {score!r}")
    rules: list[Rule] = [Field(experts, "num_moe_experts"), Field(topk, "moe_router_topk"),
                         Require(lambda hf: _whole(hf.get(experts)) and _whole(hf.get(topk))
                                 and hf[topk] <= hf[experts],
                                 f"{experts} and {topk}: a mixture of experts needs a whole number of experts (1 or "
                                 f"more) and a top-k between 1 and that number")]
    if score_key:
        rules.append(Field(score_key, "moe_router_score_function", default=score))
    else:
        rules.append(Fixed(hf={}, mcore={"moe_router_score_function": score}))
    if aux_loss and seq_aux:
        rules.append(AuxLoss(aux_loss, seq_aux))
    elif aux_loss:
        rules += [Field(aux_loss, "moe_aux_loss_coeff", default=0.0),
                  Fixed(hf={}, mcore={"moe_router_load_balancing_type": "aux_loss"})]
    else:
        rules.append(Fixed(hf={}, mcore={"moe_router_load_balancing_type": "none"}))
    rules.append(Field(expert_ffn, "moe_ffn_hidden_size") if expert_ffn else ExpertWidthIsFfnWidth())
    rules.append(Renormalisation(norm_topk, score, always_renormalised))
    if groups:
        rules.append(GroupedRouting(*groups, group_score_topk=group_score_topk))
    if scaling:
        rules.append(Field(scaling, "moe_router_topk_scaling_factor", default=1.0))
    if expert_bias:
        if score != "sigmoid":
            raise ValueError("expert_bias: megatron-core's expert bias needs sigmoid scores (score='sigmoid')")
        if score_key:
            rules.append(Require(lambda hf: hf.get(score_key, score) == "sigmoid",
                                 f"{score_key} other than sigmoid with a score-correction bias: megatron-core's "
                                 "expert bias needs sigmoid scores"))
        rules.append(Fixed(hf={}, mcore={"moe_router_enable_expert_bias": True}))
    if shared_ffn:
        rules.append(SharedExpertWidth(shared_ffn))
    elif shared_count:
        rules.append(SharedExpertCount(shared_count))
    rules.append(dense_layers or EveryLayerMoe())
    if router_fp32:
        rules.append(Fixed(hf={}, mcore={"moe_router_dtype": "fp32"}))
    rules.append(Fixed(hf={}, mcore=dict(MOE_FIXED)))
    return rules


def qkv_bias(layer: str = HF_LAYER) -> Row:
    """The ``q/k/v_proj`` biases into ``linear_qkv.bias``."""
    return QKV(layer + "self_attn.{q,k,v}_proj.bias", MCORE_LAYER + "self_attention.linear_qkv.bias")


def llama_table(config) -> "WeightMap":
    """The Llama layout's weight table (:func:`llama_layout`) with the bias rows the config switches on
    (``add_qkv_bias``: q/k/v; ``add_bias_linear``: ``o_proj``, ``gate/up_proj``, ``down_proj``): a family's
    ``weight_map`` as it is (Llama, Mistral, Granite, SmolLM3)."""
    rows = llama_layout()
    if config.get("add_qkv_bias"):
        rows.append(qkv_bias())
    if config.get("add_bias_linear"):
        rows += [
            Copy(HF_LAYER + "self_attn.o_proj.bias", MCORE_LAYER + "self_attention.linear_proj.bias"),
            GateUp(HF_LAYER + "mlp.{gate,up}_proj.bias", MCORE_LAYER + "mlp.linear_fc1.bias"),
            Copy(HF_LAYER + "mlp.down_proj.bias", MCORE_LAYER + "mlp.linear_fc2.bias"),
        ]
    return WeightMap(*rows)


#: megatron-core's SwiGLU MLP and RMSNorm, as the Llama layout's families have them.
SWIGLU_RMSNORM = {"gated_linear_unit": True, "activation_func": "silu", "normalization": "RMSNorm"}


def llama_megatron_args(**values: Any) -> tuple[dict[str, Any], ...]:
    """A :attr:`Family.megatron_args` claim of the Llama layout: SwiGLU, RMSNorm, RoPE, no linear biases,
    no q/k norms, dense, changed by ``values`` (``add_qkv_bias=True`` for Qwen2)."""
    claim = {**SWIGLU_RMSNORM, "position_embedding_type": "rope", "add_bias_linear": False, "add_qkv_bias": False,
             "qk_layernorm": False, "layernorm_zero_centered_gamma": False, MIXTURE_OF_EXPERTS: False,
             MULTI_LATENT_ATTENTION: False, NORM_PLACEMENT: "pre", QK_NORM: "head"}
    return ({**claim, **values},)


def moe_megatron_args(score: str = "softmax", **values: Any) -> tuple[dict[str, Any], ...]:
    """:func:`llama_megatron_args` for a mixture of experts with ``score`` router scores."""
    return llama_megatron_args(**{MIXTURE_OF_EXPERTS: True, "moe_router_score_function": score, **values})


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
    return [
        *llama_shape_rules(gqa=gqa, head_dim=head_dim, max_positions=max_positions, tie_default=tie_default),
        *family_rules,
        Fixed(hf={"hidden_act": "silu", **(hf_fixed or {})}, mcore={**SWIGLU_RMSNORM, **(mcore_fixed or {})}),
    ]


def llama_shape_rules(
    *, gqa: bool = True, head_dim: Any = REQUIRED, max_positions: bool = True, tie_default: Any = REQUIRED
) -> list[Rule]:
    """The Llama layout's shape fields alone (sizes, heads, positions, RMSNorm epsilon, tied head), for a family
    whose activation or norms differ (Gemma's GeLU-tanh, DeepSeek's MLA); the keywords as in
    :func:`llama_config_rules`."""
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
    return rules + [
        Field("rms_norm_eps", "layernorm_epsilon"),
        Field("tie_word_embeddings", "share_embeddings_and_output_weights", default=tie_default),
    ]


class MtpLayers(Rule):
    """Multi-token-prediction layers: ``num_nextn_predict_layers`` (DeepSeek-V3, GLM-4.5; transformers' GLM-4.5
    config also reads ``num_mtp_layers``) -> megatron's ``mtp_num_layers`` (absent when 0, megatron-core's "no MTP").
    The weights of layer ``num_hidden_layers + i`` map to ``mtp.layers.{i}``
    (:class:`~pai_zoo.tables.mapping.MtpLayout`).
    Back: ``num_nextn_predict_layers`` always (``default_absent``: the value transformers' config assumes when the
    key is absent, so 0 must be written), and ``num_mtp_layers`` where the source had it."""

    hf_keys = ("num_nextn_predict_layers", "num_mtp_layers")

    def to_mcore(self, hf: dict, arch: dict) -> None:
        counts = {k: hf[k] for k in self.hf_keys if hf.get(k) is not None}
        if len(set(counts.values())) > 1:
            raise ConfigTranslationError(f"num_nextn_predict_layers={counts['num_nextn_predict_layers']} and "
                                         f"num_mtp_layers={counts['num_mtp_layers']} disagree; keep one of them")
        layers = next(iter(counts.values()), 0)
        if not isinstance(layers, int) or layers < 0:
            raise ConfigTranslationError(f"num_nextn_predict_layers={layers!r}: a count of layers (0 or more)")
        if layers:
            arch["mtp_num_layers"] = layers
        if "num_mtp_layers" in hf:
            arch[FAMILY_KEY_PREFIX + "num_mtp_layers"] = True  # present

    def to_hf(self, arch: dict, hf: dict) -> None:
        layers = int(arch.get("mtp_num_layers") or 0)
        hf["num_nextn_predict_layers"] = layers
        if _remembered(arch, "num_mtp_layers"):
            hf["num_mtp_layers"] = layers

    def describe(self) -> str:
        return "num_nextn_predict_layers -> mtp_num_layers (model.layers.{num_hidden_layers + i} -> mtp.layers.{i})"
