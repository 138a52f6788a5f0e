"""The ``args`` a pai-zoo ``torch_dist`` checkpoint carries for Megatron-LM, and the flags Megatron-LM needs besides.

Megatron-LM started with ``--use-checkpoint-args`` runs ``load_args_from_checkpoint`` (in
``megatron/training/checkpointing.py``): it copies a fixed list of fields from the checkpoint's pickled
``args`` onto its own, under Megatron-LM's own names (:data:`RESTORED_BY_MEGATRON_LM`). :func:`megatron_lm_args`
writes every one of them (the architecture through :func:`pai_zoo.megatron_args.args_from_arch`, the same
translation that reads a Megatron-LM checkpoint back). What that function does not restore
(``--norm-epsilon``, RoPE scaling, the dropouts on older Megatron-LM, ...) a run must pass itself:
:func:`megatron_lm_flags` lists those flags and :func:`write_readme` writes them into the checkpoint's README.
"""
from __future__ import annotations

import argparse
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Mapping

import torch

from ..families.registry import get_registry
from ..plugin.config_map import NORM_PLACEMENT, QK_NORM, ROPE_SCALING, McoreConfig
from ..plugin.errors import ConfigTranslationError
from ..plugin.megatron_args import arch_from_args, args_from_arch, differences

#: The ``--tokenizer-type`` of a Hugging Face tokenizer folder.
HF_TOKENIZER_TYPE = "HuggingFaceTokenizer"
README = "README.md"


@dataclass(frozen=True)
class Restored:
    """One ``_set_arg(name, old_name, force)`` call of Megatron-LM's ``load_args_from_checkpoint``.

    ``force``: the checkpoint's value wins over the command line (else only a field the run left ``None`` is
    set); ``when``: the run's args field that must be true for the call to happen (``None``: always);
    ``old_name``: the field read instead from a checkpoint older than version 3.0. A ``None`` in the
    checkpoint is never copied: the run keeps its own value."""

    name: str
    force: bool = False
    when: str | None = None
    old_name: str | None = None


def _forced(*names: str, when: str | None = None) -> tuple[Restored, ...]:
    return tuple(Restored(n, True, when) for n in names)


