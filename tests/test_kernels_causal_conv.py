"""The torch causal conv1d (pai_zoo.mcore.kernels.causal_conv) equals transformers' torch paths in float32."""
import pytest
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as ref

from pai_zoo.mcore.kernels import causal_conv as cc

D, W = 12, 4


def _inputs(b=3, s=70, seed=0):
    g = torch.Generator().manual_seed(seed)
    return (torch.randn(b, D, s, generator=g), torch.randn(D, W, generator=g), torch.randn(D, generator=g))


@pytest.mark.parametrize("activation", [None, "silu"])
def test_fn_equals_transformers(activation):
    x, w, b = _inputs()
    want = ref.causal_conv1d_fn(x, w, b, activation=activation)
    got, final = cc.causal_conv1d_fn(x, w, b, activation=activation, return_final_states=True)
    assert (got - want).abs().max() < 1e-5
    assert torch.equal(final, x[..., -(W - 1):])


def test_prefill_then_updates_equal_one_pass():
    """Prefill's final state then one-token updates (transformers' and ours) equal the conv over the whole sequence."""
    x, w, b = _inputs(s=20)
    whole = ref.causal_conv1d_fn(x, w, b, activation="silu")
    out, state = cc.causal_conv1d_fn(x[..., :13], w, b, activation="silu", return_final_states=True)
    ref_state = state.clone()
    steps, ref_steps = [out], [out]
    for t in range(13, 20):
        steps.append(cc.causal_conv1d_update(x[..., t], state, w, b, "silu").unsqueeze(-1))
        ref_steps.append(ref.causal_conv1d_update(x[..., t:t + 1], ref_state, w, b, activation="silu"))
    assert (torch.cat(steps, -1) - whole).abs().max() < 1e-5
    assert (torch.cat(ref_steps, -1) - torch.cat(steps, -1)).abs().max() < 1e-5
    assert torch.equal(state, ref_state)


def test_records_restart():
    """seq_idx / cu_seqlens restart the window: each record equals its own conv from zeros."""
    x, w, b = _inputs(b=1, s=30)
    seq_idx = torch.tensor([[0] * 9 + [1] * 2 + [2] * 19])
    got = cc.causal_conv1d_fn(x, w, b, seq_idx=seq_idx, activation="silu")
    y, finals = cc.fla_causal_conv1d(x.transpose(1, 2), w, b, activation="silu", output_final_state=True,
                                     cu_seqlens=torch.tensor([0, 9, 11, 30]))
    for n, (lo, hi) in enumerate([(0, 9), (9, 11), (11, 30)]):
        want = ref.causal_conv1d_fn(x[..., lo:hi], w, b, activation="silu")
        assert (got[..., lo:hi] - want).abs().max() < 1e-5
        assert (y.transpose(1, 2)[..., lo:hi] - want).abs().max() < 1e-5
        assert torch.equal(finals[n], torch.nn.functional.pad(x[0, :, lo:hi], (W - 1, 0))[:, -(W - 1):])
