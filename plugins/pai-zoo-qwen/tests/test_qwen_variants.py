"""Qwen variants beyond the tiny presets (sliding windows, tied/untied heads, MHA/MQA, biases), name resolution,
the untrimmed Qwen vocabulary, and refusals of what megatron-core cannot express. Equivalence is checked with the
conformance suite's own checks."""
import pytest

import pai_zoo
from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks

REGISTRY = get_registry()

VARIANTS = {
    "qwen2: sliding window 4 on layer 1 only (max_window_layers=1)":
        ("qwen2", "qwen2-tiny", {"use_sliding_window": True, "sliding_window": 4, "max_window_layers": 1}),
    "qwen2: sliding window 5 on every layer": (
        "qwen2", "qwen2-tiny", {"use_sliding_window": True, "sliding_window": 5, "max_window_layers": 0}),
    "qwen2: untied head, multi-head attention (Qwen1.5-7B)":
        ("qwen2", "qwen2-tiny", {"tie_word_embeddings": False, "num_key_value_heads": 8}),
    "qwen2: multi-query": ("qwen2", "qwen2-tiny", {"num_key_value_heads": 1}),
    "qwen2: head_dim != hidden / heads (config.json key transformers' Qwen2 reads)":
        ("qwen2", "qwen2-tiny", {"head_dim": 16}),
    "qwen3: tied head (Qwen3-0.6B)": ("qwen3", "qwen3-tiny", {"tie_word_embeddings": True}),
    "qwen3: head_dim = hidden / heads": ("qwen3", "qwen3-tiny", {"head_dim": 8}),
    "qwen v1: biases everywhere (no_bias=false)": ("qwen", "qwen-v1-tiny", {"no_bias": False}),
    "qwen v1: full rotary, tied embeddings": ("qwen", "qwen-v1-tiny", {"rotary_pct": 1.0, "tie_word_embeddings": True}),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_conforms(variant):
    family, preset, overrides = VARIANTS[variant]
    checks.check_variant(REGISTRY.family(family), preset, **overrides)


def test_sliding_window_layers_reach_megatron_per_layer():
    case = checks.build_case(REGISTRY.family("qwen2"), use_sliding_window=True, sliding_window=4, max_window_layers=1)
    assert case.hf_config.layer_types == ["full_attention", "sliding_attention"]
    assert case.mcore_config["window_size"] == [3, 0]
    assert case.mcore_config["window_attn_skip_freq"] == [0, 1]
    windows = [layer.self_attention.core_attention.scale_mask_softmax.window_size
               for layer in case.mcore_model.decoder.layers]
    assert [None if w is None else list(w) for w in windows] == [None, [3, 0]]


def test_sliding_window_is_not_ignored():
    """The window changes the logits (so the variant test above compares something)."""
    import torch

    from pai_zoo.mcore.forward import mcore_forward

    family = REGISTRY.family("qwen2")
    windowed = checks.build_case(family, use_sliding_window=True, sliding_window=4, max_window_layers=0)
    full = checks.build_case(family)
    ids = torch.arange(16).unsqueeze(0) * 7 % 1000
    with torch.no_grad():
        delta = (mcore_forward(windowed.mcore_model, ids) - mcore_forward(full.mcore_model, ids)).abs()
    assert delta[:, :4].max() < 1e-5 and delta[:, 8:].max() > 1e-2


def test_names_resolve_to_the_right_family():
    for name, family in {"qwen2": "qwen2", "Qwen1.5": "qwen2", "qwen2.5": "qwen2", "qwen3": "qwen3",
                         "qwen": "qwen", "qwen-v1": "qwen"}.items():
        assert REGISTRY.family(name).name == family, name
    for preset, family in {"qwen1.5-0.5b": "qwen2", "qwen2-72b": "qwen2", "qwen2.5-7b": "qwen2",
                           "qwen3-0.6b": "qwen3", "qwen-7b": "qwen"}.items():
        assert REGISTRY.preset(preset)[0].name == family, preset


def test_load_qwen2_gives_a_qwen2_model():
    mcore = pai_zoo.load("qwen2", backend="mcore")
    hf = pai_zoo.load("qwen2", backend="hf")
    assert mcore.family.name == "qwen2" and type(hf.model).__name__ == "Qwen2ForCausalLM"
    assert mcore.mcore_config["add_qkv_bias"] and not mcore.mcore_config.get("qk_layernorm")
    assert "decoder.layers.0.self_attention.linear_qkv.bias" in mcore.model.state_dict()
    qwen3 = pai_zoo.load("qwen3", backend="mcore")
    assert qwen3.mcore_config["qk_layernorm"] and qwen3.mcore_config["kv_channels"] == 16
    assert type(pai_zoo.load("qwen-v1-tiny", backend="hf").model).__name__ == "QWenLMHeadModel"


def test_every_embedding_row_is_kept_and_padding_trimmed_exactly():
    """Qwen's table has more rows (vocab_size) than its tokenizer has tokens: all rows survive, and only
    Megatron's padding to a multiple of 128 is dropped on the way back."""
    import torch

    handle = pai_zoo.load("qwen2-tiny", backend="mcore")
    mcore_rows = handle.model.state_dict()["embedding.word_embeddings.weight"]
    assert mcore_rows.shape[0] == 1024 and handle.vocab_size == 1000
    hf_rows = handle.hf_state_dict()["model.embed_tokens.weight"]
    assert hf_rows.shape[0] == 1000 and torch.equal(hf_rows, mcore_rows[:1000])


def test_qwen2_head_dim_reaches_megatron_and_is_written_back_only_when_given():
    """Qwen2Config declares no head_dim, yet transformers' Qwen2 reads one from config.json: it must become
    kv_channels (it used to be dropped, so a 20-channel head was built as 72 / 6 = 12 channels)."""
    from pai_zoo import hf

    family = REGISTRY.family("qwen2")
    for head_dim in (20, None):
        raw = {**family.presets["qwen2-odd"], "head_dim": head_dim}
        if head_dim is None:
            del raw["head_dim"]
        config = hf.config_dict(hf.hf_config(family, raw))
        mcore = family.to_mcore_config(config)
        assert mcore.kv_channels == (head_dim or 72 // 6)
        back = hf.config_dict(hf.hf_config_from_mcore(family, mcore))
        assert back.get("head_dim", "absent") == (head_dim or "absent")
    model = hf.build_hf_model(family, hf.hf_config(family, family.presets["qwen2-odd"]))
    assert model.model.layers[0].self_attn.q_proj.weight.shape == (6 * 20, 72)  # transformers does use it


@pytest.mark.parametrize("family, preset, overrides, message", [
    ("qwen3", "qwen3-tiny", {"attention_bias": True}, "supports only attention_bias=False"),
    ("qwen2", "qwen2-tiny", {"hidden_act": "gelu"}, "hidden_act='gelu'"),
    ("qwen2", "qwen2-tiny", {"rope_parameters": {"rope_type": "dynamic", "rope_theta": 1e6, "factor": 4.0,
                                                 "original_max_position_embeddings": 32768}}, "rope_type='dynamic'"),
    ("qwen", "qwen-v1-tiny", {"kv_channels": 8}, "kv_channels x num_attention_heads must equal hidden_size"),
    ("qwen", "qwen-v1-tiny", {"intermediate_size": 321}, "intermediate_size=321"),
    ("qwen", "qwen-v1-tiny", {"scale_attn_weights": False}, "scale_attn_weights"),
])
def test_unsupported_configs_are_refused(family, preset, overrides, message):
    with pytest.raises(
        ConfigTranslationError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")
    ):
        checks.build_case(REGISTRY.family(family), preset, **overrides)


def test_bad_layer_types_are_refused():
    family = REGISTRY.family("qwen2")
    hf = {**family.presets["qwen2-tiny"], "layer_types": ["full_attention", "chunked_attention"]}
    with pytest.raises(ConfigTranslationError, match=r"layer_types \['chunked_attention'\] are not supported"):
        family.to_mcore_config(hf)
    hf = {**family.presets["qwen2-tiny"], "layer_types": ["sliding_attention"] * 2, "sliding_window": None}
    with pytest.raises(ConfigTranslationError, match="sliding_window is null"):
        family.to_mcore_config(hf)


# config.json files as published (transformers 4.x layout: rope_theta at the top level, torch_dtype, remote-code keys)
# in Qwen/Qwen2.5-0.5B and Qwen/Qwen-7B.
QWEN25_05B_CONFIG = {
    "architectures": ["Qwen2ForCausalLM"], "attention_dropout": 0.0, "bos_token_id": 151643, "eos_token_id": 151643,
    "hidden_act": "silu", "hidden_size": 896, "initializer_range": 0.02, "intermediate_size": 4864,
    "max_position_embeddings": 32768, "max_window_layers": 24, "model_type": "qwen2", "num_attention_heads": 14,
    "num_hidden_layers": 24, "num_key_value_heads": 2, "rms_norm_eps": 1e-06, "rope_theta": 1000000.0,
    "sliding_window": 32768, "tie_word_embeddings": True, "torch_dtype": "bfloat16", "transformers_version": "4.40.1",
    "use_cache": True, "use_mrope": False, "use_sliding_window": False, "vocab_size": 151936,
}
QWEN_7B_CONFIG = {
    "architectures": ["QWenLMHeadModel"], "auto_map": {"AutoConfig": "configuration_qwen.QWenConfig",
                                                       "AutoModelForCausalLM": "modeling_qwen.QWenLMHeadModel"},
    "attn_dropout_prob": 0.0, "bf16": False, "emb_dropout_prob": 0.0, "fp16": False, "fp32": False,
    "hidden_size": 4096, "intermediate_size": 22016, "initializer_range": 0.02, "kv_channels": 128,
    "layer_norm_epsilon": 1e-06, "max_position_embeddings": 32768, "model_type": "qwen", "no_bias": True,
    "num_attention_heads": 32, "num_hidden_layers": 32, "onnx_safe": None, "rotary_emb_base": 10000,
    "rotary_pct": 1.0, "scale_attn_weights": True, "seq_length": 8192, "tie_word_embeddings": False,
    "tokenizer_class": "QWenTokenizer", "transformers_version": "4.32.0", "use_cache": True, "use_dynamic_ntk": True,
    "use_flash_attn": "auto", "use_logn_attn": True, "vocab_size": 151936,
}


@pytest.mark.parametrize("family, preset, raw", [("qwen2", "qwen2.5-0.5b", QWEN25_05B_CONFIG),
                                                 ("qwen", "qwen-7b", QWEN_7B_CONFIG)])
def test_preset_is_the_published_config(family, preset, raw):
    checks.check_preset_matches_published(REGISTRY.family(family), preset, raw)


def test_published_qwen_configs_translate():
    from pai_zoo import hf

    qwen2 = REGISTRY.family("qwen2")
    config = qwen2.to_mcore_config(hf.config_dict(hf.hf_config(qwen2, QWEN25_05B_CONFIG)))
    assert "window_size" not in config.arch  # use_sliding_window is false: sliding_window 32768 is not used
    v1 = REGISTRY.family("qwen")
    config = v1.to_mcore_config(hf.config_dict(hf.hf_config(v1, QWEN_7B_CONFIG)))
    assert config["ffn_hidden_size"] == 22016 // 2  # QWenMLP's width is intermediate_size // 2
    assert config["max_sequence_length"] == 8192  # seq_length; max_position_embeddings 32768 is unused


@pytest.mark.parametrize("family, raw", [("qwen2", QWEN25_05B_CONFIG), ("qwen", QWEN_7B_CONFIG)])
def test_published_config_json_translates_completely(family, raw):
    from pai_zoo import hf

    fam = REGISTRY.family(family)
    assert REGISTRY.family_for_hf_config(raw, where="config.json") is fam
    config = hf.config_dict(hf.hf_config(fam, raw))
    assert fam.config_map.untranslated_architecture_keys(config) == []
    mcore = fam.to_mcore_config(config)
    assert mcore["hidden_size"] == raw["hidden_size"] and mcore["vocab_size"] == raw["vocab_size"]
    back = hf.config_dict(hf.hf_config_from_mcore(fam, mcore))
    assert {k: back[k] for k in config} == config