#: Every field Megatron-LM's ``load_args_from_checkpoint`` restores, in its order.
#: Source: NVIDIA/Megatron-LM ``megatron/training/checkpointing.py``, ``load_args_from_checkpoint`` (the
#: ``_set_arg`` calls), read at commit 0032978f335e0b72490147137948f9a45269f9d7 (main) and in megatron-core
#: 0.19.2's copy (``megatron/training/checkpointing.py`` of its wheel); the two lists agree except for the
#: MoE router fields marked "main" below. core_v0.16.1 (which wrote ../shared/megatron-lm-fixtures) spells
#: ``hybrid_layer_pattern`` ``hybrid_override_pattern``; both are written. Before the ``_set_arg`` calls the
#: function turns an ``args.disable_bias_linear`` into ``add_bias_linear`` (pai-zoo writes ``add_bias_linear``).
RESTORED_BY_MEGATRON_LM: tuple[Restored, ...] = (
    # Model args.
    Restored("num_layers"), Restored("hidden_size"), Restored("ffn_hidden_size"), Restored("seq_length"),
    Restored("num_attention_heads"),
    *_forced("num_query_groups", "group_query_attention"),
    Restored("kv_channels"), Restored("max_position_embeddings"),
    *_forced("position_embedding_type", "add_position_embedding", "use_rotary_position_embeddings", "rotary_base",
             "rotary_percent", "rotary_interleaved", "add_bias_linear", "add_qkv_bias", "squared_relu", "swiglu",
             "untie_embeddings_and_output_weights", "apply_layernorm_1p", "normalization",
             "apply_query_key_layer_scaling", "attention_dropout", "hidden_dropout"),
    # Multi-token prediction, layer spec.
    *_forced("mtp_hybrid_override_pattern", "mtp_num_layers", "mtp_use_repeated_layer", "spec"),
    # Mixture of experts (moe_ffn_hidden_size only when the checkpoint has num_experts; else it is set to None).
    *_forced("num_experts", "moe_layer_freq"),
    Restored("moe_ffn_hidden_size", True, when="num_experts"),
    Restored("moe_router_topk", True), Restored("moe_token_dispatcher_type", False),
    *_forced("moe_router_pre_softmax", "moe_grouped_gemm", "moe_single_grouped_weight", "moe_single_grouped_bias",
             "moe_shared_expert_intermediate_size",
             "moe_router_load_balancing_type", "moe_aux_loss_coeff",  # main
             "moe_router_quantile_balancing_estimation_scope", "moe_router_qb_num_bins",  # main
             "moe_router_score_function", "moe_router_enable_expert_bias", "moe_router_topk_scaling_factor",
             "moe_hybridep_routing_map_mode"),  # main
    # Mamba / hybrid models.
    *_forced("mamba_state_dim", "mamba_head_dim", "mamba_num_groups", "mamba_num_heads"),
    Restored("hybrid_layer_pattern"),
    *_forced("heterogeneous_layers_config_path", "heterogeneous_layers_config_encoded_json", "moe_latent_size"),
    # Tokenizer and vocabulary.
    *_forced("tokenizer_model", "tokenizer_type", when="use_tokenizer_model_from_checkpoint_args"),
    Restored("tiktoken_pattern", True), Restored("padded_vocab_size"),
    # Checkpoint format.
    Restored("ckpt_format"),
    # Model parallelism (only with --use-mp-args-from-checkpoint-args; checkpoint_version >= 3.0).
    Restored("tensor_model_parallel_size", True, when="use_mp_args_from_checkpoint_args",
             old_name="model_parallel_size"),
    *_forced("pipeline_model_parallel_size", "virtual_pipeline_model_parallel_size",
             when="use_mp_args_from_checkpoint_args"),
    Restored("num_layers_per_virtual_pipeline_stage", when="use_mp_args_from_checkpoint_args"),
    Restored("expert_model_parallel_size", True, when="use_mp_args_from_checkpoint_args"),
)

#: The names of :data:`RESTORED_BY_MEGATRON_LM`, each once.
RESTORED_NAMES: tuple[str, ...] = tuple(dict.fromkeys(r.name for r in RESTORED_BY_MEGATRON_LM))

#: Restored fields of features a pai-zoo model does not use (MoE in a dense model, Mamba, MTP, hybrid and
#: heterogeneous layers, tiktoken, a custom spec): written as ``None``, which ``load_args_from_checkpoint``
#: skips, so the run keeps its own defaults. ``hybrid_override_pattern`` is core_v0.16's name of
#: ``hybrid_layer_pattern``.
UNUSED_FEATURES: tuple[str, ...] = (
    "mtp_hybrid_override_pattern", "mtp_num_layers", "mtp_use_repeated_layer", "spec",
    *(n for n in RESTORED_NAMES if n.startswith(("moe_", "mamba_", "heterogeneous_"))),
    "num_experts", "hybrid_layer_pattern", "hybrid_override_pattern", "tiktoken_pattern",
)

#: Megatron-LM's defaults of the dropouts (HF decoder models have none unless their config says so).
MEGATRON_LM_DROPOUT = 0.1


def _int_if_whole(value: Any) -> Any:
    """Megatron-LM parses ``--rotary-base`` as an int; keep a fractional base as it is."""
    return int(value) if isinstance(value, float) and value.is_integer() else value


def _openai_gelu(config: McoreConfig) -> bool:
    """Megatron-LM's ``--openai-gelu`` is the tanh approximation of GELU."""
    return not config.get("gated_linear_unit") and config.get("activation_func") == "gelu_tanh"


def _family_rules(config: McoreConfig) -> tuple:
    """The :attr:`~pai_zoo.Family.megatron_lm_rules` of ``config``'s family (none when it is not installed)."""
    registry = get_registry()
    return registry.family(config.family).megatron_lm_rules if config.family in registry.families else ()


