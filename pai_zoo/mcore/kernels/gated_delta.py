"""Torch gated delta rule (Gated DeltaNet): ``fla``'s ``chunk_gated_delta_rule``, ``fused_recurrent_gated_delta_rule``
and ``l2norm``, for where ``fla`` (Triton, GPU) is absent.

Tensors are ``fla``'s ``[b, s, heads, dim]`` layout; ``g`` (log decay, ``<= 0``) and ``beta`` are ``[b, s, hv]``; the
state is ``[b, hv, dk, dv]`` (float32). Query/key heads fewer than value heads are repeated (each serves ``hv / hk``
consecutive value heads), as transformers does; megatron-core repeats them before the call. ``cu_seqlens`` (batch 1)
runs each packed sequence from its own initial state (or zeros) and returns one final state per sequence.

The chunked form is transformers' ``torch_chunk_gated_delta_rule`` (UT transform by triangular solve, chunks of 64);
the recurrent form is ``torch_recurrent_gated_delta_rule`` token by token. transformers runs the chunked form for every
prompt and the recurrent one for one-token decode steps; :class:`pai_zoo.mcore.linear_attention.GatedDeltaNetLayer`
does the same. Float32 results equal transformers' within 1e-5 (``tests/test_kernels_gated_delta.py``).

:func:`install` gives megatron-core's Gated DeltaNet modules these (and :mod:`.causal_conv`) when ``fla`` /
``causal_conv1d`` are not installed.
"""
from __future__ import annotations

import importlib

import torch
import torch.nn.functional as F

from . import causal_conv

__all__ = ["chunk_gated_delta_rule", "fused_recurrent_gated_delta_rule", "install", "l2norm"]

CHUNK = 64


def l2norm(x, dim: int = -1, eps: float = 1e-6, output_dtype=None):
    """``x / sqrt(sum(x^2) + eps)`` along ``dim``, as fla and transformers compute it."""
    out = x * torch.rsqrt((x * x).sum(dim=dim, keepdim=True) + eps)
    return out if output_dtype is None else out.to(output_dtype)


