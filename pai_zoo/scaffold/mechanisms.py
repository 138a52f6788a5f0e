"""The mechanisms beyond the Llama layout that ``pai-zoo plugin new`` recognises, from the checkpoint's tensor names
and shapes and the config's keys, and the ones it refuses (:func:`refuse`: one line naming the mechanism the core
lacks, before anything is built).

- **Fused tensors**: ``self_attn.qkv_proj`` (:class:`~pai_zoo.FusedQKV`), ``mlp.gate_up_proj`` (``[gate; up]``,
  megatron's ``linear_fc1`` as it is: a ``Copy``).
- **Norm placements** (``pai_zoo.norm_placement``): pre (Llama), post (``post_attention_layernorm`` and
  ``post_feedforward_layernorm`` without an input norm: OLMo-2, EXAONE-4) or sandwich (input, post-attention,
  pre- and post-feedforward norms: Gemma-3). **q/k norms** (``q_norm`` / ``k_norm``): per head (``head_dim`` wide,
  megatron-core's ``qk_layernorm``) or over the whole projection (``pai_zoo.qk_norm`` ``"projection"``).
- **Mixtures of experts** (``mlp.gate`` and ``mlp.experts.{e}.*`` in checkpoint names):
  :func:`pai_zoo.layouts.moe_layout` and :func:`pai_zoo.layouts.moe_config_rules` with the config's own keys
  (expert count, top-k, expert width, renormalisation, aux loss), a gated shared expert (``shared_expert`` +
  ``shared_expert_gate``) or ungated shared experts (``shared_experts``), dense layers by ``decoder_sparse_step`` /
  ``mlp_only_layers`` or ``first_k_dense_replace``.
- **Layer patterns**: ``layer_types`` (sliding / full: :class:`pai_zoo.plugin.layer_pattern.LayerTypes`),
  ``no_rope_layers`` / ``no_rope_layer_interval`` (:class:`pai_zoo.plugin.no_rope.NoRopeLayers`).
- **Multipliers** (Granite): ``embedding_multiplier``, ``residual_multiplier``, ``attention_multiplier``,
  ``logits_scaling`` -> ``pai_zoo.embedding_scale``, ``pai_zoo.residual_scale``, megatron's ``softmax_scale``,
  ``pai_zoo.logits_scale``.
"""
from __future__ import annotations

from typing import Any

from ..plugin.config_map import (
    EMBEDDING_SCALE,
    FAMILY_KEY_PREFIX,
    LOGITS_SCALE,
    NORM_PLACEMENT,
    QK_NORM,
    RESIDUAL_SCALE,
)
from .pysource import py
from .source import ScaffoldError

#: Per-layer name prefixes as the generated rows write them.
L, M = "L + ", "M + "

#: The expert-count keys of transformers' MoE configs, in the order they are looked for.
EXPERT_KEYS = ("num_experts", "num_local_experts", "n_routed_experts", "moe_num_experts")
TOPK_KEYS = ("num_experts_per_tok", "moe_k", "moe_topk")
#: Mixtral's MoE prefix (experts ``w1`` gate, ``w3`` up, ``w2`` down; router ``gate``).
MIXTRAL = "block_sparse_moe."
#: Test sizes of a mixture of experts (only the keys the config class has are set).
MOE_TINY = {"num_experts": 4, "num_local_experts": 4, "n_routed_experts": 4, "num_experts_per_tok": 2,
            "moe_intermediate_size": 32, "shared_expert_intermediate_size": 48}
MOE_ODD = {"num_experts": 5, "num_local_experts": 5, "n_routed_experts": 5, "num_experts_per_tok": 3,
           "moe_intermediate_size": 24, "shared_expert_intermediate_size": 40}

#: Granite's multipliers: HF key -> arch key.
MULTIPLIERS = {"embedding_multiplier": EMBEDDING_SCALE, "residual_multiplier": RESIDUAL_SCALE,
               "attention_multiplier": "softmax_scale", "logits_scaling": LOGITS_SCALE}

#: Activations the core lacks, by ``hidden_act``: the mechanism's name.
ACTIVATION_NAMES = {"xielu": "the xIELU activation", "relu2": "the squared-ReLU activation",
                    "gelu_fast": "the fast GELU approximation", "mish": "the Mish activation"}