def _arch_args(config: McoreConfig, rules: tuple | None = None) -> dict[str, Any]:
    arch = dict(config.arch)
    if arch.get("ffn_hidden_size") is None:
        arch["ffn_hidden_size"] = 4 * arch["hidden_size"]  # Megatron-LM's default
    rules = _family_rules(config) if rules is None else rules
    try:
        return args_from_arch(arch, rules)
    except ConfigTranslationError:  # an MLP Megatron-LM has no flag for (gated, not SiLU): see caveats
        return args_from_arch({**arch, "gated_linear_unit": False}, rules)


def _family_args(config: McoreConfig) -> dict[str, Any]:
    """The args fields only the family's own rules write (DeepSeek's MLA fields), with their values."""
    core = _arch_args(config, ())
    return {k: v for k, v in _arch_args(config).items() if k not in core}


def megatron_lm_args(
    config: McoreConfig,
    tp: int = 1,
    pp: int = 1,
    padded_vocab_size: int | None = None,
    dtype: torch.dtype = torch.float32,
    *,
    tokenizer_type: str | None = HF_TOKENIZER_TYPE,
    tokenizer_model: str | Path | None = None,
) -> argparse.Namespace:
    """The ``args`` of a checkpoint of ``config``, under Megatron-LM's names: every field of
    :data:`RESTORED_BY_MEGATRON_LM`, plus the ones Megatron-LM records but does not restore (``layernorm_epsilon``,
    RoPE scaling, ``qk_layernorm``, ``window_size``, ``vocab_size``, dtype ...; see :func:`megatron_lm_flags`).

    ``tokenizer_model``: the tokenizer folder (Megatron-LM's ``--tokenizer-model``), or ``None`` when the
    checkpoint has none. ``padded_vocab_size`` defaults to ``config.padded_vocab_size(tp)``."""
    a = config.arch
    args = _arch_args(config)
    if a.get("num_moe_experts"):  # implementation switches of the experts, restored by Megatron-LM
        args.update(moe_grouped_gemm=bool(a.get("moe_grouped_gemm", False)),
                    moe_token_dispatcher_type=a.get("moe_token_dispatcher_type", "allgather"),
                    expert_tensor_parallel_size=tp)
    if "rotary_base" in args:
        args["rotary_base"] = _int_if_whole(args["rotary_base"])
    if args.get("window_size") is not None:
        args["window_size"] = tuple(args["window_size"])
    args.update(
        seq_length=args.get("max_position_embeddings"),
        add_position_embedding=True,  # Megatron-LM's value; the deprecated --no-position-embedding is an error
        use_rotary_position_embeddings=False,  # deprecated (True forces rope); Megatron-LM saves False
        apply_query_key_layer_scaling=False,
        attention_dropout=float(a.get("attention_dropout", 0.0)),
        hidden_dropout=float(a.get("hidden_dropout", 0.0)),
        **{name: None for name in UNUSED_FEATURES if name not in args},
        tokenizer_type=tokenizer_type,
        tokenizer_model=None if tokenizer_model is None else str(tokenizer_model),
        padded_vocab_size=padded_vocab_size if padded_vocab_size is not None else config.padded_vocab_size(tp),
        vocab_size=a["vocab_size"],
        make_vocab_size_divisible_by=config.make_vocab_size_divisible_by,
        ckpt_format="torch_dist",
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=None,
        num_layers_per_virtual_pipeline_stage=None,
        expert_model_parallel_size=1,
        params_dtype=dtype,
        bf16=dtype == torch.bfloat16,
        fp16=dtype == torch.float16,
        openai_gelu=_openai_gelu(config),
        transformer_impl="local",  # pai-zoo writes megatron-core's local layer spec (not restored: a flag)
        use_legacy_models=False,
        multi_latent_attention=bool(args.get("multi_latent_attention", False)),
    )
    return argparse.Namespace(**args)


