"""The ``args`` of pai-zoo's ``torch_dist`` checkpoints, field by field against Megatron-LM's
``load_args_from_checkpoint`` (:data:`pai_zoo.mcore.megatron_lm_args.RESTORED_BY_MEGATRON_LM`).

Expected values come from the Hugging Face config itself, never from pai-zoo's own translation; the
Megatron-LM fixture (``../shared/megatron-lm-fixtures``, written by Megatron-LM core_v0.16.1) checks the
names and values against what Megatron-LM itself saves for the same model.
"""
from __future__ import annotations

import argparse
import io
import math
from pathlib import Path

import pytest
import torch

from pai_zoo.families.registry import get_registry
from pai_zoo.hf import models as hf
from pai_zoo.mcore import megatron_lm_args as mla
from pai_zoo.plugin import megatron_args

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "megatron-lm-fixtures"
TOKENIZER_DIR = "/ckpt/hf"

#: (preset, what it covers): GQA + Llama-3 RoPE scaling, Llama with biases + a RoPE scaling Megatron-LM has no
#: flag for, sliding window, Qwen2 qkv bias + tied embeddings, the Qwen2 odd preset, a tied Llama.
PRESETS = ["llama3-tiny", "llama-odd", "mistral-odd", "qwen2-tiny", "qwen2-odd", "llama3.2-1b"]

#: Keys of an architecture that are training settings or pai-zoo's own, not carried back by ``arch_from_args``.
NOT_ARCH = ("vocab_size", "attention_dropout", "hidden_dropout")


def _hf_and_config(preset: str):
    family, raw = get_registry().preset(preset)
    full = hf.config_dict(hf.hf_config(family, raw))  # the config.json transformers writes (defaults filled)
    return family, full, family.to_mcore_config(full)


def _rope(cfg: dict) -> dict:
    return cfg.get("rope_parameters") or {"rope_theta": cfg.get("rope_theta", 10000.0), **(cfg.get("rope_scaling")
                                                                                            or {})}


def _padded(vocab: int, tp: int, divisor: int = 128) -> int:
    return math.ceil(vocab / (divisor * tp)) * divisor * tp


def expected_from_hf(family_name: str, cfg: dict, tp: int, pp: int, dtype: torch.dtype) -> dict:
    """Every restored field (and the recorded-only ones), from the Hugging Face config's own values."""
    heads, kv = cfg["num_attention_heads"], cfg.get("num_key_value_heads") or cfg["num_attention_heads"]
    qwen2 = family_name == "qwen2"
    rope = _rope(cfg)
    llama3 = rope.get("rope_type") == "llama3"
    builtin = llama3 and (rope["low_freq_factor"], rope["high_freq_factor"],
                          rope["original_max_position_embeddings"]) == (1.0, 4.0, 8192)
    # Qwen2 keeps a sliding_window it does not use unless use_sliding_window; Mistral uses it when set.
    sliding = cfg.get("sliding_window") if cfg.get("use_sliding_window", not qwen2) else None
    expected = dict(
        num_layers=cfg["num_hidden_layers"], hidden_size=cfg["hidden_size"], ffn_hidden_size=cfg["intermediate_size"],
        seq_length=cfg["max_position_embeddings"], num_attention_heads=heads, num_query_groups=kv,
        group_query_attention=kv != heads, kv_channels=cfg.get("head_dim") or cfg["hidden_size"] // heads,
        max_position_embeddings=cfg["max_position_embeddings"], position_embedding_type="rope",
        add_position_embedding=True, use_rotary_position_embeddings=False, rotary_base=rope["rope_theta"],
        rotary_percent=1.0, rotary_interleaved=False,
        add_bias_linear=bool(cfg.get("mlp_bias", False)),
        add_qkv_bias=True if qwen2 else bool(cfg.get("attention_bias", False)),
        squared_relu=False, swiglu=cfg["hidden_act"] == "silu",
        untie_embeddings_and_output_weights=not cfg["tie_word_embeddings"],
        apply_layernorm_1p=False, normalization="RMSNorm", apply_query_key_layer_scaling=False,
        attention_dropout=cfg.get("attention_dropout", 0.0), hidden_dropout=0.0,
        tokenizer_model=TOKENIZER_DIR, tokenizer_type="HuggingFaceTokenizer", tiktoken_pattern=None,
        padded_vocab_size=_padded(cfg["vocab_size"], tp), ckpt_format="torch_dist",
        tensor_model_parallel_size=tp, pipeline_model_parallel_size=pp, virtual_pipeline_model_parallel_size=None,
        num_layers_per_virtual_pipeline_stage=None, expert_model_parallel_size=1,
        # Recorded, not restored (the flags of megatron_lm_flags):
        layernorm_epsilon=cfg["rms_norm_eps"], vocab_size=cfg["vocab_size"], make_vocab_size_divisible_by=128,
        use_rope_scaling=builtin, rope_scaling_factor=rope["factor"] if builtin else 8.0,
        qk_layernorm=False, window_size=None if sliding is None else (sliding - 1, 0),
        params_dtype=dtype, bf16=dtype == torch.bfloat16, fp16=dtype == torch.float16,
    )
    # A dense model uses none of these: None, which load_args_from_checkpoint skips (the run keeps its defaults).
    expected.update(dict.fromkeys(mla.UNUSED_FEATURES))
    return expected


