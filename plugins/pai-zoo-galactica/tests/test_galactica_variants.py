"""Galactica/OPT beyond the tiny preset: OPT's ReLU, an untied head, OPT's position offset of 2,
and the configs the family refuses (OPT-350m)."""
import pytest
import torch

from pai_zoo import ConfigTranslationError, hf
from pai_zoo.mcore.forward import mcore_forward
from pai_zoo.registry import get_registry
from pai_zoo_conformance import checks

GALACTICA = get_registry().family("galactica")

VARIANTS = {
    "OPT: ReLU": {"activation_function": "relu"},
    "untied output head": {"tie_word_embeddings": False},
}


@pytest.mark.parametrize("variant", VARIANTS)
def test_variant_conforms(variant):
    checks.check_variant(GALACTICA, generation=True, **VARIANTS[variant])


def test_position_table_keeps_opts_two_extra_rows_and_reads_position_p_at_row_p_plus_2():
    case = checks.build_case(GALACTICA)
    table = case.mcore_model.embedding.position_embeddings.weight
    assert table.shape[0] == GALACTICA.presets["galactica-tiny"]["max_position_embeddings"] + 2
    assert torch.equal(table, case.hf_model.model.decoder.embed_positions.weight)
    ids = torch.tensor([[5, 17, 42, 7]])

    def logits():
        with torch.no_grad():
            return mcore_forward(case.mcore_model, ids)[..., : case.mcore_config["vocab_size"]], case.hf_model(
                input_ids=ids
            ).logits

    before = logits()
    with torch.no_grad():
        for model_table in (table, case.hf_model.model.decoder.embed_positions.weight):
            model_table[:2] += 1.0  # rows 0 and 1: never read for real tokens
    unchanged = logits()
    with torch.no_grad():
        for model_table in (table, case.hf_model.model.decoder.embed_positions.weight):
            model_table[2] += 1.0  # row 2: position 0
    moved = logits()
    for side in (0, 1):
        assert torch.equal(before[side], unchanged[side])
        assert not torch.allclose(moved[side][:, 0], before[side][:, 0])
    assert (moved[0] - moved[1]).abs().max() <= checks.LOGITS_ATOL


def _translate(**overrides):
    return GALACTICA.to_mcore_config(
        hf.config_dict(hf.hf_config(GALACTICA, {**GALACTICA.presets["galactica-tiny"], **overrides}))
    )


@pytest.mark.parametrize("overrides, message", [
    ({"do_layer_norm_before": False}, "OPT-350m's post-LayerNorm"),
    ({"word_embed_proj_dim": 32}, "project_in/project_out"),
    ({"scale_embeddings": True}, "does not scale the embeddings"),
    ({"activation_dropout": 0.1}, "no dropout after the MLP activation"),
    ({"enable_bias": False}, "enable_bias=True"),
    ({"activation_function": "silu"}, "activation_function must be one of"),
])
def test_unsupported_configs_are_refused_with_the_reason(overrides, message):
    with pytest.raises(ConfigTranslationError, match=message):
        _translate(**overrides)


def test_opt_350m_published_config_is_refused():
    opt_350m = {
        **GALACTICA.presets["opt-125m"],
        "hidden_size": 1024,
        "num_hidden_layers": 24,
        "num_attention_heads": 16,
        "ffn_dim": 4096,
        "word_embed_proj_dim": 512,
        "do_layer_norm_before": False,
    }
    with pytest.raises(ConfigTranslationError, match="do_layer_norm_before=false"):
        GALACTICA.to_mcore_config(hf.config_dict(hf.hf_config(GALACTICA, opt_350m)))
