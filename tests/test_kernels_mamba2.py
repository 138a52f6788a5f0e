"""The torch Mamba-2 kernels (pai_zoo.mcore.kernels.mamba2) equal transformers' torch fallback (Nemotron-H's) within
1e-5 in float32, at lengths past the chunk size; packed records (seq_idx) scan as separate sequences."""
from __future__ import annotations

import pytest
import torch
import torch.nn.functional as F
from transformers.models.nemotron_h import modeling_nemotron_h as hf

from pai_zoo.mcore.kernels import mamba2

B, L, H, P, G, N, CHUNK = 2, 37, 6, 4, 2, 5, 8


def _inputs(seed=0):
    gen = torch.Generator().manual_seed(seed)

    def r(*shape, scale=1.0):
        return torch.randn(*shape, generator=gen) * scale

    return dict(x=r(B, L, H, P), dt=r(B, L, H, scale=0.5), A=-torch.rand(H, generator=gen) * 2 - 0.1,
                B=r(B, L, G, N), C=r(B, L, G, N), D=r(H), dt_bias=r(H, scale=0.3), z=r(B, L, H, P),
                init=r(B, H, P, N, scale=0.2))


def _close(a, b):
    assert (a - b).abs().max().item() < 1e-5, (a - b).abs().max().item()


@pytest.mark.parametrize("limit", [(0.0, float("inf")), (0.05, 0.4)])
def test_chunk_scan_equals_transformers(limit):
    t = _inputs()
    args = (t["x"], t["dt"], t["A"], t["B"], t["C"], CHUNK)
    kw = dict(D=t["D"], dt_bias=t["dt_bias"], dt_softplus=True, dt_limit=limit, initial_states=t["init"],
              return_final_states=True)
    ref_y, ref_state = hf.mamba2_chunk_scan(*args, **kw)
    y, state = mamba2.mamba_chunk_scan_combined(*args, **kw)
    _close(y, ref_y)
    _close(state, ref_state)
    gated = mamba2.mamba_chunk_scan_combined(*args, z=t["z"], **{**kw, "return_final_states": False})
    _close(gated, ref_y * F.silu(t["z"]))


def test_seq_idx_restarts_the_state_per_record():
    t = _inputs(1)
    seq_idx = torch.tensor([[0] * 13 + [1] * 20 + [2] * 4, [0] * 30 + [1] * 7], dtype=torch.int32)
    kw = dict(D=t["D"], dt_bias=t["dt_bias"], dt_softplus=True)
    y, final = mamba2.mamba_chunk_scan_combined(t["x"], t["dt"], t["A"], t["B"], t["C"], CHUNK, seq_idx=seq_idx,
                                                return_final_states=True, **kw)
    for row in range(B):
        for start, end in mamba2._runs(seq_idx[row]):
            part = slice(row, row + 1), slice(start, end)
            ref, ref_state = hf.mamba2_chunk_scan(t["x"][part], t["dt"][part], t["A"], t["B"][part], t["C"][part],
                                                  CHUNK, return_final_states=True, **kw)
            _close(y[part], ref)
        _close(final[row], ref_state[0])


def test_state_update_equals_transformers_and_continues_the_scan():
    t = _inputs(2)
    A = t["A"][:, None, None].expand(H, P, N)
    D, dt_bias = t["D"][:, None].expand(H, P), t["dt_bias"][:, None].expand(H, P)
    _, state = mamba2.mamba_chunk_scan_combined(t["x"][:, :-1], t["dt"][:, :-1], t["A"], t["B"][:, :-1],
                                                t["C"][:, :-1], CHUNK, D=t["D"], dt_bias=t["dt_bias"],
                                                dt_softplus=True, return_final_states=True)
    last = dict(x=t["x"][:, -1], dt=t["dt"][:, -1][..., None].expand(B, H, P), B=t["B"][:, -1], C=t["C"][:, -1])
    ref_state = state.clone()
    ref = hf.mamba2_selective_state_update(ref_state, last["x"], last["dt"], A, last["B"], last["C"], D,
                                           dt_bias=dt_bias, dt_softplus=True)
    ours = mamba2.selective_state_update(state, last["x"], last["dt"], A, last["B"], last["C"], D, dt_bias=dt_bias,
                                         dt_softplus=True)
    _close(ours, ref)
    _close(state, ref_state)
    whole = mamba2.mamba_chunk_scan_combined(t["x"], t["dt"], t["A"], t["B"], t["C"], CHUNK, D=t["D"],
                                             dt_bias=t["dt_bias"], dt_softplus=True)
    _close(ours, whole[:, -1])  # the recurrent step continues the chunked scan


def test_gated_norm_equals_transformers():
    gen = torch.Generator().manual_seed(3)
    x, z = torch.randn(3, 7, 24, generator=gen), torch.randn(3, 7, 24, generator=gen)
    ref = hf.NemotronHRMSNormGated(24, group_size=8, eps=1e-5)
    ours = mamba2.RMSNormGated(24, eps=1e-5, group_size=8, norm_before_gate=False)
    with torch.no_grad():
        ref.weight.copy_(torch.randn(24, generator=gen))
        ours.weight.copy_(ref.weight)
    _close(ours(x, z), ref(x, z))
    _close(ours(x), ref(x))


def test_pick_uses_a_real_kernel_for_gpu_tensors_only(monkeypatch):
    """CPU tensors always take the torch path; elsewhere the package's kernel, but not megatron-core 0.19's Triton conv
    update (other arguments)."""
    mm = mamba2.mixer_module()

    def real():
        pass

    real.__module__ = "mamba_ssm.ops.triton.ssd_combined"

    def triton_conv():
        pass

    triton_conv.__module__ = "megatron.core.ssm.ops.causal_conv1d_triton"
    monkeypatch.setattr(mm, "mamba_chunk_scan_combined", real, raising=False)
    monkeypatch.setattr(mm, "causal_conv1d_update", triton_conv, raising=False)
    gpu_like = torch.empty(1, device="meta")
    assert mamba2.pick("mamba_chunk_scan_combined", gpu_like) is real
    assert mamba2.pick("mamba_chunk_scan_combined", torch.empty(1)) is mamba2.mamba_chunk_scan_combined
    assert mamba2.pick("causal_conv1d_update", gpu_like) is mamba2.causal_conv1d_update