@pytest.mark.parametrize("tp,pp,dtype", [(1, 1, torch.bfloat16), (2, 2, torch.float32)])
@pytest.mark.parametrize("preset", PRESETS)
def test_every_restored_field_matches_the_hf_config(preset, tp, pp, dtype):
    family, cfg, config = _hf_and_config(preset)
    ns = mla.megatron_lm_args(config, tp, pp, config.padded_vocab_size(tp), dtype, tokenizer_model=TOKENIZER_DIR)
    assert isinstance(ns, argparse.Namespace)
    expected = expected_from_hf(family.name, cfg, tp, pp, dtype)
    assert set(mla.RESTORED_NAMES) <= set(expected)  # the expectation covers every restored field
    for name in expected:
        assert hasattr(ns, name), f"{preset}: args has no {name} (Megatron-LM's name)"
        got, want = getattr(ns, name), expected[name]
        same = got is want if isinstance(want, bool) or want is None else got == want
        assert same, f"{preset}: args.{name}={got!r}, the HF config says {want!r}"
    assert not hasattr(ns, "norm_epsilon")  # Megatron-LM's field is layernorm_epsilon (its flag --norm-epsilon)


def test_values_the_presets_exercise():
    """The presets above do cover what they claim (so the field-by-field test sees each case)."""
    seen = {p: mla.megatron_lm_args(_hf_and_config(p)[2]) for p in PRESETS}
    assert seen["llama3-tiny"].use_rope_scaling and seen["llama3-tiny"].rope_scaling_factor == 8.0
    assert seen["llama-odd"].add_qkv_bias and seen["llama-odd"].add_bias_linear
    assert seen["llama-odd"].pai_zoo_rope_scaling["factor"] == 16.0 and not seen["llama-odd"].use_rope_scaling
    assert seen["mistral-odd"].window_size is not None
    assert seen["qwen2-tiny"].add_qkv_bias and not seen["qwen2-tiny"].add_bias_linear
    assert not seen["qwen2-tiny"].untie_embeddings_and_output_weights
    assert not seen["llama3.2-1b"].untie_embeddings_and_output_weights
    assert seen["qwen2-odd"].kv_channels == 20 != seen["qwen2-odd"].hidden_size // seen["qwen2-odd"].num_attention_heads


@pytest.mark.parametrize("preset", ["llama-odd", "qwen2-odd"])
def test_odd_presets_are_the_families_own(preset):
    assert get_registry().family(preset.split("-")[0]).odd == preset