def _prepare(q, k, v, g, beta, scale, use_qk_l2norm):
    """``[b, h, s, d]`` float32 tensors, heads repeated, q/k normalised and q scaled."""
    hk, hv = k.shape[2], v.shape[2]
    if hk != hv:
        q = q.repeat_interleave(hv // hk, dim=2)
        k = k.repeat_interleave(hv // hk, dim=2)
    q, k, v, beta, g = (x.transpose(1, 2).to(torch.float32, memory_format=torch.contiguous_format)
                        for x in (q, k, v, beta, g))
    if use_qk_l2norm:
        q, k = l2norm(q), l2norm(k)
    scale = q.shape[-1] ** -0.5 if scale is None else scale
    return q * scale, k, v, g, beta


def _chunk(q, k, v, g, beta, state):
    """One batch of ``[b, h, s, d]`` prepared inputs from ``state`` (``[b, h, dk, dv]``); returns (out, final)."""
    b, h, length, dv = v.shape
    pad = (CHUNK - length % CHUNK) % CHUNK
    q, k, v = (F.pad(x, (0, 0, 0, pad)) for x in (q, k, v))
    beta, g = (F.pad(x, (0, pad)) for x in (beta, g))
    v_beta = v * beta.unsqueeze(-1)
    k_beta = k * beta.unsqueeze(-1)
    q, k, k_beta, v_beta = (x.reshape(b, h, -1, CHUNK, x.shape[-1]) for x in (q, k, k_beta, v_beta))
    g = g.reshape(b, h, -1, CHUNK).cumsum(dim=3)
    upper = torch.ones(CHUNK, CHUNK, dtype=torch.bool, device=q.device).triu(1)
    pairwise = (g.unsqueeze(4) - g.unsqueeze(3)).masked_fill(upper, float("-inf")).exp()
    ut_system = (k_beta @ k.transpose(-1, -2)) * pairwise
    intra = (q @ k.transpose(-1, -2)) * pairwise
    new_values = torch.linalg.solve_triangular(ut_system, v_beta, upper=False, unitriangular=True)
    k_cumdecay = torch.linalg.solve_triangular(ut_system, k_beta * g.exp().unsqueeze(-1), upper=False,
                                               unitriangular=True)
    q = q * g.exp().unsqueeze(-1)
    k = k * (g[..., -1:] - g).exp().unsqueeze(-1)
    chunk_decay = g[..., -1].exp()[..., None, None]
    out = torch.zeros_like(new_values)
    for i in range(new_values.shape[2]):
        v_new = new_values[:, :, i] - k_cumdecay[:, :, i] @ state
        out[:, :, i] = q[:, :, i] @ state + intra[:, :, i] @ v_new
        state = state * chunk_decay[:, :, i] + k[:, :, i].transpose(-1, -2) @ v_new
    return out.reshape(b, h, -1, dv)[:, :, :length], state


def _recurrent(q, k, v, g, beta, state):
    """Token by token over ``[b, h, s, d]`` prepared inputs from ``state``; returns (out, final)."""
    out = torch.zeros_like(v)
    for t in range(v.shape[2]):
        state = state * g[:, :, t].exp()[..., None, None]
        k_t = k[:, :, t].unsqueeze(-1)
        delta = (v[:, :, t] - (state * k_t).sum(dim=-2)) * beta[:, :, t].unsqueeze(-1)
        state = state + k_t * delta.unsqueeze(-2)
        out[:, :, t] = (state * q[:, :, t].unsqueeze(-1)).sum(dim=-2)
    return out, state


def _run(step, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel, cu_seqlens):
    dtype = q.dtype
    q, k, v, g, beta = _prepare(q, k, v, g, beta, scale, use_qk_l2norm_in_kernel)
    b, h, _, dv = v.shape
    dk = k.shape[-1]

    def start(rows):
        if initial_state is None:
            return torch.zeros(len(rows), h, dk, dv, dtype=torch.float32, device=v.device)
        return initial_state[rows].to(torch.float32)

    if cu_seqlens is None:
        out, final = step(q, k, v, g, beta, start(list(range(b))))
    else:
        if b != 1:
            raise ValueError(f"gated delta rule: cu_seqlens needs batch 1, not {b}")
        bounds = [int(x) for x in cu_seqlens.tolist()]
        out, finals = torch.zeros_like(v), []
        for n, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
            out[:, :, lo:hi], last = step(q[:, :, lo:hi], k[:, :, lo:hi], v[:, :, lo:hi], g[:, :, lo:hi],
                                          beta[:, :, lo:hi], start([n]))
            finals.append(last)
        final = torch.cat(finals) if finals else None
    out = out.transpose(1, 2).to(dtype, memory_format=torch.contiguous_format)
    return out, (final if output_final_state else None)


def chunk_gated_delta_rule(q, k, v, g, beta, scale=None, initial_state=None, output_final_state=False,
                           use_qk_l2norm_in_kernel=False, cu_seqlens=None, head_first=False, **_):
    """``fla.ops.gated_delta_rule.chunk_gated_delta_rule`` in torch: returns ``(o [b, s, hv, dv], final_state)``."""
    if head_first:
        raise NotImplementedError("chunk_gated_delta_rule (torch path): head_first=True")
    return _run(_chunk, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                cu_seqlens)


def fused_recurrent_gated_delta_rule(q, k, v, g, beta=None, scale=None, initial_state=None,
                                     output_final_state=False, use_qk_l2norm_in_kernel=False, cu_seqlens=None, **_):
    """``fla``'s ``fused_recurrent_gated_delta_rule`` in torch (token by token; decode steps)."""
    if beta is None:
        beta = torch.ones_like(g)
    return _run(_recurrent, q, k, v, g, beta, scale, initial_state, output_final_state, use_qk_l2norm_in_kernel,
                cu_seqlens)


#: megatron-core modules that bind fla's / causal_conv1d's names at import (0.16: one module; 0.19: a package).
MODULES = ("megatron.core.ssm.gated_delta_net", "megatron.core.ssm.gated_delta_net.common",
           "megatron.core.ssm.gated_delta_net.gdn")


def install() -> None:
    """Bind the torch paths where megatron-core's Gated DeltaNet modules found no ``fla`` / ``causal_conv1d``."""
    for name in MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:
            continue
        if getattr(module, "HAVE_FLA", True) is False or getattr(module, "chunk_gated_delta_rule", 0) is None:
            module.chunk_gated_delta_rule = chunk_gated_delta_rule
            module.l2norm = l2norm
            if hasattr(module, "HAVE_FLA"):
                module.HAVE_FLA = True
            if getattr(module, "causal_conv1d", 0) is None:  # 0.19: fla's [b, s, d] conv
                module.causal_conv1d = causal_conv.fla_causal_conv1d
            if getattr(module, "causal_conv1d_fn", 0) is None:  # 0.16: the causal_conv1d package's
                module.causal_conv1d_fn = causal_conv.causal_conv1d_fn
                module.causal_conv1d_update = causal_conv.causal_conv1d_update
