"""StarCoder and StarCoder2 variants beyond the tiny presets, each checked with the conformance suite's own
checks, and the configs the translation refuses."""
import pytest

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo.tokenizers.names import family_tokenizer
from pai_zoo_conformance import checks

REGISTRY = get_registry()

VARIANTS = {
    "starcoder multi-head (multi_query=False, per-head [q k v] c_attn)": ("starcoder-tiny", {"multi_query": False}),
    "starcoder untied output head": ("starcoder-tiny", {"tie_word_embeddings": False}),
    "starcoder n_inner=None (4 x hidden)": ("starcoder-tiny", {"n_inner": None}),
    "starcoder exact gelu": ("starcoder-tiny", {"activation_function": "gelu"}),
    "starcoder2 untied output head": ("starcoder2-tiny", {"tie_word_embeddings": False}),
    "starcoder2 without biases": ("starcoder2-tiny", {"use_bias": False}),
    "starcoder2 multi-query, no sliding window": (
        "starcoder2-tiny",
        {"num_key_value_heads": 1, "sliding_window": None},
    ),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_conforms(variant):
    preset, overrides = VARIANTS[variant]
    checks.check_variant(REGISTRY.preset(preset)[0], preset, **overrides)


def test_multi_query_is_one_query_group_and_c_attn_is_copied_unchanged():
    case = checks.build_case(REGISTRY.family("starcoder"))
    assert case.mcore_config.num_query_groups == 1
    hf = case.hf_model.state_dict()["transformer.h.0.attn.c_attn.weight"]
    mcore = case.mcore_model.state_dict()["decoder.layers.0.self_attention.linear_qkv.weight"]
    assert hf.shape == (64 + 2 * 16, 64) and hf.equal(mcore)


def test_learned_positions_matter():
    """The forward check passes only because position embeddings are loaded: zeroing megatron's breaks it."""
    import torch

    case = checks.build_case(REGISTRY.family("starcoder"))
    with torch.no_grad():
        case.mcore_model.embedding.position_embeddings.weight.zero_()
    with pytest.raises(checks.ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def test_unequal_dropouts_are_refused_with_the_reason():
    with pytest.raises(ConfigTranslationError, match="resid_pdrop and embd_pdrop"):
        checks.build_case(REGISTRY.family("starcoder"), resid_pdrop=0.1, embd_pdrop=0.0)
    with pytest.raises(ConfigTranslationError, match="residual_dropout and embedding_dropout"):
        checks.build_case(REGISTRY.family("starcoder2"), residual_dropout=0.0, embedding_dropout=0.1)


def test_unsupported_settings_are_refused():
    with pytest.raises(ConfigTranslationError, match="activation 'relu'"):
        checks.build_case(REGISTRY.family("starcoder"), activation_function="relu")
    with pytest.raises(ConfigTranslationError, match="scale_attn_weights"):
        checks.build_case(REGISTRY.family("starcoder"), scale_attn_weights=False)
    with pytest.raises(ConfigTranslationError, match="norm_type"):
        checks.build_case(REGISTRY.family("starcoder2"), norm_type="rms_norm")


def test_checkpoint_folders_are_matched_to_their_family():
    assert REGISTRY.family_for_hf_config({"architectures": ["GPTBigCodeForCausalLM"]}).name == "starcoder"
    assert REGISTRY.family_for_hf_config({"architectures": ["Starcoder2ForCausalLM"]}).name == "starcoder2"


def test_fim_tokens_are_single_special_ids(tmp_path):
    from pai_zoo_starcoder.tokenizer_files import SPECIAL_TOKENS

    family = REGISTRY.family("starcoder")
    family.test_tokenizer(tmp_path)
    tok = family_tokenizer(family, tmp_path)
    ids = tok.encode("<fim_prefix>def f(x):<fim_suffix>    return x<fim_middle>")
    assert ids[0] == SPECIAL_TOKENS["starcoder"].index("<fim_prefix>") == 1
    assert SPECIAL_TOKENS["starcoder"].index("<fim_suffix>") in ids and ids.count(2) == 1
    assert tok.eos_id == 0


@pytest.mark.parametrize("name", ["starcoder", "starcoder2"])
def test_code_with_digits_and_fim_tokens_encodes_like_transformers(name, tmp_path):
    """The conformance text has no digits: StarCoder's digit-by-digit pre-tokenizer is checked here."""
    from transformers import AutoTokenizer

    family = REGISTRY.family(name)
    family.test_tokenizer(tmp_path)
    ours, reference = family_tokenizer(family, tmp_path), AutoTokenizer.from_pretrained(tmp_path)
    text = "<fim_prefix>x = 12345 + 0.5  # 你好\n<fim_suffix>    return x<fim_middle>"
    ids = ours.encode(text)
    assert ids == reference(text)["input_ids"]
    digits = [ours.token_to_id(d) for d in "12345"]
    assert all(d is not None for d in digits) and any(ids[i:i + 5] == digits for i in range(len(ids)))
    assert ours.decode(ids) == text