def layer_suffixes(names) -> set[str]:
    """``model.layers.N.x`` -> ``x``; other names as they are."""
    out = set()
    for name in names:
        parts = name.split(".")
        if parts[:2] == ["model", "layers"] and len(parts) > 3 and parts[2].isdigit():
            out.add(".".join(parts[3:]))
        else:
            out.add(name)
    return out


#: The mechanisms of :func:`refuse` that pai-zoo's core has (a hand-written plugin uses them; plugin new does not
#: write them yet); the others the core lacks.
IN_CORE = ("attention sinks", "biased experts", "multi-latent attention", "attention temperature tuning",
           "chunked local attention", "logit soft-capping", "MXFP4 expert weights", "LongRoPE",
           "linear_attention layers", "linear attention layers", "indexed_attention layers", "Mamba-2 hybrid layers")

#: model_type keys of a Mamba hybrid's layer pattern (:class:`pai_zoo.plugin.hybrid.HybridPattern` reads them)
HYBRID_KEYS = ("hybrid_override_pattern", "layers_block_type")


#: where a hand-written plugin finds a mechanism of :data:`IN_CORE` that a family already uses
_LINEAR = ("in two forms: Gated DeltaNet, pai_zoo.plugin.linear_attention as pai-zoo-qwen's qwen3_next; Mamba-2, "
           "pai_zoo.plugin.hybrid as pai-zoo-nemotron's nemotron_h")
EXAMPLES = {"linear_attention layers": _LINEAR, "linear attention layers": _LINEAR,
            "indexed_attention layers": "pai_zoo.plugin.sparse_attention, as pai-zoo-deepseek's deepseek-v32",
            "Mamba-2 hybrid layers": "pai_zoo.plugin.hybrid, as pai-zoo-nemotron's nemotron_h"}


def _missing(source, mechanism: str, why: str) -> ScaffoldError:
    example = next((f" ({text})" for key, text in EXAMPLES.items() if mechanism.startswith(key)), "")
    where = (f"which pai-zoo's core has{example} but plugin new does not write" if mechanism.startswith(IN_CORE)
             else "a mechanism pai-zoo's core does not have")
    return ScaffoldError(f"{source.where}: {source.model_type} needs {mechanism} ({why}), {where}: write the plugin "
                         "by hand (docs/writing-a-plugin.md)")


def refuse_config(source, hf: dict, known_acts) -> None:
    """Raise :class:`ScaffoldError` (one line naming the mechanism) where the config alone shows a mechanism that
    plugin new does not write (before any model is built)."""
    pattern = next((key for key in HYBRID_KEYS if hf.get(key)), None)
    if pattern is not None:
        raise _missing(source, "Mamba-2 hybrid layers", f"{pattern}: Mamba-2, attention and MLP layers by a pattern")
    mamba = sorted(k for k in hf if k.startswith("mamba_"))
    if mamba and not isinstance(hf.get("layer_types"), list):
        raise _missing(source, "Mamba-2 mixers inside the decoder layer beside its attention or MLP",
                       f"{', '.join(mamba[:3])} ... and no per-layer pattern")
    act = hf.get("hidden_act")
    if isinstance(act, str) and act not in known_acts:
        raise _missing(source, ACTIVATION_NAMES.get(act, f"the {act} activation"), f"hidden_act={act!r}")
    if hf.get("clip_qkv") is not None:
        raise _missing(source, "a clamp of q, k and v", f"clip_qkv={hf['clip_qkv']!r}")
    if hf.get("attn_temperature_tuning"):
        raise _missing(source, "attention temperature tuning", "attn_temperature_tuning, floor_scale")
    if hf.get("attention_chunk_size"):
        raise _missing(source, "chunked local attention", f"attention_chunk_size={hf['attention_chunk_size']!r}")
    for key in ("attn_logit_softcapping", "final_logit_softcapping"):
        if hf.get(key) is not None:
            raise _missing(source, "logit soft-capping", f"{key}={hf[key]!r}")
    quant = hf.get("quantization_config") or {}
    if isinstance(quant, dict) and quant.get("quant_method") == "mxfp4":
        raise _missing(source, "MXFP4 expert weights", "quantization_config.quant_method mxfp4")
    rope = hf.get("rope_parameters") or {}
    if isinstance(rope, dict) and rope.get("rope_type") == "longrope":
        raise _missing(source, "LongRoPE (short and long factors)", "rope_type longrope: its factor lists are per "
                                                                    "rotary channel of the published head size")
    kinds = hf.get("layer_types")
    if isinstance(kinds, list):
        other = sorted({k for k in kinds if k not in ("sliding_attention", "full_attention")}, key=str)
        if other:
            raise _missing(source, f"{', '.join(map(str, other))} layers", f"layer_types has {other}")


