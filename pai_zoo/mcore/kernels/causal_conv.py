"""Torch depthwise causal convolution: the ``causal_conv1d`` package's entry points and ``fla``'s ``causal_conv1d``.

* :func:`causal_conv1d_fn` -- ``causal_conv1d.causal_conv1d_fn(x, weight, bias, seq_idx, initial_states,
  return_final_states, final_states_out, activation)``: ``x`` is ``[b, d, s]``, ``weight`` ``[d, w]``; the output token
  ``t`` sees inputs ``t - w + 1 .. t`` (before the first: the initial state, else zeros). ``seq_idx`` (``[b, s]`` int)
  restarts the window wherever it changes, as packed records need.
* :func:`causal_conv1d_update` -- one (or a few) decode steps: ``x`` ``[b, d]`` or ``[b, d, s]``, ``conv_state``
  ``[b, d, state_len]`` updated in place to the last ``state_len`` inputs.
* :func:`fla_causal_conv1d` -- ``fla.modules.convolution.causal_conv1d(x, weight, bias, activation, initial_state,
  output_final_state, cu_seqlens)``: ``x`` is ``[b, s, d]``, returns ``(y, final_state)``; megatron-core 0.19 calls it.

The state holds the last ``w - 1`` inputs (``state[..., -1]`` the newest), as both packages keep it. Float32 results
equal transformers' ``torch_causal_conv1d_update`` / ``causal_conv1d_fn`` (``tests/test_kernels_causal_conv.py``).
"""
from __future__ import annotations

import torch
import torch.nn.functional as F

__all__ = ["activate", "causal_conv1d_fn", "causal_conv1d_update", "fla_causal_conv1d"]


def activate(x, activation):
    """``silu``/``swish`` or ``None`` (identity), as the kernels accept."""
    if activation is None:
        return x
    if activation in ("silu", "swish"):
        return F.silu(x)
    raise ValueError(f"causal conv1d: activation {activation!r} is not one of None, 'silu', 'swish'")


def _conv(x, weight, bias, initial_states):
    """``[b, d, s]`` -> ``[b, d, s]`` pre-activation, the window prefixed by ``initial_states`` (or zeros)."""
    width = weight.shape[-1]
    if initial_states is None:
        padded = F.pad(x, (width - 1, 0))
    else:
        padded = torch.cat([initial_states.to(x.dtype), x], dim=-1)
    return F.conv1d(padded, weight.unsqueeze(1).to(x.dtype), bias, groups=x.shape[1])


def _final_state(x, width, initial_states):
    """The last ``width - 1`` inputs (``[b, d, width - 1]``), reaching into ``initial_states`` (or zeros) if short."""
    prefix = F.pad(x, (width - 1, 0)) if initial_states is None else torch.cat([initial_states.to(x.dtype), x], -1)
    return prefix[..., prefix.shape[-1] - (width - 1):]


def causal_conv1d_fn(x, weight, bias=None, seq_idx=None, initial_states=None, return_final_states=False,
                     final_states_out=None, activation=None):
    """Depthwise causal conv1d over ``x`` ``[b, d, s]`` with ``weight`` ``[d, w]``; see the module docstring."""
    width = weight.shape[-1]
    dtype = x.dtype
    x = x.to(weight.dtype)
    if seq_idx is None:
        out = activate(_conv(x, weight, bias, initial_states), activation)
    else:
        out = torch.empty_like(x)
        for row in range(x.shape[0]):
            ids = seq_idx[row]
            cuts = [0] + ((ids[1:] != ids[:-1]).nonzero().flatten() + 1).tolist() + [x.shape[-1]]
            for start, stop in zip(cuts[:-1], cuts[1:]):
                init = initial_states[row:row + 1] if initial_states is not None and start == 0 else None
                out[row:row + 1, :, start:stop] = activate(
                    _conv(x[row:row + 1, :, start:stop], weight, bias, init), activation)
    out = out.to(dtype)
    if not return_final_states:
        return out
    final = _final_state(x, width, initial_states).to(dtype)
    if final_states_out is not None:
        final_states_out.copy_(final)
        final = final_states_out
    return out, final


def causal_conv1d_update(x, conv_state, weight, bias=None, activation=None, cache_seqlens=None,
                         conv_state_indices=None):
    """Decode step(s): ``x`` ``[b, d]`` or ``[b, d, s]``; ``conv_state`` ``[b, d, state_len]`` is updated in place."""
    if cache_seqlens is not None or conv_state_indices is not None:
        raise NotImplementedError("causal_conv1d_update (torch path): cache_seqlens / conv_state_indices")
    squeeze = x.dim() == 2
    if squeeze:
        x = x.unsqueeze(-1)
    dtype = x.dtype
    length, state_len, width = x.shape[-1], conv_state.shape[-1], weight.shape[-1]
    window = torch.cat([conv_state.to(weight.dtype), x.to(weight.dtype)], dim=-1)
    conv_state.copy_(window[..., -state_len:])
    out = F.conv1d(window[..., window.shape[-1] - (length + width - 1):], weight.unsqueeze(1), bias,
                   groups=x.shape[1])
    out = activate(out, activation).to(dtype)
    return out.squeeze(-1) if squeeze else out


def fla_causal_conv1d(x, weight, bias=None, residual=None, initial_state=None, output_final_state=False,
                      final_state=None, activation=None, cu_seqlens=None, **_):
    """``fla``'s layout: ``x`` ``[b, s, d]`` (``b == 1`` with ``cu_seqlens``), returns ``(y [b, s, d], final_state)``
    with ``final_state`` ``[n, d, w - 1]`` (one row per sequence) when asked."""
    if weight.dim() == 3:
        weight = weight.squeeze(1)
    xt = x.transpose(1, 2)
    width = weight.shape[-1]
    if cu_seqlens is None:
        y, state = causal_conv1d_fn(xt, weight, bias, initial_states=initial_state, return_final_states=True,
                                    activation=activation)
        finals = state
    else:
        bounds = cu_seqlens.tolist()
        y = torch.empty_like(xt)
        finals = []
        for n, (start, stop) in enumerate(zip(bounds[:-1], bounds[1:])):
            init = initial_state[n:n + 1] if initial_state is not None else None
            y[..., start:stop], state = causal_conv1d_fn(xt[..., start:stop], weight, bias, initial_states=init,
                                                         return_final_states=True, activation=activation)
            finals.append(state)
        finals = torch.cat(finals) if finals else xt.new_zeros(0, xt.shape[1], width - 1)
    y = y.transpose(1, 2)
    if residual is not None:
        y = y + residual
    return y, (finals if output_final_state else None)
