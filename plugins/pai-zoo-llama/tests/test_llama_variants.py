"""Llama-family variants beyond the tiny preset: Mistral's sliding window, tied embeddings,
biases, MHA and MQA. Each is checked with the conformance suite's own checks."""
import pytest

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks

LLAMA = get_registry().family("llama")

VARIANTS = {
    "mistral sliding window 4 < 16 tokens": ("mistral-tiny", {}),
    "tied embeddings (Llama 3.2)": ("llama3-tiny", {"tie_word_embeddings": True}),
    "attention and MLP biases": ("llama3-tiny", {"attention_bias": True, "mlp_bias": True}),
    "multi-head (Llama 2 7B)": ("llama3-tiny", {"num_key_value_heads": 4}),
    "multi-query": ("llama3-tiny", {"num_key_value_heads": 1}),
    "linear RoPE scaling": (
        "llama3-tiny",
        {"rope_parameters": {"rope_type": "linear", "rope_theta": 10000.0, "factor": 4.0}},
    ),
    "explicit head_dim != hidden/heads": ("llama3-tiny", {"head_dim": 8}),
    "mistral-odd: 6 heads in 2 groups, head_dim 16 != 72/6, vocabulary 1001, window 5": ("mistral-odd", {}),
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_conforms(variant):
    preset, overrides = VARIANTS[variant]
    checks.check_variant(LLAMA, preset, **overrides)


def test_mistral_odd_disk_round_trip_and_tensor_parallel(tmp_path):
    """The Mistral twin of the odd preset: config.json and tensors survive HF -> mcore -> HF (MistralConfig has no
    attention_bias, which stays out), and TP=2 (3 heads, 1 key/value group per rank) gives the one-process logits."""
    case = checks.build_case(LLAMA, "mistral-odd")
    checks.check_disk_round_trip(case, tmp_path / "disk")
    checks.check_parallel_equivalence(case, tmp_path / "tp", layouts=((2, 1),))


def test_tied_model_has_no_output_layer_and_rebuilds_lm_head():
    case = checks.build_case(LLAMA, tie_word_embeddings=True)
    names = set(case.mcore_model.state_dict())
    assert "output_layer.weight" not in names
    assert "lm_head.weight" in case.hf_model.state_dict()


def test_unequal_biases_are_refused_with_the_reason():
    with pytest.raises(ConfigTranslationError, match="attention_bias and mlp_bias must be equal"):
        checks.build_case(LLAMA, attention_bias=True, mlp_bias=False)


def test_unsupported_activation_is_refused():
    with pytest.raises(ConfigTranslationError, match="hidden_act='gelu'"):
        checks.build_case(LLAMA, hidden_act="gelu")