def refuse(source, hf: dict, names: set[str]) -> None:
    """Raise :class:`ScaffoldError` (one line naming the mechanism) where the model's tensors show a mechanism that
    plugin new does not write. ``names``: the tiny model's checkpoint tensor names."""
    suffixes = layer_suffixes(names)
    if any(s.endswith("sinks") for s in suffixes):
        raise _missing(source, "attention sinks", "self_attn.sinks: a learned logit per head in the softmax")
    if any(".experts." in s and s.endswith("bias") for s in suffixes):
        raise _missing(source, "biased experts", "expert projections with biases")
    if any(s.startswith("linear_attn.") for s in suffixes):
        raise _missing(source, "linear attention layers", "linear_attn.*")
    if any(s.startswith(("feed_forward.router", "mlp.router")) for s in suffixes):
        raise _missing(source, "a top-k-then-sigmoid router (Llama 4's)", "feed_forward.router")
    bias = [s for s in suffixes if s.endswith("e_score_correction_bias")]
    softmax = hf.get("scoring_func", "sigmoid") != "sigmoid" or ("scoring_func" not in hf and "moe_num_experts" in hf)
    if bias and softmax:
        raise _missing(source, "a score-correction bias on softmax router scores (ERNIE-4.5-MoE's)", bias[0])
    if any(s.startswith(("self_attn.q_a_proj", "self_attn.kv_a_proj")) for s in suffixes):
        raise _missing(source, "multi-latent attention (MLA)", "self_attn.q_a_proj / kv_a_proj_with_mqa")
    known = ("mlp.experts.", "mlp.gate.", "mlp.shared_expert", *(MIXTRAL + p for p in ("experts.", "gate.")))
    moe = [s for s in suffixes if any(w in s for w in ("experts", "router", "moe", "expert_"))]
    if moe and not all(s.startswith(known) for s in moe):
        where = sorted({s.rsplit(".", 1)[0] for s in moe if not s.startswith(known)})[:3]
        raise _missing(source, f"a mixture of experts in another layout than mlp.gate + mlp.experts.{{e}} "
                               f"({', '.join(where)})", "its router and experts")


def shapes_of(values: dict, source) -> dict[str, tuple]:
    """``{checkpoint name: shape}`` of the transformers causal LM built on the meta device from ``values`` (a mixture
    of experts' fused in-memory tensors split per expert, as ``save_pretrained`` writes them)."""
    import torch
    from transformers import AutoModelForCausalLM
    from transformers.models.auto.configuration_auto import CONFIG_MAPPING

    config = CONFIG_MAPPING[source.model_type].from_dict({k: v for k, v in values.items() if k != "model_type"})
    with torch.device("meta"):
        model = AutoModelForCausalLM.from_config(config)
    state = dict(model.state_dict())
    if any(".experts." in name for name in state):
        from transformers.core_model_loading import revert_weight_conversion

        try:
            state = dict(revert_weight_conversion(model, state))
        except Exception:  # noqa: BLE001 - no conversion registered: the names as they are
            pass
    return {name: tuple(t.shape) for name, t in state.items()}


def _layer0(shapes: dict, suffix: str):
    return shapes.get(f"model.layers.0.{suffix}")


def detect(draft, shapes: dict[str, tuple], values: dict) -> set[str]:
    """Fill ``draft`` (rows, rules, arch keys, handled keys) with the mechanisms ``shapes`` and the config show;
    returns the layer suffixes (and top-level names) they cover."""
    suffixes = layer_suffixes(shapes)
    covered: set[str] = set()
    # fused projections
    if "self_attn.qkv_proj.weight" in suffixes:
        draft.layout_kwargs["qkv"] = 'FusedQKV(L + "self_attn.qkv_proj.weight", M + "self_attention.linear_qkv.weight")'
        covered.add("self_attn.qkv_proj.weight")
        draft.found.append("fused q/k/v (self_attn.qkv_proj: FusedQKV)")
    if "mlp.gate_up_proj.weight" in suffixes:
        draft.layout_kwargs["fc1"] = 'Copy(L + "mlp.gate_up_proj.weight", M + "mlp.linear_fc1.weight")'
        covered.add("mlp.gate_up_proj.weight")
        draft.found.append("fused gate/up (mlp.gate_up_proj, [gate; up] as megatron's linear_fc1)")
    _norms(draft, suffixes, covered)
    _qk_norms(draft, shapes, values, covered)
    _moe(draft, suffixes, covered)
    _patterns(draft)
    _multipliers(draft)
    _carried(draft)
    if "clip_qkv" in draft.hf and draft.hf["clip_qkv"] is None:  # refuse() refused a value
        draft.family_rules.append(('FixedIfPresent("clip_qkv", None, "megatron-core has no clamp of q, k and v: only '
                                   'clip_qkv null is supported")', ""))
        draft.handled.add("clip_qkv")
    return covered


