"""pai_zoo.mcore.embedding: a GPTModel whose word embeddings go through a norm (Bloom)."""
import warnings

import pytest


def _model(pre_process=True, normalization="LayerNorm"):
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
    from megatron.core.transformer import TransformerConfig

    from pai_zoo.mcore.compat import ensure_model_parallel
    from pai_zoo.mcore.embedding import embedding_norm_gpt_model

    ensure_model_parallel()
    config = TransformerConfig(num_layers=1, hidden_size=16, num_attention_heads=2, use_cpu_initialization=True,
                               normalization=normalization, layernorm_epsilon=1e-3, hidden_dropout=0.0,
                               attention_dropout=0.0, masked_softmax_fusion=False, bias_activation_fusion=False,
                               bias_dropout_fusion=False, gradient_accumulation_fusion=False)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        spec = get_gpt_layer_local_spec(normalization=normalization)
        return embedding_norm_gpt_model()(config=config, transformer_layer_spec=spec, vocab_size=32,
                                          max_sequence_length=64, pre_process=pre_process,
                                          position_embedding_type="none")


@pytest.mark.parametrize("normalization", ["LayerNorm", "RMSNorm"])
def test_embeddings_are_normalised_with_the_configs_norm(normalization):
    import torch

    model = _model(normalization=normalization).eval()
    norm = model.embedding.word_embeddings_layernorm
    with torch.no_grad():
        norm.weight.copy_(torch.linspace(0.5, 2.0, 16))
        if hasattr(norm, "bias") and norm.bias is not None:
            norm.bias.copy_(torch.linspace(-1.0, 1.0, 16))
        ids = torch.tensor([[3, 1, 4, 1, 5]])
        got = model.embedding(input_ids=ids, position_ids=None)  # [s, b, h]
        raw = model.embedding.word_embeddings.weight[ids[0]]
        if normalization == "LayerNorm":
            expected = torch.nn.functional.layer_norm(raw, (16,), norm.weight, norm.bias, 1e-3)
        else:
            expected = raw * torch.rsqrt(raw.pow(2).mean(-1, keepdim=True) + 1e-3) * norm.weight
    assert torch.allclose(got[:, 0], expected, atol=1e-6)
    assert not torch.allclose(got[:, 0], raw, atol=1e-2)


def test_the_norm_is_in_the_state_dict_and_the_sharded_state_dict():
    model = _model()
    assert {"embedding.word_embeddings_layernorm.weight", "embedding.word_embeddings_layernorm.bias"} <= set(
        model.state_dict()
    )
    assert "embedding.word_embeddings_layernorm.weight" in model.sharded_state_dict()


def test_a_later_pipeline_stage_has_no_embedding_and_no_norm():
    model = _model(pre_process=False)
    assert not any(name.startswith("embedding.") for name in model.state_dict())