def _moe_flags(args: dict) -> list[tuple[list[str], str]]:
    """The flags of the MoE fields ``load_args_from_checkpoint`` does not restore (grouped routing, the
    shared expert's gate, the router's dtype; the load-balancing loss, restored by Megatron-LM main only)."""
    if not args.get("num_experts"):
        return []
    out = []
    if args.get("moe_router_num_groups"):
        out.append((["--moe-router-num-groups", str(args["moe_router_num_groups"]), "--moe-router-group-topk",
                     str(args["moe_router_group_topk"])], "grouped routing is not restored"))
    if args.get("moe_shared_expert_gate"):
        out.append((["--moe-shared-expert-gate"], "the shared expert's gate is not restored"))
    if args.get("moe_router_dtype"):
        out.append((["--moe-router-dtype", args["moe_router_dtype"]], "the router's dtype is not restored"))
    balancing = args.get("moe_router_load_balancing_type") or "aux_loss"
    out.append((["--moe-router-load-balancing-type", balancing, "--moe-aux-loss-coeff",
                 repr(float(args.get("moe_aux_loss_coeff") or 0.0))],
                "the load-balancing loss is restored by Megatron-LM main only (defaults: aux_loss, 0.0)"))
    return out


def _flags_with_reasons(config: McoreConfig, dtype: torch.dtype | None = None) -> list[tuple[list[str], str]]:
    args = _arch_args(config)
    a = config.arch
    out: list[tuple[list[str], str]] = [
        (["--transformer-impl", "local"], "pai-zoo writes megatron-core's local layer spec (Megatron-LM's default "
                                          "transformer_engine names the norm weights differently)"),
        (["--norm-epsilon", repr(float(args["layernorm_epsilon"]))], "not restored (args.layernorm_epsilon); "
                                                                     "Megatron-LM's default is 1e-05"),
    ]
    for name in ("attention_dropout", "hidden_dropout"):
        value = float(a.get(name, 0.0))
        out.append(([f"--{name.replace('_', '-')}", repr(value)],
                    f"restored by Megatron-LM 0.19 and main, not by every older release; its default is "
                    f"{MEGATRON_LM_DROPOUT}"))
    if args.get("use_rope_scaling"):
        out.append((["--use-rope-scaling", "--rope-scaling-factor", repr(float(args["rope_scaling_factor"]))],
                    "Llama-3 RoPE scaling is not restored"))
    if args.get("rotary_seq_len_interpolation_factor"):
        out.append((["--rotary-seq-len-interpolation-factor", str(int(args["rotary_seq_len_interpolation_factor"]))],
                    "linear RoPE scaling is not restored"))
    if _openai_gelu(config):
        out.append((["--openai-gelu"], "the tanh approximation of GELU is not restored"))
    if args.get("qk_layernorm"):
        out.append((["--qk-layernorm"], "query/key norms are not restored"))
    if args.get("window_size") is not None:
        out.append((["--window-size", ",".join(str(int(w)) for w in args["window_size"])],
                    "sliding-window attention is not restored"))
    out += _moe_flags(args)
    own = {k: v for k, v in _family_args(config).items() if k not in RESTORED_NAMES and v not in (None, False)}
    if own:
        flags = [t for k, v in own.items() for t in ([f"--{k.replace('_', '-')}"] if v is True
                                                   else [f"--{k.replace('_', '-')}", str(v)])]
        out.append((flags, f"the {config.family} family's fields ({', '.join(own)}) are not restored"))
    if dtype in (torch.bfloat16, torch.float16):
        out.append(([f"--{'bf16' if dtype == torch.bfloat16 else 'fp16'}"], "the weights' dtype is not restored"))
    if config.make_vocab_size_divisible_by != 128:
        out.append((["--make-vocab-size-divisible-by", str(config.make_vocab_size_divisible_by)],
                    "the vocabulary padding rule is not restored (Megatron-LM's default is 128)"))
    return out