@pytest.mark.parametrize("preset", PRESETS)
def test_round_trip_through_arch_from_args(preset):
    """Megatron-LM args -> architecture (the reader's translation) gives the preset's architecture back."""
    _, _, config = _hf_and_config(preset)
    ns = mla.megatron_lm_args(config, 2, 1, None, torch.bfloat16, tokenizer_model=TOKENIZER_DIR)
    back = megatron_args.arch_from_args(vars(ns))
    keys = [k for k in config.arch if k not in NOT_ARCH]
    assert megatron_args.differences(config.arch, back, keys=keys) == []
    assert megatron_args.differences(back, config.arch) == []


@pytest.mark.megatron
@pytest.mark.parametrize("preset", ["llama3-tiny", "qwen2-tiny"])
def test_args_survive_the_safe_unpickle_of_common_pt(preset):
    """What convert --to mcore writes as common.pt ({"args": ..., "checkpoint_version": 3.0, "iteration": 0}) reads
    back through pai-zoo's weights_only loader with every restored field intact."""
    from pai_zoo.formats.safe_pickle import safe_load

    _, _, config = _hf_and_config(preset)
    ns = mla.megatron_lm_args(config, 1, 1, None, torch.bfloat16, tokenizer_model=TOKENIZER_DIR)
    buf = io.BytesIO()
    torch.save({"args": ns, "checkpoint_version": 3.0, "iteration": 0}, buf)
    buf.seek(0)
    loaded = safe_load(buf, where="common.pt")
    assert vars(loaded["args"]) == vars(ns)
    assert mla.as_megatron_lm_dict(loaded["args"]) == mla.as_megatron_lm_dict(ns)


def test_restored_list_is_megatron_lms():
    names = mla.RESTORED_NAMES
    assert len(names) == len(mla.RESTORED_BY_MEGATRON_LM)  # each _set_arg once (mtp_num_layers deduplicated)
    for name in ("num_layers", "num_query_groups", "kv_channels", "rotary_base", "add_qkv_bias", "swiglu",
                 "untie_embeddings_and_output_weights", "normalization", "attention_dropout", "hidden_dropout",
                 "tokenizer_model", "tokenizer_type", "padded_vocab_size", "ckpt_format",
                 "tensor_model_parallel_size"):
        assert name in names
    for name in ("layernorm_epsilon", "norm_epsilon", "use_rope_scaling", "rope_scaling_factor", "qk_layernorm",
                 "vocab_size", "params_dtype", "bf16", "window_size", "transformer_impl"):
        assert name not in names  # recorded but not restored: megatron_lm_flags covers them
    forced = {r.name for r in mla.RESTORED_BY_MEGATRON_LM if r.force}
    assert {"num_query_groups", "swiglu", "rotary_base"} <= forced
    assert not {"num_layers", "kv_channels", "padded_vocab_size", "ckpt_format"} & forced
    by_name = {r.name: r for r in mla.RESTORED_BY_MEGATRON_LM}
    assert by_name["tokenizer_model"].when == "use_tokenizer_model_from_checkpoint_args"
    assert by_name["pipeline_model_parallel_size"].when == "use_mp_args_from_checkpoint_args"


#: Megatron-LM's flag -> its args field, where the two names differ.
_FLAG_DEST = {"--norm-epsilon": "layernorm_epsilon"}


def _flag_dests(flags: list[str]) -> dict[str, str | None]:
    out, i = {}, 0
    while i < len(flags):
        flag = flags[i]
        value = flags[i + 1] if i + 1 < len(flags) and not flags[i + 1].startswith("--") else None
        out[_FLAG_DEST.get(flag, flag[2:].replace("-", "_"))] = value
        i += 2 if value is not None else 1
    return out


