"""Phi-3's LongRoPE against transformers at lengths on both sides of original_max_position_embeddings (phi3-odd:
24), within one sequence too; and the config rules' refusals."""
import pytest
import torch

from pai_zoo import ConfigTranslationError
from pai_zoo.families.registry import get_registry
from pai_zoo.plugin.config_map import LONGROPE
from pai_zoo_conformance import checks
from pai_zoo_conformance.forward_checks import LOGITS_ATOL

PHI3 = get_registry().family("phi3")


@pytest.mark.parametrize("offset, length", [(0, 24), (0, 25), (0, 30), (10, 16), (280, 12)])
def test_logits_equal_transformers_on_both_sides_of_the_switch(offset, length):
    """Running length max(position_ids) + 1: 24 (short factors), 25 and more (long), as transformers chooses."""
    from pai_zoo.mcore.forward import mcore_forward

    case = checks.shared_case(PHI3, PHI3.odd)
    vocab = case.mcore_config["vocab_size"]
    ids = torch.randint(0, vocab, (2, length), generator=torch.Generator().manual_seed(offset + length))
    positions = torch.arange(offset, offset + length).expand(2, length)
    with torch.no_grad():
        expected = case.hf_model(input_ids=ids, position_ids=positions).logits.float()
        got = mcore_forward(case.mcore_model, ids, position_ids=positions)[..., :vocab].float()
    assert (got - expected).abs().max().item() < LOGITS_ATOL


def test_resolved_values_and_round_trip():
    hf = checks._hf_dict(PHI3, PHI3.odd)
    config = PHI3.to_mcore_config(hf)
    assert config[LONGROPE]["original_max_position_embeddings"] == 24
    assert config[LONGROPE]["attention_factor"] == pytest.approx((1 + torch.log(torch.tensor(300 / 24)).item()
                                                                   / torch.log(torch.tensor(24.0)).item()) ** 0.5)
    assert PHI3.config_map.to_hf(config)["rope_parameters"] == hf["rope_parameters"]


@pytest.mark.parametrize("change, match", [
    ({"short_factor": [1.0, 1.0, 1.0]}, "short_factor must be 4 numbers"),
    ({"long_factor": None}, "long_factor is missing"),
    ({"partial_rotary_factor": 0.5, "short_factor": [1.0, 1.0], "long_factor": [2.0, 2.0]}, "partial_rotary_factor"),
])
def test_bad_longrope_parameters_are_refused_in_one_line(change, match):
    hf = checks._hf_dict(PHI3, PHI3.odd)
    hf["rope_parameters"] = {**hf["rope_parameters"], **change}
    with pytest.raises(ConfigTranslationError, match=match):
        PHI3.to_mcore_config(hf)


def test_generation_across_the_switch_equals_transformers():
    """A cached generation that grows past original_max_position_embeddings: transformers' Phi-3 runs the whole
    sequence again there (long factors in every layer); pai-zoo's loop does too (``recompute_cache_at``)."""
    from pai_zoo_conformance.generation_checks import check_generation

    case = checks.shared_case(PHI3, PHI3.odd)
    assert case.mcore_model.recompute_cache_at == 24
    check_generation(case, new_tokens=10, lengths=(20, 20))


def test_megatron_lm_args_keep_longrope():
    """Megatron-LM has no LongRoPE flag: pai-zoo's own args keep the factors and the resolved switch and factor."""
    from pai_zoo.plugin.config_map import ROPE_SCALING
    from pai_zoo.plugin.megatron_args import arch_from_args, args_from_arch

    arch = PHI3.to_mcore_config(checks._hf_dict(PHI3, PHI3.odd)).arch
    back = arch_from_args(args_from_arch(arch, PHI3.megatron_lm_rules), rules=PHI3.megatron_lm_rules)
    assert back[ROPE_SCALING] == arch[ROPE_SCALING] and back[LONGROPE] == arch[LONGROPE]
