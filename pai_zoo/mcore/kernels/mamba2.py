"""Pure-torch Mamba-2 kernels, used where ``mamba_ssm`` (CUDA/Triton) is absent or the tensors live on a CPU.

Signature-compatible with what megatron-core's ``MambaMixer`` calls:

* :func:`mamba_chunk_scan_combined` -- the chunked SSD scan (``mamba_ssm.ops.triton.ssd_combined``): ``chunk_size``,
  ``D``, ``z``, ``dt_bias``, ``dt_softplus``, ``dt_limit``, ``seq_idx`` (packed records: the state restarts where the
  index changes), ``initial_states``, ``return_final_states``;
* :func:`selective_state_update` -- one decode step of the recurrence, in place on the state;
* :class:`RMSNormGated` -- the gated, grouped RMSNorm (``mamba_ssm.ops.triton.layernorm_gated.RMSNorm``);
and :mod:`.causal_conv`'s depthwise causal convolution (with ``seq_idx``) and its one-token state update.

The scan is transformers' torch fallback (``modeling_nemotron_h.mamba2_chunk_scan``: ``segment_sum`` and the four
SSD terms) computed the same way, so the two agree to float32 rounding. :func:`install` puts them into
``megatron.core.ssm.mamba_mixer`` where the packages are missing (megatron-core 0.16.1 and 0.19.2); :func:`pick` gives
a caller the real kernel for GPU tensors where there is one, else the torch version.
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

from .causal_conv import causal_conv1d_fn, causal_conv1d_update

__all__ = ["RMSNormGated", "install", "mamba_chunk_scan_combined",
           "pick", "segment_sum", "selective_state_update"]


def segment_sum(x):
    """``[..., T]`` -> ``[..., T, T]``: entry ``(i, j)`` is ``sum(x[j+1 : i+1])`` for ``j <= i``, ``-inf`` above the
    diagonal (transformers' stable form: masked cumulative sums)."""
    t = x.size(-1)
    x = x[..., None].expand(*x.size(), t)
    mask = torch.tril(torch.ones(t, t, device=x.device, dtype=torch.bool), diagonal=-1)
    x = x.masked_fill(~mask, 0)
    out = torch.cumsum(x, dim=-2)
    mask = torch.tril(torch.ones(t, t, device=x.device, dtype=torch.bool), diagonal=0)
    return out.masked_fill(~mask, -torch.inf)


def _chunks(t, pad, chunk):
    t = F.pad(t, (0, 0) * (t.dim() - 2) + (0, pad))
    return t.reshape(t.shape[0], -1, chunk, *t.shape[2:])


def _scan(x, dt, A, B, C, chunk_size, D, initial_states):
    """The SSD scan of one span: x ``[b, l, h, p]``, dt ``[b, l, h]`` (discretisation step, final), A ``[h]``,
    B/C ``[b, l, g, n]``. Returns (y ``[b, l, h, p]``, final state ``[b, h, p, n]``)."""
    b, length, heads, _ = x.shape
    groups = B.shape[2]
    x = x.float()
    B = B.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    C = C.float().repeat_interleave(heads // groups, dim=2, output_size=heads)
    pad = (chunk_size - length % chunk_size) % chunk_size
    residual = None
    if D is not None:
        d = D.float()
        residual = (d[..., None] if d.dim() == 1 else d) * F.pad(x, (0, 0, 0, 0, 0, pad))
    x = x * dt[..., None].float()
    A = A.to(x.dtype) * dt.float()
    x, A, B, C = (_chunks(t, pad, chunk_size) for t in (x, A, B, C))
    A = A.permute(0, 3, 1, 2)
    A_cumsum = torch.cumsum(A, dim=-1)
    L = torch.exp(segment_sum(A))
    G = torch.einsum("bclhn,bcshn->bclsh", C, B)
    M = G * L.permute(0, 2, 3, 4, 1)
    y_diag = torch.einsum("bclsh,bcshp->bclhp", M, x)
    decay_states = torch.exp(A_cumsum[:, :, :, -1:] - A_cumsum)
    B_decay = B * decay_states.permute(0, -2, -1, 1)[..., None]
    states = torch.einsum("bclhn,bclhp->bchpn", B_decay, x)
    previous = (initial_states[:, None].to(dtype=states.dtype, device=states.device) if initial_states is not None
                else torch.zeros_like(states[:, :1]))
    states = torch.cat([previous, states], dim=1)
    decay_chunk = torch.exp(segment_sum(F.pad(A_cumsum[:, :, :, -1], (1, 0)))).transpose(1, 3)
    new_states = torch.einsum("bzch,bzhpn->bchpn", decay_chunk, states)
    states, final = new_states[:, :-1], new_states[:, -1]
    y_off = torch.einsum("bclhn,bchpn->bclhp", C, states) * torch.exp(A_cumsum).permute(0, 2, 3, 1)[..., None]
    y = (y_diag + y_off).reshape(b, -1, heads, x.shape[-1])
    if residual is not None:
        y = y + residual
    return y[:, :length], final


def _runs(row):
    """``(start, end)`` of the runs of equal values in a 1-D tensor."""
    values = row.tolist()
    spans, start = [], 0
    for i in range(1, len(values) + 1):
        if i == len(values) or values[i] != values[start]:
            spans.append((start, i))
            start = i
    return spans


def mamba_chunk_scan_combined(x, dt, A, B, C, chunk_size, D=None, z=None, dt_bias=None, initial_states=None,
                              seq_idx=None, cu_seqlens=None, dt_softplus=False, dt_limit=(0.0, float("inf")),
                              return_final_states=False, return_varlen_states=False, **_):
    """``mamba_ssm``'s ``mamba_chunk_scan_combined`` in torch: x ``[b, l, h, p]``, dt ``[b, l, h]``, A ``[h]``,
    B/C ``[b, l, g, n]``, D ``[h]`` or ``[h, p]``, z ``[b, l, h, p]`` (output gate ``y * silu(z)``). ``seq_idx``
    ``[b, l]``: each run of one index is scanned from a zero state (the first from ``initial_states``); the final
    state is the last run's."""
    if cu_seqlens is not None or return_varlen_states:
        raise NotImplementedError("the torch Mamba-2 scan takes seq_idx, not cu_seqlens / varlen states")
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = torch.clamp(dt, min=dt_limit[0], max=dt_limit[1])
    if seq_idx is None:
        y, final = _scan(x, dt, A, B, C, chunk_size, D, initial_states)
    else:
        y = torch.empty(x.shape, dtype=torch.float32, device=x.device)
        finals = []
        for row in range(x.shape[0]):
            for k, (start, end) in enumerate(_runs(seq_idx[row])):
                first = initial_states[row:row + 1] if initial_states is not None and k == 0 else None
                part = slice(row, row + 1), slice(start, end)
                y[part], state = _scan(x[part], dt[part], A, B[part], C[part], chunk_size, D, first)
            finals.append(state)
        final = torch.cat(finals)
    if z is not None:
        y = y * F.silu(z.float())
    y = y.to(x.dtype)
    return (y, final) if return_final_states else y


def selective_state_update(state, x, dt, A, B, C, D=None, z=None, dt_bias=None, dt_softplus=False,
                           state_batch_indices=None, **_):
    """One step of the recurrence, ``state`` ``[b, h, p, n]`` updated in place (rows ``state_batch_indices`` of it
    when given): x/dt/z ``[b, h, p]``, A ``[h, p, n]``, B/C ``[b, g, n]``, D/dt_bias ``[h, p]``; returns y
    ``[b, h, p]``. transformers' ``mamba2_selective_state_update``, computed the same way."""
    rows = state if state_batch_indices is None else state[state_batch_indices]
    b, heads, head_dim = x.shape
    groups, n = B.shape[1], B.shape[-1]
    if dt_bias is not None:
        dt = dt + dt_bias.to(dt.dtype)
    if dt_softplus:
        dt = F.softplus(dt)
    dt = dt[..., None]
    dA = torch.exp(dt.float() * A.float())
    B = B.reshape(b, groups, 1, n).expand(b, groups, heads // groups, n).reshape(b, heads, 1, n)
    new = rows * dA + (dt * B * x[..., None])
    if state_batch_indices is None:
        state.copy_(new.to(state.dtype))
    else:
        state[state_batch_indices] = new.to(state.dtype)
    C = C.reshape(b, groups, 1, n).expand(b, groups, heads // groups, n).reshape(b * heads, n, 1)
    out = torch.bmm(new.to(C.dtype).reshape(b * heads, head_dim, n), C).view(b, heads, head_dim)
    if D is not None:
        out = (out + x * D).to(out.dtype)
    if z is not None:
        out = out * F.silu(z)
    return out.to(x.dtype)


class RMSNormGated(torch.nn.Module):
    """``mamba_ssm``'s gated RMSNorm: ``rmsnorm(x * silu(z)) * weight`` per group of ``group_size`` channels
    (``norm_before_gate=False``), or ``rmsnorm(x) * weight * silu(z)``; in float32, cast back to ``x``'s dtype."""

    def __init__(self, hidden_size, eps=1e-5, group_size=None, norm_before_gate=True, device=None, dtype=None):
        super().__init__()
        self.eps, self.group_size, self.norm_before_gate = eps, group_size or hidden_size, norm_before_gate
        self.weight = torch.nn.Parameter(torch.ones(hidden_size, device=device, dtype=dtype))
        self.register_parameter("bias", None)

    def forward(self, x, z=None):
        dtype = x.dtype
        h = x.float()
        if z is not None and not self.norm_before_gate:
            h = h * F.silu(z.float())
        *prefix, last = h.shape
        grouped = h.view(*prefix, last // self.group_size, self.group_size)
        grouped = grouped * torch.rsqrt(grouped.pow(2).mean(-1, keepdim=True) + self.eps)
        h = grouped.view(*prefix, last)
        if z is not None and self.norm_before_gate:
            h = h * F.silu(z.float())
        return self.weight * h.to(dtype)


class ExtendedRMSNorm(RMSNormGated):
    """:class:`RMSNormGated` with megatron-core's ``ExtendedRMSNorm.sharded_state_dict`` (the weight split over TP
    along axis 0), which megatron-core defines on ``mamba_ssm``'s class (a ``MagicMock`` without it)."""

    def sharded_state_dict(self, prefix="", sharded_offsets=(), metadata=None):
        from megatron.core import parallel_state
        from megatron.core.transformer.utils import make_sharded_tensors_for_checkpoint

        if not hasattr(self, "tp_group"):
            self.tp_group = parallel_state.get_tensor_model_parallel_group()
        return make_sharded_tensors_for_checkpoint(self.state_dict(prefix="", keep_vars=True), prefix, {"weight": 0},
                                                   sharded_offsets, tp_group=self.tp_group,
                                                   dp_cp_group=metadata["dp_cp_group"])


_TORCH = {"mamba_chunk_scan_combined": mamba_chunk_scan_combined, "selective_state_update": selective_state_update,
          "causal_conv1d_fn": causal_conv1d_fn, "causal_conv1d_update": causal_conv1d_update}


_TENSOR_OPS = "megatron.core.inference.contexts.attention_context.triton.tensor_ops"


def mixer_module():
    """``megatron.core.ssm.mamba_mixer``. Where Triton is not installed (megatron-core 0.16 imports it for the
    dynamic-inference helpers ``tensor_get_slice_after`` / ``tensor_masked_update`` / ``tensor_merge`` only, which
    pai-zoo's static path never calls), those helpers come from a stub module that refuses to run."""
    import importlib
    import sys
    import types

    try:
        importlib.import_module(_TENSOR_OPS)
    except ModuleNotFoundError as err:
        if err.name != "triton":
            raise
        stub = types.ModuleType(_TENSOR_OPS)

        def refuse(*_, **__):
            raise RuntimeError("megatron-core's dynamic-inference Mamba path needs Triton")

        stub.tensor_get_slice_after = stub.tensor_masked_update = stub.tensor_merge = refuse
        sys.modules[_TENSOR_OPS] = stub
    return importlib.import_module("megatron.core.ssm.mamba_mixer")


#: Where a kernel's real version comes from: the packages (and megatron-core 0.19's own Triton state update, which
#: takes the same arguments; its Triton conv update does not).
_REAL = {"mamba_chunk_scan_combined": ("mamba_ssm",),
         "selective_state_update": ("mamba_ssm", "megatron.core.ssm.ops.mamba_ssm"),
         "causal_conv1d_fn": ("causal_conv1d",), "causal_conv1d_update": ("causal_conv1d",)}


def pick(name: str, tensor):
    """The kernel ``name`` for ``tensor``: megatron-core's module's where it is the real kernel (:data:`_REAL`) and
    the tensor is on a GPU, else the torch one."""
    found = getattr(mixer_module(), name, None)
    module = getattr(found, "__module__", "") or ""
    if tensor.device.type == "cpu" or not module.startswith(_REAL[name]):
        return _TORCH[name]
    return found


def install() -> None:
    """Give ``megatron.core.ssm.mamba_mixer`` these torch paths where ``mamba_ssm`` / ``causal_conv1d`` are absent:
    the scan, the state update and the convolutions, ``RMSNormGated`` and an ``ExtendedRMSNorm`` on it that keeps
    megatron-core's ``sharded_state_dict`` (without ``mamba_ssm`` megatron-core derives it from a ``MagicMock``);
    ``HAVE_MAMBA_SSM`` then holds, so ``MambaMixer`` builds."""
    mm = mixer_module()
    if mm.HAVE_MAMBA_SSM:
        return
    mm.RMSNormGated = RMSNormGated
    mm.ExtendedRMSNorm = ExtendedRMSNorm
    mm.mamba_chunk_scan_combined = mamba_chunk_scan_combined
    for name in ("selective_state_update", "causal_conv1d_fn", "causal_conv1d_update"):
        if getattr(mm, name, None) is None:
            setattr(mm, name, _TORCH[name])
    mm.HAVE_MAMBA_SSM = True