def test_flags_are_what_load_args_from_checkpoint_does_not_restore():
    _, cfg, config = _hf_and_config("llama3-tiny")
    flags = mla.megatron_lm_flags(config, torch.bfloat16)
    dests = _flag_dests(flags)
    assert dests == {"transformer_impl": "local", "layernorm_epsilon": repr(cfg["rms_norm_eps"]),
                     "attention_dropout": "0.0", "hidden_dropout": "0.0", "use_rope_scaling": None,
                     "rope_scaling_factor": "8.0", "bf16": None}
    # None of them is restored, but the dropouts (restored by newer Megatron-LM only; passing them is harmless).
    assert set(dests) & set(mla.RESTORED_NAMES) == {"attention_dropout", "hidden_dropout"}

    qwen = _flag_dests(mla.megatron_lm_flags(_hf_and_config("qwen2-tiny")[2]))
    assert "use_rope_scaling" not in qwen and "bf16" not in qwen and qwen["layernorm_epsilon"] == "1e-06"
    mistral = _flag_dests(mla.megatron_lm_flags(_hf_and_config("mistral-odd")[2]))
    _, mcfg, _ = _hf_and_config("mistral-odd")
    assert mistral["window_size"] == f"{mcfg['sliding_window'] - 1},0"


def test_caveats_name_what_no_flag_reproduces():
    assert mla.megatron_lm_caveats(_hf_and_config("llama3-tiny")[2]) == []
    assert mla.megatron_lm_caveats(_hf_and_config("qwen2-tiny")[2]) == []
    (odd,) = mla.megatron_lm_caveats(_hf_and_config("llama-odd")[2])
    assert "RoPE scaling" in odd


def test_readme_says_how_to_load(tmp_path):
    _, _, config = _hf_and_config("llama3-tiny")
    ns = mla.megatron_lm_args(config, 1, 1, None, torch.bfloat16, tokenizer_model=tmp_path / "hf")
    path = mla.write_readme(tmp_path, config, ns)
    assert path == tmp_path / "README.md"
    text = path.read_text()
    assert f"--load {tmp_path} --use-checkpoint-args --ckpt-format torch_dist" in text
    for flag in mla.megatron_lm_flags(config, torch.bfloat16):
        assert flag in text
    assert str(tmp_path / "hf") in text and "load_args_from_checkpoint" in text
    assert mla.load_command(tmp_path, config, torch.bfloat16).startswith(f"--load {tmp_path} --use-checkpoint-args")

    bare = mla.megatron_lm_args(config, 1, 1, None, torch.float32, tokenizer_model=None)
    text = mla.write_readme(tmp_path, config, bare, load_dir="/final/ckpt").read_text()
    assert "has no tokenizer" in text and "--load /final/ckpt --use-checkpoint-args" in text
    assert "--bf16" not in text


# -- against Megatron-LM's own args for the same model ------------------------------------------------------------
#: Fields whose Megatron-LM value is a choice of its converter, not the model's: its dropouts (0.1, Megatron's
#: default; the HF model has none) and the tokenizer path (the converter's own).
_CONVERTER_CHOICES = {"attention_dropout", "hidden_dropout", "tokenizer_model"}


@pytest.mark.megatron
def test_same_names_and_values_as_megatron_lm_writes():
    common = FIXTURES / "llama-dist-tp2" / "iter_0000001" / "common.pt"
    if not common.is_file():
        pytest.skip(f"Megatron-LM fixtures not present ({FIXTURES})")
    from pai_zoo.formats.safe_pickle import safe_load

    theirs = vars(safe_load(common)["args"])
    family = get_registry().family("llama")
    import json

    cfg = json.loads((FIXTURES / "llama-hf" / "config.json").read_text())
    config = family.to_mcore_config(hf.config_dict(hf.hf_config(family, cfg)))
    ours = vars(mla.megatron_lm_args(config, 2, 1, None, theirs["params_dtype"], tokenizer_model=None))
    compared = 0
    for name in mla.RESTORED_NAMES:
        if name in _CONVERTER_CHOICES or theirs.get(name) is None:
            continue  # absent from core_v0.16.1 or None there (not restored)
        if name in mla.UNUSED_FEATURES:
            continue  # Megatron-LM's defaults of features the model does not use; pai-zoo writes None
        assert ours[name] == theirs[name], f"{name}: pai-zoo {ours[name]!r}, Megatron-LM {theirs[name]!r}"
        assert type(ours[name]) is type(theirs[name]), name
        compared += 1
    for name in ("layernorm_epsilon", "vocab_size", "make_vocab_size_divisible_by", "use_rope_scaling",
                 "rope_scaling_factor", "qk_layernorm", "params_dtype", "bf16", "fp16", "transformer_impl"):
        assert ours[name] == theirs[name], name
    assert compared >= 25
    assert (ours["attention_dropout"], theirs["attention_dropout"]) == (0.0, 0.1)  # why the flag is printed