#: Keys only a RoPE scaling rule reads (the source's value kept as a family key, written back as it was).
CARRIED = ("original_max_position_embeddings",)


def _carried(draft) -> None:
    for key in CARRIED:
        if key in draft.hf and key not in draft.handled:
            default = draft.defaults.get(key)
            draft.family_rules.append((f"Field({py(key)}, {py(FAMILY_KEY_PREFIX + key)}, default={default!r})",
                                       "read by RoPE scaling only: kept"))
            draft.handled.add(key)


def _norms(draft, suffixes: set[str], covered: set[str]) -> None:
    has = {n: f"{n}.weight" in suffixes for n in ("input_layernorm", "post_attention_layernorm",
                                                   "pre_feedforward_layernorm", "post_feedforward_layernorm")}
    post_attn = 'Copy(L + "post_attention_layernorm.weight", M + "self_attention.linear_proj.post_layernorm.weight")'
    post_ffn = 'Copy(L + "post_feedforward_layernorm.weight", M + "mlp.linear_fc2.post_layernorm.weight")'
    if not has["input_layernorm"] and has["post_attention_layernorm"] and has["post_feedforward_layernorm"]:
        draft.drop_rows += ["input_layernorm", "post_attention_layernorm"]
        draft.extra_rows += [post_attn, post_ffn]
        draft.mcore_fixed[NORM_PLACEMENT] = "post"
        draft.found.append("norms after attention and MLP (pai_zoo.norm_placement post)")
    elif all(has.values()):
        draft.drop_rows += ["post_attention_layernorm"]
        draft.extra_rows += [post_attn, 'Copy(L + "pre_feedforward_layernorm.weight", M + "pre_mlp_layernorm.weight")',
                             post_ffn]
        draft.mcore_fixed[NORM_PLACEMENT] = "sandwich"
        draft.found.append("sandwich norms (pai_zoo.norm_placement sandwich)")
    else:
        return
    covered |= {f"{n}.weight" for n, present in has.items() if present}


def _qk_norms(draft, shapes: dict, values: dict, covered: set[str]) -> None:
    q, k = _layer0(shapes, "self_attn.q_norm.weight"), _layer0(shapes, "self_attn.k_norm.weight")
    if q is None or k is None:
        return
    heads = values["num_attention_heads"]
    head_dim = values.get("head_dim") or values["hidden_size"] // heads
    draft.extra_rows += ['Copy(L + "self_attn.q_norm.weight", M + "self_attention.q_layernorm.weight")',
                         'Copy(L + "self_attn.k_norm.weight", M + "self_attention.k_layernorm.weight")']
    draft.mcore_fixed["qk_layernorm"] = True
    if q == (head_dim,):
        draft.found.append("q/k norms per head (qk_layernorm)")
    elif q == (heads * head_dim,):
        draft.mcore_fixed[QK_NORM] = "projection"
        draft.found.append("q/k norms over the whole projection (pai_zoo.qk_norm projection)")
    else:
        draft.stubs.append(f"q/k norms of shape {q} / {k}: neither per head ({head_dim}) nor over the projection")
    covered |= {"self_attn.q_norm.weight", "self_attn.k_norm.weight"}


def _first(hf: dict, keys) -> str | None:
    return next((k for k in keys if k in hf), None)


