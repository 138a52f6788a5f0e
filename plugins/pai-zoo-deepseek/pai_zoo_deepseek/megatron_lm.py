"""DeepSeek's multi-latent attention in a Megatron-LM checkpoint's ``args`` (``--multi-latent-attention``):
the rule the family declares as :attr:`pai_zoo.Family.megatron_lm_rules`, and its claims.

Megatron-LM builds an ``MLATransformerConfig`` from the args fields of the same names: ``q_lora_rank`` (``None``:
a plain query projection), ``kv_lora_rank``, ``qk_head_dim``, ``qk_pos_emb_head_dim``, ``v_head_dim``,
``rope_type`` (``None`` means MLA's default, ``yarn``), ``rotary_base``, ``rotary_scaling_factor``, ``mscale``,
``mscale_all_dim``; YaRN's ``original_max_position_embeddings``, ``beta_fast`` and ``beta_slow`` are not
Megatron-LM flags (megatron-core's defaults 4096, 32, 1 apply, and are taken so, unless the args hold those fields,
as a YAML-configured run's may). megatron-core's MLA de-interleaves the rotated
channels itself, as DeepSeek's checkpoints have them, so the weights copy unchanged (``rotary_interleaved`` must
be off). The q/kv low-rank norms need ``qk_layernorm``.
"""
from __future__ import annotations

from pai_zoo import ConfigTranslationError, Rule
from pai_zoo.config_map import FAMILY_KEY_PREFIX
from pai_zoo.layouts import moe_megatron_args
from pai_zoo.plugin.megatron_args import ATTENTION_VARIANT
from pai_zoo.plugin.sparse_attention import INDEXER_LAYERS, ROPE_INTERLEAVED, indexer_layers, topk_schedule

#: megatron-core's MLA fields, kept under ``family.`` (see ``MLA_FIELDS`` in the package).
SHAPE = ("q_lora_rank", "kv_lora_rank", "qk_head_dim", "qk_pos_emb_head_dim", "v_head_dim")
#: MLATransformerConfig's YaRN defaults for what Megatron-LM's args do not carry.
YARN_DEFAULTS = {"original_max_position_embeddings": 4096, "beta_fast": 32, "beta_slow": 1}
MLA_ROPE = FAMILY_KEY_PREFIX + "rope_scaling"


class MegatronLmMla(Rule):
    """``--multi-latent-attention`` and its fields <-> the family's MLA keys and RoPE (``position_embedding_type``
    none at the model level, ``rotary_base``, ``family.rope_scaling``)."""

    hf_keys = ("multi_latent_attention", *SHAPE, "rope_type", "rotary_scaling_factor", "mscale", "mscale_all_dim",
               "qk_layernorm", "rotary_interleaved")

    def __init__(self, variant: str | None = None):
        self.variant = variant

    def to_mcore(self, args: dict, arch: dict) -> None:
        if args.get(ATTENTION_VARIANT) != self.variant:
            raise ConfigTranslationError(f"args.experimental_attention_variant={args.get(ATTENTION_VARIANT)!r}: this "
                                         f"family's multi-latent attention is {self.variant or 'dense'}")
        if not args.get("multi_latent_attention"):
            raise ConfigTranslationError("args.multi_latent_attention is not set: DeepSeek's attention is "
                                         "multi-latent attention")
        if not args.get("qk_layernorm"):
            raise ConfigTranslationError("args.qk_layernorm=False: DeepSeek's multi-latent attention normalises its "
                                         "low-rank query and key/value (q_layernorm, kv_layernorm)")
        if args.get("rotary_interleaved"):
            raise ConfigTranslationError("args.rotary_interleaved=True: megatron-core's multi-latent attention then "
                                         "rotates other channel pairs than DeepSeek's checkpoints")
        if float(args.get("rotary_percent") or 1.0) != 1.0:
            raise ConfigTranslationError(f"args.rotary_percent={args['rotary_percent']}: DeepSeek rotates all of "
                                         "the qk_pos_emb_head_dim channels")
        for name in SHAPE:
            arch[FAMILY_KEY_PREFIX + name] = args.get(name)
        for key in ("qk_layernorm", "kv_channels", "rotary_percent", "rotary_interleaved", MLA_ROPE):
            arch.pop(key, None)
        arch["position_embedding_type"] = "none"  # the attention's own RoPE
        arch["rotary_base"] = float(args.get("rotary_base") or 10000.0)
        kind = args.get("rope_type") or "yarn"
        factor = float(args.get("rotary_scaling_factor") or 1.0)
        if kind not in ("rope", "yarn"):
            raise ConfigTranslationError(f"args.rope_type={kind!r}: multi-latent attention has rope or yarn")
        if kind == "yarn" and factor > 1.0:  # YaRN at factor 1 is the plain RoPE
            arch[MLA_ROPE] = {"rope_type": "yarn", "factor": factor,
                              **{k: args[k] if args.get(k) is not None else v for k, v in YARN_DEFAULTS.items()},
                              "mscale": float(args.get("mscale", 1.0)),
                              "mscale_all_dim": float(args.get("mscale_all_dim") or 0.0)}

    def to_hf(self, arch: dict, args: dict) -> None:
        scaling = arch.get(MLA_ROPE) or {}
        args.update(multi_latent_attention=True, qk_layernorm=True, rotary_interleaved=False, rotary_percent=1.0,
                    position_embedding_type="rope", rotary_base=arch.get("rotary_base", 10000.0),
                    kv_channels=arch[FAMILY_KEY_PREFIX + "qk_head_dim"],
                    **{name: arch[FAMILY_KEY_PREFIX + name] for name in SHAPE})
        if scaling:
            args.update(rope_type="yarn", rotary_scaling_factor=float(scaling["factor"]),
                        mscale=float(scaling.get("mscale", 1.0)),
                        mscale_all_dim=float(scaling.get("mscale_all_dim") or 0.0))
        else:
            args.update(rope_type="rope", rotary_scaling_factor=1.0, mscale=1.0, mscale_all_dim=0.0)

    def describe(self) -> str:
        return "multi_latent_attention, q_lora_rank ... v_head_dim, rope_type, rotary_scaling_factor, mscale"