# -- what a Megatron-LM run ends up with: its defaults, the printed flags, then load_args_from_checkpoint -----------
#: Megatron-LM's defaults of the fields that matter here (megatron/training/arguments.py).
_MEGATRON_LM_DEFAULTS = dict(
    layernorm_epsilon=1e-5, attention_dropout=0.1, hidden_dropout=0.1, use_rope_scaling=False,
    rope_scaling_factor=8.0, rotary_seq_len_interpolation_factor=None, qk_layernorm=False, window_size=None,
    transformer_impl="transformer_engine", bf16=False, fp16=False, rotary_base=10000, rotary_percent=1.0,
    position_embedding_type="learned_absolute", normalization="LayerNorm", swiglu=False, add_bias_linear=True,
    add_qkv_bias=False, untie_embeddings_and_output_weights=False, group_query_attention=False, num_query_groups=1,
    use_tokenizer_model_from_checkpoint_args=True, use_mp_args_from_checkpoint_args=False,
)


def _parse(value: str | None):
    if value is None:
        return True  # a store_true flag
    if "," in value:
        return tuple(int(v) for v in value.split(","))
    for kind in (int, float):
        try:
            return kind(value)
        except ValueError:
            pass
    return value


def _run_args(checkpoint_args: argparse.Namespace, flags: list[str]) -> dict:
    """Megatron-LM's ``_set_arg`` rules (checkpointing.py) applied to a run started with ``flags``."""
    run = dict(_MEGATRON_LM_DEFAULTS)
    run.update({dest: _parse(v) for dest, v in _flag_dests(flags).items()})
    ckpt = vars(checkpoint_args)
    for r in mla.RESTORED_BY_MEGATRON_LM:
        if r.when == "num_experts" or (r.when and not run.get(r.when)):
            continue
        if not r.force and run.get(r.name) is not None:
            continue
        if ckpt.get(r.name) is not None:
            run[r.name] = ckpt[r.name]
    return run


@pytest.mark.parametrize("preset", ["llama3-tiny", "qwen2-tiny", "qwen2-odd", "mistral-odd", "llama3.2-1b"])
def test_run_with_the_printed_flags_has_the_hf_model(preset):
    """Restored fields + printed flags give a Megatron-LM run the preset's whole architecture (and no dropout)."""
    _, cfg, config = _hf_and_config(preset)
    ns = mla.megatron_lm_args(config, 1, 1, None, torch.bfloat16, tokenizer_model=TOKENIZER_DIR)
    run = _run_args(ns, mla.megatron_lm_flags(config, torch.bfloat16))
    arch = megatron_args.arch_from_args(run)
    assert megatron_args.differences(config.arch, arch, keys=[k for k in config.arch if k not in NOT_ARCH]) == []
    assert (run["attention_dropout"], run["hidden_dropout"]) == (0.0, 0.0)
    assert run["layernorm_epsilon"] == cfg["rms_norm_eps"] and run["bf16"] is True
    assert run["transformer_impl"] == "local" and run["tokenizer_model"] == TOKENIZER_DIR


def test_without_the_flags_a_run_differs():
    """The flags are needed: without them Megatron-LM keeps its own epsilon, dropouts and no RoPE scaling."""
    _, _, config = _hf_and_config("llama3-tiny")
    config.arch["layernorm_epsilon"] = 1e-6
    run = _run_args(mla.megatron_lm_args(config), [])
    lost = megatron_args.differences(config.arch, megatron_args.arch_from_args(run),
                                     keys=[k for k in config.arch if k not in NOT_ARCH])
    assert set(lost) == {"layernorm_epsilon", "pai_zoo.rope_scaling"}
    assert run["attention_dropout"] == 0.0  # restored (force=True) by the Megatron-LM this list was read from


