"""The torch gated delta rule (pai_zoo.mcore.kernels.gated_delta) equals transformers' torch paths in float32."""
import torch
from transformers.models.qwen3_next import modeling_qwen3_next as ref

from pai_zoo.mcore.kernels import gated_delta as gd

HK, HV, DK, DV = 2, 6, 8, 12   # value heads = 3 x key heads


def _inputs(b=2, s=150, seed=0):
    gen = torch.Generator().manual_seed(seed)
    q, k = (torch.randn(b, s, HK, DK, generator=gen) for _ in range(2))
    v = torch.randn(b, s, HV, DV, generator=gen)
    g = -torch.rand(b, s, HV, generator=gen) * 0.3
    beta = torch.rand(b, s, HV, generator=gen)
    state = torch.randn(b, HV, DK, DV, generator=gen) * 0.1
    return q, k, v, g, beta, state


def _diff(a, b):
    return (a - b).abs().max().item()


def test_chunked_equals_transformers():
    q, k, v, g, beta, state = _inputs()
    kw = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    want, want_state = ref.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, **kw)
    got, got_state = gd.chunk_gated_delta_rule(q, k, v, g=g, beta=beta, **kw)
    assert _diff(got, want) < 1e-5 and _diff(got_state, want_state) < 1e-5


def test_recurrent_equals_transformers_and_chunked():
    q, k, v, g, beta, state = _inputs(s=70)
    kw = dict(initial_state=state, output_final_state=True, use_qk_l2norm_in_kernel=True)
    want, want_state = ref.torch_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kw)
    got, got_state = gd.fused_recurrent_gated_delta_rule(q, k, v, g=g, beta=beta, **kw)
    assert _diff(got, want) < 1e-5 and _diff(got_state, want_state) < 1e-5
    chunked, chunked_state = gd.chunk_gated_delta_rule(q, k, v, g=g, beta=beta, **kw)
    assert _diff(chunked, got) < 1e-5 and _diff(chunked_state, got_state) < 1e-5


def test_megatron_call_with_repeated_heads():
    """megatron-core repeats q/k heads and l2-normalises before the call (use_qk_l2norm_in_kernel=False)."""
    q, k, v, g, beta, _ = _inputs(b=1, s=90)
    want, _ = ref.torch_chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True)
    q2, k2 = (gd.l2norm(x).repeat_interleave(HV // HK, dim=2) for x in (q, k))
    got, none = gd.chunk_gated_delta_rule(q2, k2, v, g=g, beta=beta)
    assert none is None and _diff(got, want) < 1e-5


def test_cu_seqlens_restart_each_sequence():
    q, k, v, g, beta, _ = _inputs(b=1, s=150)
    bounds = [0, 70, 73, 150]
    got, finals = gd.chunk_gated_delta_rule(q, k, v, g=g, beta=beta, use_qk_l2norm_in_kernel=True,
                                            output_final_state=True, cu_seqlens=torch.tensor(bounds))
    for n, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
        part = [x[:, lo:hi] for x in (q, k, v, g, beta)]
        want, want_state = ref.torch_chunk_gated_delta_rule(*part[:3], g=part[3], beta=part[4],
                                                            output_final_state=True, use_qk_l2norm_in_kernel=True)
        assert _diff(got[:, lo:hi], want) < 1e-5 and _diff(finals[n:n + 1], want_state) < 1e-5


def test_install_binds_megatron_modules():
    import importlib

    from pai_zoo.mcore import compat  # noqa: F401  (megatron-core importable)
    gd.install()
    for name in gd.MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        assert module.chunk_gated_delta_rule is not None
        assert getattr(module, "HAVE_FLA", True)
