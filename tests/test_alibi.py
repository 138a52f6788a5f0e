"""ALiBi (pai_zoo.mcore.alibi): slopes against the published formula, the tensor-parallel slice,
and the biased attention against a direct computation."""
import math
import types

import pytest

from pai_zoo.mcore.alibi import alibi_bias, alibi_slopes


def published_slopes(n):
    """get_slopes from the ALiBi paper's reference code (ofirpress/attention_with_linear_biases)."""

    def get_slopes_power_of_2(n):
        start = 2 ** (-2 ** -(math.log2(n) - 3))
        ratio = start
        return [start * ratio**i for i in range(n)]

    if math.log2(n).is_integer():
        return get_slopes_power_of_2(n)
    closest_power_of_2 = 2 ** math.floor(math.log2(n))
    return (
        get_slopes_power_of_2(closest_power_of_2)
        + published_slopes(2 * closest_power_of_2)[0::2][: n - closest_power_of_2]
    )


@pytest.mark.parametrize("heads", [1, 2, 6, 8, 12, 16, 32, 40, 112])
def test_slopes_match_the_published_formula(heads):
    ours, reference = alibi_slopes(heads), published_slopes(heads)
    assert len(ours) == heads
    assert ours == pytest.approx(reference, rel=1e-12, abs=0)


def test_known_values_for_12_and_40_heads():
    # 12 heads: the 8 slopes of 8 heads (1/2 ... 1/256), then 2**-1.5*k for odd k = 1, 3, 5, 7
    # (every other slope of 16 heads).
    assert alibi_slopes(12) == pytest.approx([2.0**-i for i in range(1, 9)] + [2.0 ** (-0.5 * k) for k in (1, 3, 5, 7)])
    # 40 heads: 32 slopes 2**(-i/4), then 8 odd powers of 2**(-1/8).
    assert alibi_slopes(40) == pytest.approx(
        [2.0 ** (-i / 4) for i in range(1, 33)] + [2.0 ** (-k / 8) for k in range(1, 17, 2)]
    )


def test_slopes_match_transformers_bloom():
    import torch
    from transformers.models.bloom.modeling_bloom import _get_alibi_slopes

    for heads in (6, 12, 40, 112):
        assert torch.allclose(
            torch.tensor(alibi_slopes(heads)), _get_alibi_slopes(heads, torch.device("cpu")), rtol=1e-6, atol=0
        )


def test_bias_is_slope_times_relative_distance_and_handles_a_kv_cache():
    import torch

    slopes = torch.tensor([0.5, 0.25])
    bias = alibi_bias(slopes, 3, 3)
    assert bias.shape == (1, 2, 3, 3)
    assert torch.equal(bias[0, 1], 0.25 * torch.tensor([[0.0, 1, 2], [-1, 0, 1], [-2, -1, 0]]))
    # one new query over 5 cached keys: it is the last position
    assert torch.equal(alibi_bias(slopes, 1, 5)[0, 0, 0], 0.5 * torch.tensor([-4.0, -3, -2, -1, 0]))


class _FakeGroup:
    def __init__(self, rank, size):
        self._rank, self._size = rank, size

    def rank(self):
        return self._rank

    def size(self):
        return self._size


@pytest.mark.parametrize("rank", [0, 1])
def test_attention_on_a_tensor_parallel_rank_uses_its_slice_of_the_global_slopes(rank):
    import torch
    from megatron.core.transformer import TransformerConfig
    from megatron.core.transformer.enums import AttnMaskType

    from pai_zoo.mcore import alibi
    from pai_zoo.mcore.compat import ensure_model_parallel

    ensure_model_parallel()
    heads, d = 6, 4
    config = TransformerConfig(
        num_layers=1,
        hidden_size=heads * d,
        num_attention_heads=heads,
        use_cpu_initialization=True,
        masked_softmax_fusion=False,
        attention_dropout=0.0,
        tensor_model_parallel_size=2,
    )
    group = types.SimpleNamespace(tp=_FakeGroup(rank, 2))
    attention = alibi.ALiBiDotProductAttention(config, layer_number=1, attn_mask_type=AttnMaskType.causal,
                                               attention_type="self", pg_collection=group)
    mine = published_slopes(heads)[rank * 3:(rank + 1) * 3]
    assert attention.alibi_slopes.tolist() == pytest.approx(mine)

    s, b, local = 5, 2, 3
    gen = torch.Generator().manual_seed(0)
    q, k, v = (torch.randn(s, b, local, d, generator=gen) for _ in range(3))
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), 1).expand(b, 1, s, s)
    with torch.no_grad():
        got = attention(q, k, v, mask)
    # direct: softmax(q.k / sqrt(d) + slope * (j - i)), causal
    scores = torch.einsum("ibhd,jbhd->bhij", q, k) / math.sqrt(d)
    i, j = torch.arange(s)[:, None], torch.arange(s)[None, :]
    scores = scores + torch.tensor(mine).view(1, -1, 1, 1) * (j - i)
    scores = scores.masked_fill(j > i, float("-inf"))
    expected = torch.einsum("bhij,jbhd->ibhd", scores.softmax(-1), v).reshape(s, b, local * d)
    assert torch.allclose(got, expected, atol=1e-6)
    # and the bias matters: without it the result differs
    plain = torch.einsum(
        "bhij,jbhd->ibhd",
        (torch.einsum("ibhd,jbhd->bhij", q, k) / math.sqrt(d)).masked_fill(j > i, float("-inf")).softmax(-1),
        v,
    )
    assert not torch.allclose(got, plain.reshape(s, b, local * d), atol=1e-3)


def test_with_alibi_swaps_the_core_attention_in_a_copy_of_the_spec():
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec

    from pai_zoo.mcore import alibi

    spec = get_gpt_layer_local_spec()
    patched = alibi.with_alibi(spec)
    assert patched.submodules.self_attention.submodules.core_attention is alibi.ALiBiDotProductAttention
    assert spec.submodules.self_attention.submodules.core_attention is not alibi.ALiBiDotProductAttention  # a copy


def test_uses_alibi_reads_the_position_embedding_type():
    from pai_zoo.mcore.alibi import ALIBI, uses_alibi
    from pai_zoo.plugin.config_map import McoreConfig

    assert uses_alibi(McoreConfig("x", {"position_embedding_type": ALIBI}))
    assert not uses_alibi(McoreConfig("x", {"position_embedding_type": "rope"}))


def test_zero_heads_is_an_error():
    with pytest.raises(ValueError, match="at least one attention head"):
        alibi_slopes(0)