@pytest.mark.megatron
@pytest.mark.parametrize("preset,tp,pp", [("llama3-tiny", 2, 2), ("qwen2-tiny", 1, 1)])
def test_convert_to_mcore_writes_them_in_common_pt(preset, tp, pp, tmp_path):
    """End to end: ``pai_zoo.convert(hf, dst, to="mcore")``'s ``release/common.pt`` carries every restored field
    with the values of the HF folder's config.json (the tokenizer path is checked above, where it is passed)."""
    import json

    import pai_zoo
    from pai_zoo.formats.safe_pickle import safe_load

    family, _, _ = _hf_and_config(preset)
    handle = pai_zoo.load(preset, backend="hf", seed=0)
    handle.model.save_pretrained(tmp_path / "hf")
    cfg = json.loads((tmp_path / "hf" / "config.json").read_text())
    pai_zoo.convert(tmp_path / "hf", tmp_path / "m", to="mcore", tp=tp, pp=pp)
    common = safe_load(tmp_path / "m" / "release" / "common.pt")
    assert (common["checkpoint_version"], common["iteration"]) == (3.0, 0)
    args = common["args"]
    dtype = args.params_dtype
    expected = expected_from_hf(family.name, hf.config_dict(hf.hf_config(family, cfg)), tp, pp, dtype)
    for name in expected:
        if name == "tokenizer_model":
            continue
        got, want = getattr(args, name), expected[name]
        same = got is want if isinstance(want, bool) or want is None else got == want
        assert same, f"common.pt args.{name}={got!r}, config.json says {want!r}"


# -- mixture of experts ---------------------------------------------------------------------------------------------
MOE_PRESETS = ["mixtral-odd", "qwen2-moe-tiny", "qwen2-moe-odd", "qwen3-moe-odd", "glm4-moe-tiny", "glm4-moe-odd"]


def _moe_expected(cfg: dict) -> dict:
    """Megatron-LM's MoE args of an HF MoE config, from its own keys (megatron/training/arguments.py names)."""
    layers = cfg["num_hidden_layers"]
    experts = cfg.get("num_experts") or cfg.get("num_local_experts") or cfg.get("n_routed_experts")
    expert_ffn = cfg.get("moe_intermediate_size") or cfg["intermediate_size"]
    glm = cfg["model_type"] == "glm4_moe"
    if cfg.get("first_k_dense_replace"):
        k = cfg["first_k_dense_replace"]
        freq = [0] * k + [1] * (layers - k)
    else:
        step, dense = cfg.get("decoder_sparse_step") or 1, cfg.get("mlp_only_layers") or []
        freq = [int(i not in dense and (i + 1) % step == 0) for i in range(layers)]
    shared = cfg.get("shared_expert_intermediate_size") or (cfg.get("n_shared_experts") or 0) * expert_ffn or None
    grouped = (cfg.get("n_group") or 1) > 1
    return dict(
        num_experts=experts, moe_router_topk=cfg["num_experts_per_tok"], moe_ffn_hidden_size=expert_ffn,
        moe_layer_freq=1 if all(freq) else freq,
        moe_router_score_function="sigmoid" if glm else "softmax",
        moe_router_pre_softmax=False if glm or cfg["model_type"] == "mixtral" else not cfg["norm_topk_prob"],
        moe_router_enable_expert_bias=glm, moe_shared_expert_intermediate_size=shared,
        moe_shared_expert_gate=cfg["model_type"] == "qwen2_moe" and bool(shared),
        moe_router_num_groups=cfg["n_group"] if grouped else None,
        moe_router_group_topk=cfg["topk_group"] if grouped else None,
        moe_router_load_balancing_type="none" if glm else "aux_loss",
        moe_aux_loss_coeff=0.0 if glm else cfg["router_aux_loss_coef"],
    )


