"""The one rule by which two models' logits agree: ``convert --verify`` and the conformance suite use it.

``max |delta logits| <= atol + rtol * max |logits|`` (the reference's logits), with ``(atol, rtol)`` named per
dtype in :data:`VERIFY_TOLERANCES`, reported with the cosine similarity and the next-token (argmax) agreement.
Importing this module imports no torch (``pai-zoo --help`` shows the defaults).
"""
from __future__ import annotations

from ..plugin.errors import PaiZooError

#: ``(atol, rtol)`` per dtype. Float32 kernels round differently in the two backends by some units of ~1e-7
#: relative per layer, so the noise grows with the size of the logits, not by a fixed amount: a trained model
#: with logits around 20 shows ~1e-4 (a fixed 1e-4 failed it). The tiny presets of the conformance suite
#: (max |logits| 3.9 to 7.4) get bounds of 5.9e-5 to 9.4e-5, below the fixed 1e-4 that suite used before.
#: bf16/fp16 apply where a conversion changed the stored dtype (``--dtype``): every weight's rounding shows in
#: the logits. A wrong layer, norm or mapping moves the logits by a large part of their size, past every bound.
VERIFY_TOLERANCES = {"fp32": (2e-5, 1e-5), "fp16": (1e-3, 4e-3), "bf16": (1e-2, 3e-2)}
DTYPE_ALIASES = {"bfloat16": "bf16", "float16": "fp16", "float32": "fp32", "torch.bfloat16": "bf16",
                 "torch.float16": "fp16", "torch.float32": "fp32"}


def parse_tolerance(value) -> tuple[float, float]:
    """``--verify-tolerance``: ``"ATOL"`` (absolute only: RTOL 0) or ``"ATOL,RTOL"``; or a pair already."""
    parts = list(value) if isinstance(value, (tuple, list)) else [p.strip() for p in str(value).split(",")]
    try:
        numbers = [float(p) for p in parts]
    except (TypeError, ValueError):
        numbers = []
    if len(numbers) not in (1, 2) or any(not n >= 0 for n in numbers):  # not >= 0: also NaN
        raise PaiZooError(f"--verify-tolerance {value!r}: give ATOL or ATOL,RTOL, numbers >= 0 (the check is "
                          "max |delta logits| <= ATOL + RTOL x max |logits|; e.g. 1e-4 or 2e-5,1e-5)")
    return numbers[0], numbers[1] if len(numbers) == 2 else 0.0


def dtype_name(dtype) -> str:
    """``"fp32"``, ``"fp16"`` or ``"bf16"`` for a name or a torch dtype."""
    name = str(dtype)
    return DTYPE_ALIASES.get(name, name)


def tolerance_for(max_abs_logit: float, dtype="fp32", tolerance=None) -> dict:
    """The bound for logits whose largest magnitude is ``max_abs_logit``: ``atol + rtol * max_abs_logit`` with
    ``(atol, rtol)`` from ``tolerance`` (``(atol, rtol)`` or ``"ATOL[,RTOL]"``) or :data:`VERIFY_TOLERANCES`."""
    if tolerance is not None:
        (atol, rtol), name = parse_tolerance(tolerance), "given"
    else:
        name = dtype_name(dtype)
        if name not in VERIFY_TOLERANCES:
            raise PaiZooError(f"no logits tolerance for dtype {dtype!r}; use one of {', '.join(VERIFY_TOLERANCES)}")
        atol, rtol = VERIFY_TOLERANCES[name]
    return {"tolerance": atol + rtol * max_abs_logit, "atol": atol, "rtol": rtol, "max_abs_logit": max_abs_logit,
            "dtype": name}


def compare_logits(reference, candidate, dtype="fp32", tolerance=None) -> dict:
    """Compare ``candidate`` logits with ``reference`` ones (same shape, ``[..., vocab]``): ``ok`` when
    ``max |delta| <= atol + rtol * max |reference|`` (:func:`tolerance_for`), with ``max_abs_delta``, the bound
    (``tolerance``, ``atol``, ``rtol``, ``max_abs_logit``, ``dtype``), ``cosine`` and the next-token agreement
    (``next_token_agreement``, ``next_token_agreed`` of ``next_tokens``). Where the bound holds, a differing
    argmax is a near tie (the two logits within twice the bound), so the agreement is reported, not required."""
    import torch

    a, b = reference.detach().double().flatten(), candidate.detach().double().flatten()
    delta = (a - b).abs().max().item() if a.numel() else 0.0
    scale = a.abs().max().item() if a.numel() else 0.0
    same = reference.argmax(-1) == candidate.argmax(-1)
    result = {"max_abs_delta": delta, "cosine": torch.nn.functional.cosine_similarity(a, b, dim=0).item(),
              "next_token_agreement": same.double().mean().item(), "next_token_agreed": int(same.sum().item()),
              "next_tokens": same.numel(), **tolerance_for(scale, dtype, tolerance)}
    result["ok"] = bool(delta <= result["tolerance"])  # NaN logits fail
    return result


def describe_verification(v: dict) -> str:
    """One line: ``verify: max |delta logits| = ... <= tolerance ... (fp32: atol + rtol x max |logits| ...),
    cosine = ..., next-token agreement = ...: OK`` (or ``> ...: FAILED``)."""
    sign = "<=" if v["ok"] else ">"
    return (f"verify: max |delta logits| = {v['max_abs_delta']:.3g} {sign} tolerance {v['tolerance']:.3g} "
            f"({v['dtype']}: {v['atol']:g} + {v['rtol']:g} x max |logits| {v['max_abs_logit']:.3g}), "
            f"cosine = {v['cosine']:.6f}, next-token agreement = {v['next_token_agreement']:.1%} "
            f"({v['next_token_agreed']} of {v['next_tokens']}): {'OK' if v['ok'] else 'FAILED'}")