def megatron_lm_flags(config: McoreConfig, dtype: torch.dtype | None = None) -> list[str]:
    """The flags a Megatron-LM run of ``config``'s checkpoint must add to ``--load DIR --use-checkpoint-args
    --ckpt-format torch_dist``: what ``load_args_from_checkpoint`` does not restore and the model needs
    (``dtype``: the checkpoint's, for ``--bf16`` / ``--fp16``)."""
    return [token for flags, _ in _flags_with_reasons(config, dtype) for token in flags]


def megatron_lm_caveats(config: McoreConfig) -> list[str]:
    """What of ``config`` no Megatron-LM flag reproduces (empty for a Llama/Qwen2-like model)."""
    a = config.arch
    read_back: dict = {}  # the family.* keys its own args fields give back
    for rule in _family_rules(config):
        rule.to_mcore({**_arch_args(config)}, read_back)
    out = [f"{key[len('family.'):]} (pai-zoo's {config.family} plugin)" for key in sorted(a)
           if key.startswith("family.") and a[key] not in (None, False, 0)
           and (key not in read_back or read_back[key] != a[key])]
    scaling = _arch_args(config).get("pai_zoo_rope_scaling")
    if scaling:
        out.append(f"RoPE scaling {scaling} (Megatron-LM has only Llama-3 scaling with factor 8192/1/4 constants "
                   "and linear interpolation)")
    if a.get("gated_linear_unit") and a.get("activation_func", "gelu") != "silu":
        out.append(f"a gated {a.get('activation_func')} MLP (Megatron-LM has only --swiglu)")
    elif not a.get("gated_linear_unit") and a.get("activation_func", "gelu") not in ("gelu", "gelu_tanh",
                                                                                     "squared_relu"):
        out.append(f"the {a['activation_func']} activation (Megatron-LM's MLP uses gelu unless told otherwise)")
    if a.get("window_attn_skip_freq") not in (None, 0, [0, 0]):
        out.append(f"window_attn_skip_freq={a['window_attn_skip_freq']!r} (pass --window-attn-skip-freq)")
    if a.get(ROPE_SCALING) and a.get("position_embedding_type") != "rope":
        out.append("RoPE scaling without RoPE")
    if (a.get(NORM_PLACEMENT) or "pre") != "pre":
        out.append(f"norm placement {a[NORM_PLACEMENT]!r} (pai_zoo_norm_placement: norms on the attention and MLP "
                   "outputs; Megatron-LM's layers norm their inputs only)")
    if (a.get(QK_NORM) or "head") != "head":
        out.append(f"q/k norms over the whole {a[QK_NORM]} (pai_zoo_qk_norm; Megatron-LM's --qk-layernorm norms "
                   "each head)")
    return out + _unread_caveats(config, out)


#: Architecture keys that are settings or implementation switches rather than architecture (not caveats).
_NOT_ARCH = ("vocab_size", "attention_dropout", "hidden_dropout", "moe_grouped_gemm", "moe_token_dispatcher_type")


def _unread_caveats(config: McoreConfig, named: list[str]) -> list[str]:
    """The other keys of ``config`` that its args do not give back (args -> :func:`arch_from_args`), each not yet
    named by a caveat of ``named``: a core mechanism (``pai_zoo.*``) or a megatron-core option with no args field
    that pai-zoo writes."""
    a = dict(config.arch)
    if a.get("ffn_hidden_size") is None:
        a["ffn_hidden_size"] = 4 * a["hidden_size"]
    try:
        back = arch_from_args(_arch_args(config), rules=_family_rules(config))
    except ConfigTranslationError:
        return []
    out = []
    for key in differences(a, back, keys=[k for k in a if k not in _NOT_ARCH and not k.startswith("family.")]):
        short = key.split(".", 1)[-1]
        if a[key] in (None, False, 0) or any(key in c or short in c for c in named):
            continue
        if key in ("activation_func", "gated_linear_unit") and any("MLP" in c or "activation" in c for c in named):
            continue
        out.append(f"{key}={a[key]!r} (no Megatron-LM args field that pai-zoo writes carries it)")
    return out