@pytest.mark.parametrize("preset", MOE_PRESETS)
def test_moe_args_match_the_hf_config(preset):
    """A MoE checkpoint's args carry its experts under Megatron-LM's names, so ``--use-checkpoint-args`` builds a
    mixture of experts (before, every moe_* field was written as None: a dense model)."""
    _, cfg, config = _hf_and_config(preset)
    ns = vars(mla.megatron_lm_args(config, 1, 1, None, torch.float32))
    for name, want in _moe_expected(cfg).items():
        assert ns[name] == want, f"{preset}: args.{name}={ns[name]!r}, the HF config says {want!r}"
    assert ns["moe_grouped_gemm"] is False and ns["moe_token_dispatcher_type"] == "alltoall"


def test_dense_args_have_no_experts():
    ns = vars(mla.megatron_lm_args(_hf_and_config("qwen2-odd")[2]))
    assert ns["num_experts"] is None and ns["moe_router_topk"] is None


@pytest.mark.parametrize("preset", MOE_PRESETS)
def test_moe_args_round_trip_and_claim_their_family(preset):
    """args -> architecture gives the preset's experts back, and exactly its family claims them."""
    family, _, config = _hf_and_config(preset)
    ns = mla.megatron_lm_args(config, 1, 1, None, torch.float32)
    back = megatron_args.arch_from_args(vars(ns))
    keys = [k for k in config.arch if k not in NOT_ARCH and not k.startswith("family.")
            and k not in ("moe_grouped_gemm", "moe_token_dispatcher_type")]
    assert megatron_args.differences(config.arch, back, keys=keys) == []
    assert megatron_args.differences(back, config.arch) == []
    assert [f.name for f in get_registry().families_for_megatron_args(back)] == [family.name]


def test_a_changed_routing_field_is_seen():
    """The comparison can fail: a checkpoint with other routing than the family's is not taken for it."""
    _, _, config = _hf_and_config("qwen2-moe-odd")
    for field, value in (("moe_router_topk", 1), ("moe_router_pre_softmax", True), ("moe_layer_freq", [1, 0, 1])):
        args = {**vars(mla.megatron_lm_args(config)), field: value}
        assert field in megatron_args.differences(megatron_args.arch_from_args(args), config.arch)


_MOE_RUN_DEFAULTS = dict(num_experts=None, moe_router_topk=2, moe_router_num_groups=None, moe_router_group_topk=None,
                         moe_shared_expert_gate=False, moe_router_dtype=None, moe_router_load_balancing_type="aux_loss",
                         moe_aux_loss_coeff=0.0, moe_layer_freq=1, moe_ffn_hidden_size=None)


@pytest.mark.parametrize("preset", ["qwen2-moe-odd", "glm4-moe-odd"])
def test_a_moe_run_with_the_printed_flags_has_the_hf_model(preset):
    """Restored fields + printed flags give a Megatron-LM run the MoE model's routing (the gate, grouped routing
    and router dtype are not restored, so they are printed)."""
    _, _, config = _hf_and_config(preset)
    ns = mla.megatron_lm_args(config, 1, 1, None, torch.float32, tokenizer_model=TOKENIZER_DIR)
    flags = mla.megatron_lm_flags(config, torch.float32)
    run = {**_MOE_RUN_DEFAULTS, **_run_args(ns, flags)}
    run.update({dest: _parse(v) for dest, v in _flag_dests(flags).items()})
    if ns.num_experts:
        run["moe_ffn_hidden_size"] = ns.moe_ffn_hidden_size  # restored when the checkpoint has num_experts
    arch = megatron_args.arch_from_args(run)
    keys = [k for k in config.arch if k not in NOT_ARCH and not k.startswith("family.")
            and k not in ("moe_grouped_gemm", "moe_token_dispatcher_type", *megatron_args.MOE_SETTINGS)]
    assert megatron_args.differences(config.arch, arch, keys=keys) == []
    without = megatron_args.arch_from_args({**_MOE_RUN_DEFAULTS, **_run_args(ns, [])})
    assert megatron_args.differences(config.arch, without, keys=keys)  # the flags are needed
