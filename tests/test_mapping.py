"""The weight-mapping engine: row transforms against hand-built layouts, coverage errors."""
import pytest
import torch

from pai_zoo import QKV, Copy, GateUp, MappingContext, MappingError, Output, Vocab, WeightMap
from pai_zoo.tables.mapping import TO_HF, TO_MCORE

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)


def ctx(heads=4, groups=2, d=3, layers=2, vocab=10, padded=16, tied=False):
    return MappingContext(layers, heads, groups, d, vocab, padded, tied)


def head(tag: float, d: int, width: int = 5) -> torch.Tensor:
    """A head's rows, every value equal to ``tag`` so the layout can be read off."""
    return torch.full((d, width), tag)


@pytest.mark.parametrize("heads,groups", [(4, 4), (4, 2), (4, 1), (6, 3)])  # MHA, GQA, MQA, GQA
def test_qkv_fuses_per_query_group(heads, groups):
    d = 3
    c = ctx(heads, groups, d)
    q = torch.cat([head(100 + h, d) for h in range(heads)])
    k = torch.cat([head(200 + g, d) for g in range(groups)])
    v = torch.cat([head(300 + g, d) for g in range(groups)])
    (fused,) = QKV("q{a,b,c}", "f").to_mcore([q, k, v], c)
    # Megatron's layout: for each group, its query heads, then its key head, then its value head.
    per_group = heads // groups
    expected_tags = []
    for g in range(groups):
        expected_tags += [100 + g * per_group + i for i in range(per_group)] + [200 + g, 300 + g]
    assert fused.shape == ((heads + 2 * groups) * d, 5)
    assert fused[::d, 0].tolist() == expected_tags
    back = QKV("q{a,b,c}", "f").to_hf([fused], c)
    assert all(torch.equal(a, b) for a, b in zip(back, (q, k, v)))


def test_qkv_handles_biases_and_checks_shapes():
    c = ctx(4, 2, 3)
    q, k, v = torch.arange(12.0), torch.arange(6.0) + 100, torch.arange(6.0) + 200
    (fused,) = QKV("x.{q,k,v}", "y").to_mcore([q, k, v], c)
    assert fused[:12].tolist() == [0, 1, 2, 3, 4, 5, 100, 101, 102, 200, 201, 202]
    with pytest.raises(MappingError, match=r"x.k: first dimension 5"):
        QKV("x.{q,k,v}", "y").to_mcore([q, torch.zeros(5), v], c)


def test_gate_up_concatenates_and_splits():
    gate, up = torch.randn(8, 4), torch.randn(8, 4)
    (fc1,) = GateUp("m.{gate,up}", "fc1").to_mcore([gate, up], ctx())
    assert torch.equal(fc1[:8], gate) and torch.equal(fc1[8:], up)
    g2, u2 = GateUp("m.{gate,up}", "fc1").to_hf([fc1], ctx())
    assert torch.equal(g2, gate) and torch.equal(u2, up)


def test_vocab_pads_with_zeros_and_trims_back():
    emb = torch.randn(10, 4)
    (padded,) = Vocab("e", "E").to_mcore([emb], ctx(vocab=10, padded=16))
    assert padded.shape == (16, 4) and torch.equal(padded[:10], emb) and not padded[10:].any()
    (trimmed,) = Vocab("e", "E").to_hf([padded], ctx(vocab=10, padded=16))
    assert torch.equal(trimmed, emb)
    with pytest.raises(MappingError, match="e: first dimension 12 is not the vocabulary size 10"):
        Vocab("e", "E").to_mcore([torch.zeros(12, 4)], ctx())


TABLE = WeightMap(
    Vocab("emb", "embedding.word_embeddings.weight"),
    Copy("layers.{layer}.norm", "decoder.layers.{layer}.norm"),
    Output("head", "output_layer.weight"),
)


def hf_state(layers=2, tied=False):
    state = {"emb": torch.randn(10, 4), "head": torch.randn(10, 4)}
    if tied:
        state["head"] = state["emb"]
    state.update({f"layers.{i}.norm": torch.randn(4) for i in range(layers)})
    return state


def test_layer_wildcards_expand_and_round_trip():
    state = hf_state()
    mcore = TABLE.convert(TO_MCORE, ctx(), state)
    assert sorted(mcore) == sorted(
        ["embedding.word_embeddings.weight", "output_layer.weight", "decoder.layers.0.norm", "decoder.layers.1.norm"]
    )
    back = TABLE.convert(TO_HF, ctx(), mcore)
    assert back.keys() == state.keys() and all(torch.equal(back[k], state[k]) for k in state)


def test_tied_output_is_dropped_on_the_way_in_and_rebuilt_on_the_way_out():
    state = hf_state(tied=True)
    mcore = TABLE.convert(TO_MCORE, ctx(tied=True), state)
    assert "output_layer.weight" not in mcore
    back = TABLE.convert(TO_HF, ctx(tied=True), mcore)
    assert torch.equal(back["head"], state["emb"]) and back.keys() == state.keys()
    # A checkpoint saved without the tied copy converts too.
    del state["head"]
    assert TABLE.convert(TO_MCORE, ctx(tied=True), state).keys() == mcore.keys()


def test_coverage_lists_missing_and_unexpected_sources():
    state = hf_state()
    del state["layers.1.norm"]
    state["rotary.inv_freq"] = torch.zeros(2)
    with pytest.raises(MappingError) as err:
        TABLE.convert(TO_MCORE, ctx(), state)
    assert "missing source tensors: layers.1.norm" in str(err.value)
    assert "source tensors no row consumes: rotary.inv_freq" in str(err.value)


def test_coverage_lists_unfilled_and_surplus_targets():
    expected = ["embedding.word_embeddings.weight", "decoder.layers.0.norm", "decoder.layers.1.norm", "extra.bias"]
    with pytest.raises(MappingError) as err:
        TABLE.convert(TO_MCORE, ctx(), hf_state(), expected_targets=expected)
    assert "target tensors no row fills: extra.bias" in str(err.value)
    assert "filled tensors the target does not have: output_layer.weight" in str(err.value)


def test_table_consuming_or_filling_twice_is_an_error():
    twice = WeightMap(Copy("a", "x"), Copy("a", "y"))
    with pytest.raises(MappingError, match="a is consumed by both"):
        twice.plan(TO_MCORE, ctx())
    clash = WeightMap(Copy("a", "x"), Copy("b", "x"))
    with pytest.raises(MappingError, match="x is filled by both"):
        clash.plan(TO_MCORE, ctx())


def test_iter_convert_checks_coverage_before_reading_any_tensor():
    reads = []

    def get(name):
        reads.append(name)
        return torch.zeros(10, 4)

    with pytest.raises(MappingError):
        list(TABLE.iter_convert(TO_MCORE, ctx(), get, ["emb"]))
    assert reads == []


def test_fused_rows_need_one_brace_group():
    with pytest.raises(MappingError, match=r"QKV row 'a.qkv' must name 3 tensors"):
        QKV("a.qkv", "b")
    with pytest.raises(MappingError, match=r"GateUp row 'a.\{gate,up,down\}' must name 2 tensors"):
        GateUp("a.{gate,up,down}", "b")