def load_command(folder: str | Path, config: McoreConfig, dtype: torch.dtype | None = None) -> str:
    """The Megatron-LM flags that load ``folder`` (to add to a ``pretrain_gpt.py`` command line)."""
    flags = ["--load", str(folder), "--use-checkpoint-args", "--ckpt-format", "torch_dist",
             *megatron_lm_flags(config, dtype)]
    return " ".join(flags)


def _readme(folder: Path, config: McoreConfig, args: argparse.Namespace) -> str:
    """The README text; ``folder`` is where the checkpoint will be loaded from."""
    dtype = getattr(args, "params_dtype", None)
    rows = _flags_with_reasons(config, dtype)
    flag_lines = " \\\n".join(f"    {' '.join(flags)}" for flags, _ in rows)
    why = "\n".join(f"| `{' '.join(flags)}` | {reason} |" for flags, reason in rows)
    restored = ", ".join(f"`{n}`" for n in RESTORED_NAMES)
    tokenizer = getattr(args, "tokenizer_model", None)
    tok_line = (f"The tokenizer is `{tokenizer}` (`args.tokenizer_model`, type `{args.tokenizer_type}`); Megatron-LM "
                "restores it, so pass `--tokenizer-model DIR` only if you moved the folder."
                if tokenizer else
                "The checkpoint has no tokenizer: pass `--tokenizer-type HuggingFaceTokenizer --tokenizer-model DIR`.")
    caveats = megatron_lm_caveats(config)
    caveat_text = ("\n## What Megatron-LM cannot reproduce\n\n" + "\n".join(f"- {c}" for c in caveats) + "\n"
                   if caveats else "")
    model = (f"{args.num_layers} layers, hidden size {args.hidden_size}, {args.num_attention_heads} attention heads "
             f"({args.num_query_groups} query groups), vocabulary {args.vocab_size} padded to "
             f"{args.padded_vocab_size}, dtype {str(dtype).replace('torch.', '')}")
    return f"""# Megatron-Core checkpoint ({config.family}), written by pai-zoo

A Megatron-Core distributed checkpoint (`torch_dist`, checkpoint version 3.0, iteration `release`) of a
{config.family} model converted from Hugging Face: {model}. It was saved for tensor-parallel size
{args.tensor_model_parallel_size} and pipeline-parallel size {args.pipeline_model_parallel_size}; other layouts
load it too (megatron-core reshards on load).

- `latest_checkpointed_iteration.txt`, `release/`: what Megatron-LM's `--load` reads; `release/common.pt` holds
  the `args` Megatron-LM restores with `--use-checkpoint-args`.
- `pai_zoo.json`, `hf/`: what pai-zoo reads back (`pai-zoo convert {folder.name} --to hf`).

## Load it with Megatron-LM

Add to the `pretrain_gpt.py` (or `torchrun ... pretrain_gpt.py`) command line:

```
    --load {folder} --use-checkpoint-args --ckpt-format torch_dist \\
{flag_lines}
```

{tok_line}

`load_args_from_checkpoint` (in `megatron/training/checkpointing.py`) restores from the checkpoint: {restored}.
It does not restore the flags above:

| flag | why |
|---|---|
{why}
{caveat_text}"""


def write_readme(folder: str | Path, config: McoreConfig, args: argparse.Namespace,
                 load_dir: str | Path | None = None) -> Path:
    """Write ``README.md`` into the checkpoint ``folder``: what it is and how Megatron-LM loads it.
    ``load_dir``: the folder's final place, named in the command (default ``folder``; a conversion writes
    into a temporary folder first)."""
    folder = Path(folder)
    path = folder / README
    path.write_text(_readme(Path(load_dir) if load_dir is not None else folder, config, args))
    return path


def as_megatron_lm_dict(args: argparse.Namespace | Mapping[str, Any]) -> dict[str, Any]:
    """The restored fields of ``args`` as a dict (what ``load_args_from_checkpoint`` would copy)."""
    values = dict(args) if isinstance(args, Mapping) else vars(args)
    return {name: values.get(name) for name in RESTORED_NAMES}
