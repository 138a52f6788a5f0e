"""pai_zoo.mcore.parallel_layer: attention and MLP read the same (normalised) input.

The layer's numerics against a Hugging Face model are checked by the Falcon plugin's tests; these
check the wiring with plain torch: the output is x + attn(ln_a(x)) + mlp(ln_m(x)) computed by
hand from the layer's own weights, for one and for two layer norms."""
import math

import pytest
import torch
import torch.nn.functional as F

from pai_zoo.mcore.compat import ensure_model_parallel


def _layer(layernorms):
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.spec_utils import build_module

    from pai_zoo.mcore.parallel_layer import parallel_layer_spec

    ensure_model_parallel()
    config = TransformerConfig(
        num_layers=1, hidden_size=32, num_attention_heads=4, num_query_groups=2, ffn_hidden_size=48,
        add_bias_linear=False, hidden_dropout=0.0, attention_dropout=0.0, activation_func=F.gelu,
        use_cpu_initialization=True, bias_activation_fusion=False, bias_dropout_fusion=False,
        masked_softmax_fusion=False, persist_layer_norm=False, gradient_accumulation_fusion=False,
    )
    layer = build_module(parallel_layer_spec(layernorms), config=config, layer_number=1).eval()
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in layer.named_parameters():
            p.copy_(
                torch.randn(p.shape, generator=gen) / (p.shape[-1] ** 0.5 if p.dim() > 1 else 10)
                + (1.0 if name.endswith("layernorm.weight") else 0.0)
            )
    return layer


def _by_hand(layer, x):
    """x + attention(ln_attn(x)) + mlp(ln_mlp(x)) in plain torch; x is [s, b, h]."""
    s, b, h = x.shape
    heads, groups, d = 4, 2, 8

    def norm(module, t):
        return F.layer_norm(t, (h,), module.weight, module.bias, module.eps)

    a = norm(layer.input_layernorm, x)
    m = a if layer.pre_mlp_layernorm.__class__.__name__ == "IdentityOp" else norm(layer.pre_mlp_layernorm, x)
    qkv = (a @ layer.self_attention.linear_qkv.weight.T).view(s, b, groups, heads // groups + 2, d)
    q = qkv[..., :-2, :].reshape(s, b, heads, d)
    k = qkv[..., -2, :].repeat_interleave(heads // groups, dim=2)
    v = qkv[..., -1, :].repeat_interleave(heads // groups, dim=2)
    scores = torch.einsum("sbhd,tbhd->bhst", q, k) / math.sqrt(d)
    scores = scores.masked_fill(torch.triu(torch.ones(s, s, dtype=torch.bool), 1), float("-inf"))
    context = torch.einsum("bhst,tbhd->sbhd", scores.softmax(-1), v).reshape(s, b, h)
    attention = context @ layer.self_attention.linear_proj.weight.T
    mlp = F.gelu(m @ layer.mlp.linear_fc1.weight.T) @ layer.mlp.linear_fc2.weight.T
    return x + attention + mlp


@pytest.mark.parametrize("layernorms", [1, 2])
def test_output_is_input_plus_attention_plus_mlp_of_the_normalised_input(layernorms):
    layer = _layer(layernorms)
    x = torch.randn(6, 2, 32, generator=torch.Generator().manual_seed(1))
    mask = torch.triu(torch.ones(6, 6, dtype=torch.bool), 1).expand(2, 1, 6, 6)
    with torch.no_grad():
        out, _ = layer(x, attention_mask=mask)
        expected = _by_hand(layer, x)
    assert (out - expected).abs().max().item() < 1e-5


def test_one_layernorm_has_no_mlp_norm_and_two_have_both():
    one = {n for n, _ in _layer(1).named_parameters()}
    two = {n for n, _ in _layer(2).named_parameters()}
    assert not any(n.startswith("pre_mlp_layernorm") for n in one)
    assert {"pre_mlp_layernorm.weight", "pre_mlp_layernorm.bias"} <= two


def test_second_layernorm_feeds_the_mlp():
    layer = _layer(2)
    x = torch.randn(4, 1, 32, generator=torch.Generator().manual_seed(2))
    mask = torch.triu(torch.ones(4, 4, dtype=torch.bool), 1).expand(1, 1, 4, 4)
    with torch.no_grad():
        before, _ = layer(x, attention_mask=mask)
        layer.pre_mlp_layernorm.weight.mul_(2.0)
        after, _ = layer(x, attention_mask=mask)
    assert not torch.allclose(before, after)


def test_layernorm_count_is_checked():
    from pai_zoo.mcore.parallel_layer import parallel_layer_spec

    with pytest.raises(ValueError, match="1 or 2 layer norms"):
        parallel_layer_spec(3)
