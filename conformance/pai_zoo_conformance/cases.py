"""The case every check runs on: a family's preset built in both backends with the same (re-drawn) weights
(:class:`Case`, :func:`build_case`, shared once per process by :func:`shared_case`), and the failure every check
raises (:class:`ConformanceFailure`)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from pai_zoo.families.family import Family
from pai_zoo.plugin.errors import MappingError


class ConformanceFailure(AssertionError):
    """A family does not conform; the message says which check and what differs."""


def _fail(check: str, message: str):
    raise ConformanceFailure(f"[{check}] {message}")


@dataclass
class Case:
    """A family's preset built in both backends with the same weights."""

    family: Family
    preset: str
    hf_config: Any
    mcore_config: Any
    hf_model: Any
    mcore_model: Any


def build_case(family: Family, preset: str | None = None, seed: int = 0, **overrides) -> Case:
    """Random-initialise the transformers model of ``preset`` (default: the tiny one), build the
    megatron-core model and load the same weights into it through the family's table."""
    import torch

    from pai_zoo.hf import models as hf
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.compat import ensure_model_parallel
    from pai_zoo.models.state_dicts import hf_model_to_mcore

    preset = preset or family.tiny
    config = {**family.presets[preset], **overrides}
    hf_config = hf.hf_config(family, config)
    torch.manual_seed(seed)
    hf_model = hf.build_hf_model(family, hf_config)
    mcore_config = family.to_mcore_config(hf.config_dict(hf_config))
    _randomise(hf_model, seed, norm_identity=0.0 if zero_centered_norms(family, mcore_config) else 1.0)
    ensure_model_parallel()
    mcore_model = build_gpt_model(family, mcore_config).eval()
    try:
        hf_model_to_mcore(family, mcore_config, hf_model, mcore_model)
    except MappingError as exc:
        _fail("mapping", f"{preset}: loading the transformers weights into megatron-core failed: {exc}")
    return Case(family, preset, hf_config, mcore_config, hf_model, mcore_model)


#: The cases :func:`shared_case` built in this process: (id(family), preset, seed) -> (family, case).
_SHARED_CASES: dict[tuple, tuple[Family, Case]] = {}


def shared_case(family: Family, preset: str | None = None, seed: int = 0) -> Case:
    """:func:`build_case` of ``family``'s ``preset`` and ``seed``, built once per process and shared by every test
    that only reads it (the conformance suite's checks copy a model before they train or change it). A test that
    changes a model takes :func:`copy_case` of it, or builds its own. The key is the family object itself: a family
    registered afresh, or a deliberately broken copy, gets a case of its own."""
    key = (id(family), preset or family.tiny, seed)
    hit = _SHARED_CASES.get(key)
    if hit is None or hit[0] is not family:
        hit = _SHARED_CASES[key] = (family, build_case(family, preset, seed))
    return hit[1]


def copy_case(case: Case) -> Case:
    """A copy of ``case`` that a test may change: the transformers model and the configs deep-copied, the
    megatron-core model built afresh with the same weights (its modules hold process groups, which do not copy)."""
    import copy
    import dataclasses

    from pai_zoo.mcore.build import build_gpt_model

    mcore_model = build_gpt_model(case.family, case.mcore_config).eval()
    mcore_model.load_state_dict(case.mcore_model.state_dict())
    return dataclasses.replace(case, hf_config=copy.deepcopy(case.hf_config), mcore_config=copy.deepcopy(
        case.mcore_config), hf_model=copy.deepcopy(case.hf_model), mcore_model=mcore_model)


def zero_centered_norms(family: Family, mcore_config) -> bool:
    """Whether the family's norms scale by ``1 + weight``: :attr:`Family.zero_centered_norms`, else the arch's
    ``layernorm_zero_centered_gamma``."""
    if family.zero_centered_norms is not None:
        return bool(family.zero_centered_norms)
    return bool(mcore_config.get("layernorm_zero_centered_gamma", False))


def _randomise(model, seed: int, norm_identity: float = 1.0) -> None:
    """Re-draw every weight so that the check is sensitive: matrices with std 1/sqrt(fan-in)
    (unit-scale activations, so attention is sharp and positions matter, unlike the tiny
    default init), norm weights near the norm's identity (``norm_identity``: 1, or 0 for norms that
    scale by ``1 + weight``, so that their gain is near 1 too and the margin does not depend on the
    seed) and biases near zero but all distinct (a router's ``e_score_correction_bias`` buffer too), so that a
    table swapping two tensors cannot pass unnoticed."""
    import torch

    gen = torch.Generator().manual_seed(seed + 1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            noise = torch.randn(p.shape, generator=gen, dtype=torch.float32)
            if p.dim() >= 2:
                p.copy_(noise / p.shape[-1] ** 0.5)
            elif name.endswith("bias"):
                p.copy_(0.1 * noise)
            else:
                p.copy_(norm_identity + 0.1 * noise)
        for name, b in model.named_buffers():  # a MoE router's score-correction bias: a buffer, zero at init
            if name.endswith("e_score_correction_bias"):
                b.copy_(0.1 * torch.randn(b.shape, generator=gen, dtype=torch.float32))


def odd_preset(family: Family) -> str:
    """The family's ``odd`` preset (unusual shapes); a family without one does not conform."""
    if family.odd is None:
        _fail("odd", f"family {family.name!r} declares no odd preset (Family.odd): a small preset with a head count "
                     "that is not a power of two, a GQA ratio of 3, a vocabulary that is no multiple of 128, "
                     "head_dim != hidden/heads and biases, wherever the family allows them")
    return family.odd