def _moe(draft, suffixes: set[str], covered: set[str]) -> None:
    hf = draft.hf
    prefix = next((p for p in ("mlp.", MIXTRAL) if f"{p}gate.weight" in suffixes
                   and any(s.startswith(f"{p}experts.") for s in suffixes)), None)
    if prefix is None:
        return
    experts, topk = _first(hf, EXPERT_KEYS), _first(hf, TOPK_KEYS)
    if experts is None or topk is None:
        raise ScaffoldError(f"{draft.source.where}: {draft.source.model_type} has mlp.gate and mlp.experts but no "
                            f"expert count ({', '.join(EXPERT_KEYS)}) or top-k ({', '.join(TOPK_KEYS)}) key: a mixture "
                            "of experts plugin new cannot read")
    args = [py(experts), py(topk)]
    kwargs: dict[str, Any] = {}
    kwargs["expert_ffn"] = "moe_intermediate_size" if "moe_intermediate_size" in hf else None
    kwargs["aux_loss"] = "router_aux_loss_coef" if "router_aux_loss_coef" in hf else None
    kwargs["norm_topk"] = "norm_topk_prob" if "norm_topk_prob" in hf else None
    layout: dict[str, str] = {}
    if prefix == MIXTRAL:
        layout.update(prefix=MIXTRAL, gate_up="{w1,w3}.weight", down="w2.weight")
    handled = {experts, topk, "moe_intermediate_size", "router_aux_loss_coef", "norm_topk_prob"}
    if any(s.startswith("mlp.shared_expert.") for s in suffixes):
        if "mlp.shared_expert_gate.weight" not in suffixes or "shared_expert_intermediate_size" not in hf:
            raise _missing(draft.source, "an ungated shared expert of its own width", "mlp.shared_expert")
        kwargs["shared_ffn"] = "shared_expert_intermediate_size"
        layout.update(shared="shared_expert.", shared_gate="shared_expert_gate.weight")
        handled.add("shared_expert_intermediate_size")
        covered |= {s for s in suffixes if s.startswith("mlp.shared_expert")}
    elif any(s.startswith("mlp.shared_experts.") for s in suffixes):
        count = _first(hf, ("n_shared_experts", "num_shared_experts", "moe_num_shared_experts"))
        if count is None:
            raise _missing(draft.source, "shared experts without a count key", "mlp.shared_experts")
        kwargs["shared_count"] = count
        layout["shared"] = "shared_experts."
        handled.add(count)
        covered |= {s for s in suffixes if s.startswith("mlp.shared_experts.")}
    if "mlp.gate.e_score_correction_bias" in suffixes:
        kwargs.update(expert_bias=True, score="sigmoid")
        layout["expert_bias"] = "gate.e_score_correction_bias"
        covered.add("mlp.gate.e_score_correction_bias")
    if "scoring_func" in hf:
        kwargs["score_key"] = "scoring_func"
        handled.add("scoring_func")
    if "routed_scaling_factor" in hf:
        kwargs["scaling"] = "routed_scaling_factor"
        handled.add("routed_scaling_factor")
    if "decoder_sparse_step" in hf or "mlp_only_layers" in hf:
        kwargs["dense_layers"] = "SparseStep()"
        handled |= {"decoder_sparse_step", "mlp_only_layers"}
    elif "first_k_dense_replace" in hf:
        kwargs["dense_layers"] = "FirstKDense()"
        handled.add("first_k_dense_replace")
    code_kwargs = ", ".join(f"{k}={v if k == 'dense_layers' else py(v)}" for k, v in kwargs.items()
                            if v is not None or k in ("expert_ffn", "aux_loss", "norm_topk"))
    draft.family_rules.append((f"*moe_config_rules({', '.join(args)}, {code_kwargs})",
                               "a mixture of experts (router, experts, their keys)"))
    draft.layout_kwargs["mlp"] = "moe_layout(" + ", ".join(f"{k}={py(v)}" for k, v in layout.items()) + ")"
    covered |= {s for s in suffixes if s.startswith((f"{prefix}gate.", f"{prefix}experts."))}
    if "router_jitter_noise" in hf:  # training-time noise on the router logits
        draft.passthrough.append("router_jitter_noise")
        handled.add("router_jitter_noise")
    draft.handled |= handled
    if "output_router_logits" in hf:
        draft.passthrough.append("output_router_logits")
        draft.handled.add("output_router_logits")
    draft.moe = True
    extras = ", ".join(f"{k}={v}" for k, v in kwargs.items() if v is not None and k not in ("aux_loss", "norm_topk"))
    draft.found.append(f"a mixture of experts ({experts}, top-k {topk}" + (f", {extras}" if extras else "") + ")")


