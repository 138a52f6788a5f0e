"""Qwen3-Next past the conformance suite's reach: logits at lengths past the gated delta rule's chunk (64), greedy
generation at batch 1 and 3 (left padding), and the suite failing on each mechanism switched off (a record's state
leaking into the next, the attention's output gate dropped, the conv kernel one tap off)."""
import pytest
import torch

from pai_zoo.families.registry import get_registry
from pai_zoo_conformance import ConformanceFailure
from pai_zoo_conformance.checks import check_forward_equivalence, check_generation, logits_delta, shared_case
from pai_zoo_conformance.forward_checks import LOGITS_ATOL
from pai_zoo_conformance.packing_checks import check_packed_records

FAMILY = get_registry().family("qwen3_next")


@pytest.fixture(scope="module")
def tiny():
    return shared_case(FAMILY)


@pytest.fixture(scope="module")
def odd():
    return shared_case(FAMILY, FAMILY.odd)


def test_logits_past_the_chunk_size(odd):
    """80 and 150 tokens (two and three chunks of 64) from position 0 and from 100, left padding on one row."""
    for length in (80, 150):
        for offset in (0, 100):
            assert logits_delta(odd, length, offset=offset, seed=length) < LOGITS_ATOL
    assert logits_delta(odd, 80, pad=13, seed=3) < LOGITS_ATOL  # left padding


@pytest.mark.parametrize("lengths", [(7,), (5, 11, 2)])
def test_generation_equals_transformers(odd, lengths):
    """Gated attention through pai-zoo's KV cache (CachedSelfAttention), Gated DeltaNet through its recurrent
    state (conv window + delta-rule state in KVCache.recurrent)."""
    from pai_zoo.mcore.inference import CachedSelfAttention

    attention = [m for m in odd.mcore_model.modules() if isinstance(m, CachedSelfAttention)]
    assert attention and all(m._cached for m in attention)
    assert check_generation(odd, new_tokens=12, lengths=lengths)["tie_rows"] == 0


def test_state_leaking_into_the_next_record_fails_packing(tiny, monkeypatch):
    from pai_zoo.mcore import linear_attention

    check_packed_records(tiny)
    monkeypatch.setattr(linear_attention, "segments", lambda mask, length: None)  # records ignored
    with pytest.raises(ConformanceFailure, match=r"\[packing\]"):
        check_packed_records(tiny)


def test_output_gate_dropped_fails_forward(tiny, monkeypatch):
    from pai_zoo.mcore.inference import CachedSelfAttention

    monkeypatch.setattr(CachedSelfAttention, "_apply_output_gate", lambda self, x, gate: x)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        check_forward_equivalence(tiny)


def test_conv_one_tap_off_fails_forward(tiny, monkeypatch):
    from pai_zoo.mcore.kernels import causal_conv

    right = causal_conv.causal_conv1d_fn

    def one_tap_off(x, weight, *args, **kwargs):  # token t sees t - w .. t - 1
        return right(torch.nn.functional.pad(x, (1, 0))[..., :-1], weight, *args, **kwargs)

    monkeypatch.setattr(causal_conv, "causal_conv1d_fn", one_tap_off)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        check_forward_equivalence(tiny)


def test_published_mtp_tensors_are_ignored_as_transformers_ignores_them(tiny):
    """The published checkpoints' mtp.* tensors (transformers' _keys_to_ignore_on_load_unexpected) are accepted and
    dropped; any other stray tensor is still refused."""
    from pai_zoo.plugin.errors import MappingError
    from pai_zoo.tables.mapping import TO_MCORE, MappingContext

    table = FAMILY.weight_map(tiny.mcore_config)
    ctx = MappingContext.from_config(tiny.mcore_config)
    names = table.source_names(TO_MCORE, ctx)
    table.check_coverage(TO_MCORE, ctx, names + ["mtp.fc.weight", "mtp.layers.0.mlp.experts.3.up_proj.weight"])
    with pytest.raises(MappingError, match="model.bogus.weight"):
        table.check_coverage(TO_MCORE, ctx, names + ["model.bogus.weight"])
