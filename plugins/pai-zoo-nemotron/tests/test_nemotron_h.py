"""Nemotron-H specifics the shared suite does not reach: logits past several scan chunks with left padding, generation
at batch 1 and batch 3 (left-padded) with the conv and SSM state, the suite failing when a record's Mamba state leaks
into the next or the conv is off by one tap, the pattern's spellings round-tripping, and the refusals."""
from __future__ import annotations

import pytest
import torch

from pai_zoo import ConfigTranslationError
from pai_zoo.registry import get_registry
from pai_zoo_conformance import ConformanceFailure, checks
from pai_zoo_conformance.cases import shared_case
from pai_zoo_conformance.forward_checks import LOGITS_ATOL, logits_delta


def _family():
    return get_registry().family("nemotron_h")


def _translate(**changes):
    fam = _family()
    return fam.to_mcore_config({**fam.presets[fam.tiny], **changes})


def test_logits_past_several_chunks_with_left_padding():
    """40 tokens = 5 scan chunks of the odd preset (chunk_size 8); the second row left-padded by 13."""
    fam = _family()
    assert logits_delta(shared_case(fam, fam.odd), 40, pad=13, seed=5) < LOGITS_ATOL


@pytest.mark.parametrize("lengths", [(19,), (5, 19, 11)])
def test_generation_with_the_recurrent_state(lengths):
    """Batch 1, and batch 3 left-padded, past the chunk size: greedy tokens equal transformers' generate."""
    fam = _family()
    result = checks.check_generation(shared_case(fam, fam.odd), new_tokens=6, lengths=lengths)
    assert result["rows"] == len(lengths)


def test_a_record_state_leaking_into_the_next_fails_the_suite(monkeypatch):
    from pai_zoo.mcore import hybrid
    from pai_zoo_conformance.packing_checks import check_packed_records

    fam = _family()
    case = shared_case(fam, fam.odd)
    assert check_packed_records(case) <= 1e-5
    monkeypatch.setattr(hybrid, "_seq_idx", lambda starts: None)  # conv and scan run across record starts
    with pytest.raises(ConformanceFailure, match=r"\[packing\]"):
        check_packed_records(case)


def test_the_conv_off_by_one_tap_fails_the_suite(monkeypatch):
    from pai_zoo.mcore import hybrid

    fam = _family()
    case = shared_case(fam, fam.odd)
    right = hybrid.HybridMambaMixer._conv

    def shifted(self):
        weight, bias = right(self)
        return torch.nn.functional.pad(weight[:, 1:], (0, 1)), bias  # each tap one step later

    monkeypatch.setattr(hybrid.HybridMambaMixer, "_conv", shifted)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


@pytest.mark.parametrize("spelling", [
    {"hybrid_override_pattern": "M*M-", "num_hidden_layers": 4},
    {"layers_block_type": ["linear_attention", "full_attention", "linear_attention", "mlp"]},
    {"layers_block_type": ["mamba", "attention", "mamba", "mlp"]},  # transformers' legacy names
])
def test_the_pattern_round_trips_as_spelled(spelling):
    fam = _family()
    hf = {k: v for k, v in fam.presets[fam.tiny].items() if k not in ("hybrid_override_pattern", "num_hidden_layers")}
    hf.update(spelling)
    config = fam.to_mcore_config(hf)
    assert config["hybrid_override_pattern"] == "M*M-" and config.num_layers == 4
    back = fam.to_hf_config_dict(config)
    assert {k: back.get(k) for k in spelling} == spelling
    assert not {"hybrid_override_pattern", "layers_block_type", "num_hidden_layers"} - set(spelling) & set(back)


def test_mamba_sizes_translate():
    arch = _translate().arch
    assert (arch["mamba_num_heads"], arch["mamba_head_dim"], arch["mamba_state_dim"], arch["mamba_num_groups"]) \
        == (4, 16, 16, 2)
    assert arch["mamba_conv_kernel"] == 4 and arch["pai_zoo.chunk_size"] == 16
    assert arch["activation_func"] == "squared_relu" and not arch["gated_linear_unit"]
    published = _family().to_mcore_config(_family().presets["nemotron-h-8b"]).arch
    assert published["num_layers"] == 52 and published["hybrid_override_pattern"].count("*") == 4


@pytest.mark.parametrize("changes, message", [
    ({"hybrid_override_pattern": "M*E-", "moe_latent_size": 16}, "moe_latent_size=16"),
    ({"hybrid_override_pattern": "M*X-"}, "hybrid_override_pattern="),
    ({"num_hidden_layers": 5}, "num_hidden_layers=5"),
    ({"time_step_limit": [0.0, 0.1]}, "time_step_limit"),
    ({"mamba_hidden_act": "gelu"}, "mamba_hidden_act='gelu'"),
    ({"use_conv_bias": False}, "use_conv_bias=False"),
    ({"mlp_hidden_act": "silu"}, "mlp_hidden_act='silu'"),
    ({"attention_head_dim": 8}, "attention_head_dim differs from head_dim"),
])
def test_unsupported_values_are_refused_in_one_line(changes, message):
    with pytest.raises(ConfigTranslationError, match=message) as err:
        _translate(**changes)
    assert "\n" not in str(err.value)


def test_moe_layers_route_with_the_score_correction_bias():
    """The odd preset's E layer: a nonzero score-correction bias (zero in a fresh transformers model) changes the
    chosen experts, is converted, and the logits still agree."""
    from pai_zoo.models.state_dicts import hf_model_to_mcore
    from pai_zoo_conformance.cases import copy_case

    fam = _family()
    case = copy_case(shared_case(fam, fam.odd))
    ids = torch.arange(3, 3 + 16).unsqueeze(0)
    moe = case.hf_model.model.layers[3].mixer
    with torch.no_grad():
        plain = case.hf_model(input_ids=ids).logits
        moe.gate.e_score_correction_bias.copy_(torch.randn(6, generator=torch.Generator().manual_seed(3)))
        assert (case.hf_model(input_ids=ids).logits - plain).abs().max() > 1e-3
    hf_model_to_mcore(case.family, case.mcore_config, case.hf_model, case.mcore_model)
    assert torch.equal(case.mcore_model.decoder.layers[3].mlp.router.expert_bias, moe.gate.e_score_correction_bias)
    checks.check_forward_equivalence(case)


def test_megatron_lm_args_carry_the_pattern_and_are_claimed():
    from pai_zoo.mcore import megatron_lm_args as mla
    from pai_zoo.plugin import megatron_args

    fam = _family()
    config = fam.to_mcore_config(fam.presets["nemotron-h-8b"])
    args = vars(mla.megatron_lm_args(config, 1, 1, None, torch.float32))
    assert args["hybrid_override_pattern"] == config["hybrid_override_pattern"] and args["squared_relu"]
    assert (args["mamba_num_heads"], args["mamba_head_dim"], args["mamba_state_dim"]) == (128, 64, 128)
    back = megatron_args.arch_from_args(args, "args", fam.megatron_lm_rules)
    assert "nemotron_h" in [f.name for f in get_registry().families_for_megatron_args(back)]
    assert not megatron_args.differences(back, config.arch, keys=["hybrid_override_pattern", "mamba_num_groups"])
    odd = fam.to_mcore_config(fam.presets[fam.odd])  # conv width 3, chunks of 8: no Megatron-LM flag sets them
    assert any("mamba_conv_kernel=3" in c for c in mla.megatron_lm_caveats(odd))