def _patterns(draft) -> None:
    hf = draft.hf
    if hf.get("use_sliding_window") is False:  # Qwen-style: the window keys are kept but never read
        draft.hf_fixed["use_sliding_window"] = False
        draft.notes["use_sliding_window"] = "sliding windows off (the window keys are carried, never read)"
        for key in ("sliding_window", "layer_types", "max_window_layers", "sliding_window_pattern"):
            if key in hf:
                draft.passthrough.append(key)
                draft.handled.add(key)
        draft.handled.add("use_sliding_window")
    if "no_rope_layers" in hf or "no_rope_layer_interval" in hf:
        interval = draft.defaults.get("no_rope_layer_interval", 4)
        draft.family_rules.append((f"NoRopeLayers(default_interval={interval!r})", "layers without RoPE"))
        draft.handled |= {"no_rope_layers", "no_rope_layer_interval"}
        draft.found.append("layers without RoPE (no_rope_layers: NoRopeLayers)")
    if "layer_types" in hf and "layer_types" not in draft.handled:
        if "use_sliding_window" in hf:  # the source's switch, as every preset has it
            sliding = any("sliding" in str(k) for k in hf["layer_types"] or ())
            draft.hf_fixed["use_sliding_window"] = sliding
            draft.notes["use_sliding_window"] = "sliding windows where layer_types says so" if sliding else \
                "no sliding windows: supported off"
        window = draft.defaults.get("sliding_window")
        draft.family_rules.append((f"LayerTypes(default_window={window!r})", "sliding / full layers (layer_types)"))
        draft.handled |= {"layer_types", "sliding_window", "sliding_window_pattern", "use_sliding_window"}
        if "max_window_layers" in hf:
            draft.passthrough.append("max_window_layers")
            draft.handled.add("max_window_layers")
        draft.found.append("per-layer sliding / full attention (layer_types: LayerTypes)")


def _multipliers(draft) -> None:
    hf = draft.hf
    found = [k for k in MULTIPLIERS if k in hf]
    for key in found:
        default = draft.defaults.get(key, 1.0)
        draft.family_rules.append((f"Field({py(key)}, {py(MULTIPLIERS[key])}, default={default!r})", "a multiplier"))
        draft.handled.add(key)
    if found:
        draft.found.append(f"multipliers ({', '.join(found)})")


def preset_patterns(preset: dict, hf: dict, layers: int, window: int) -> None:
    """A test preset's layer patterns: every layer kind of ``layer_types`` and of the no-RoPE interval in ``layers``
    layers, every window and chunk small (``window``)."""
    kinds = hf.get("layer_types")
    if isinstance(kinds, list) and kinds:
        seen = list(dict.fromkeys(kinds))
        preset["layer_types"] = [seen[i % len(seen)] for i in range(layers)]
        preset.pop("sliding_window_pattern", None)
        if any("sliding" in k for k in seen):
            preset["sliding_window"] = window
            if "use_sliding_window" in hf:
                preset["use_sliding_window"] = True
    if "no_rope_layer_interval" in hf or "no_rope_layers" in hf:
        preset["no_rope_layer_interval"] = 2
        preset["no_rope_layers"] = [int((i + 1) % 2 != 0) for i in range(layers)]
    if hf.get("attention_chunk_size"):
        preset["attention_chunk_size"] = window
    rope = preset.get("rope_parameters") or hf.get("rope_parameters")
    if isinstance(rope, dict) and rope.get("llama_4_scaling_beta") and rope.get("original_max_position_embeddings"):
        # the query scale steps every `window` positions: the forward check sees both sides of it
        max_pos = preset.get("max_position_embeddings", 512)
        rope = {**rope, "original_max_position_embeddings": window}
        if "factor" in rope and rope.get("rope_type") == "yarn":
            rope["factor"] = float(max_pos / window)
        if "max_position_embeddings" in rope:
            rope["max_position_embeddings"] = max_pos
        preset["rope_parameters"] = rope


#: Config rules that measurement may find (``pai-zoo plugin new`` tries them as it tries the arch variants of
#: :data:`pai_zoo.scaffold.measure.VARIANTS`): name -> (the class's source, or "" for a core rule the generated plugin
#: imports (:data:`pai_zoo.scaffold.render.IMPORTS`), what it means, whether it may apply).
RULE_VARIANTS = {
    # pai_zoo.plugin.no_rope.NoRopeOnFullLayers: EXAONE-4's global layers
    "NoRopeOnFullLayers": (
        "",
        "skips RoPE on its full-attention layers when a sliding window is set",
        lambda draft: "layer_types" in draft.hf and "no_rope_layers" not in draft.hf,
    ),
}