def claims(score: str, variant: str | None = None) -> tuple[dict, ...]:
    """The Megatron-LM args a DeepSeek family claims: multi-latent attention (with its q/kv norms), experts
    with ``score`` router scores and the attention variant ``variant`` (``dsa``: sparse attention; None: dense)."""
    return moe_megatron_args(score, multi_latent_attention=True, qk_layernorm=True,
                             **{ATTENTION_VARIANT: variant})


#: megatron-core's DSA fields that Megatron-LM's args carry (``--dsa-indexer-n-heads`` ...), in 0.16 and 0.19.
DSA_FIELDS = ("dsa_indexer_n_heads", "dsa_indexer_head_dim", "dsa_indexer_topk")


class MegatronLmIndexer(Rule):
    """``--experimental-attention-variant dsa``, ``--dsa-indexer-{n-heads,head-dim,topk}`` <-> the indexer's
    ``dsa_indexer_*`` keys (:mod:`pai_zoo.plugin.sparse_attention`); megatron-core 0.19's
    ``--dsa-indexer-rope-interleaved`` (written when set: GLM-5) and ``--dsa-indexer-topk-freq`` /
    ``--dsa-indexer-skip-topk-offset`` (GLM-5's shared layers, when periodic) too. transformers' indexer scores
    with a ReLU (``dsa_indexer_scoring_relu`` off is refused) and a key norm of eps 1e-6; the Hadamard rotation
    (``dsa_indexer_rotate_activation``) leaves the scores as they are, so either value reads the same model.
    megatron-core 0.16's own ``DSAIndexer`` rotates the last ``qk_pos_emb_head_dim`` channels of the indexer's
    heads, transformers the first: a Megatron-LM 0.16 run computes another indexer from the same weights."""

    hf_keys = ("experimental_attention_variant", *DSA_FIELDS, "dsa_indexer_rope_interleaved",
               "dsa_indexer_topk_freq", "dsa_indexer_skip_topk_offset", "dsa_indexer_scoring_relu",
               "dsa_indexer_k_norm_epsilon")

    def to_mcore(self, args: dict, arch: dict) -> None:
        if args.get("experimental_attention_variant") != "dsa":
            raise ConfigTranslationError(f"args.experimental_attention_variant="
                                         f"{args.get('experimental_attention_variant')!r}: this family's attention "
                                         "is DeepSeek sparse attention ('dsa')")
        for name in DSA_FIELDS:
            if not args.get(name):
                raise ConfigTranslationError(f"args.{name} is not set: DeepSeek sparse attention needs it")
            arch[name] = int(args[name])
        if args.get("dsa_indexer_scoring_relu") is False:
            raise ConfigTranslationError("args.dsa_indexer_scoring_relu=False: transformers' indexer scores each "
                                         "head with a ReLU")
        if args.get("dsa_indexer_k_norm_epsilon") not in (None, 1e-6):
            raise ConfigTranslationError(f"args.dsa_indexer_k_norm_epsilon={args['dsa_indexer_k_norm_epsilon']}: "
                                         "transformers' indexer key norm has eps 1e-6")
        arch[ROPE_INTERLEAVED] = bool(args.get("dsa_indexer_rope_interleaved"))
        freq, offset = int(args.get("dsa_indexer_topk_freq") or 1), int(args.get("dsa_indexer_skip_topk_offset") or 0)
        arch.pop(INDEXER_LAYERS, None)
        if freq > 1:
            start = max(offset, 1)
            arch[INDEXER_LAYERS] = [int(max(n - start, 0) % freq == 0) for n in range(1, int(args["num_layers"]) + 1)]
        arch.pop(ATTENTION_VARIANT, None)

    def to_hf(self, arch: dict, args: dict) -> None:
        args.update(experimental_attention_variant="dsa", **{name: arch[name] for name in DSA_FIELDS})
        if arch.get(ROPE_INTERLEAVED):
            args["dsa_indexer_rope_interleaved"] = True
        layers = indexer_layers(arch)
        if not all(layers):
            schedule = topk_schedule(layers)
            if schedule is None:
                raise ConfigTranslationError(f"{INDEXER_LAYERS}={layers}: no --dsa-indexer-topk-freq / "
                                             "--dsa-indexer-skip-topk-offset gives these shared layers")
            args["dsa_indexer_topk_freq"], args["dsa_indexer_skip_topk_offset"] = schedule

    def describe(self) -> str:
        return "experimental_attention_variant dsa, dsa_indexer_n_heads/head_dim/topk (rope_interleaved, topk_freq)"
