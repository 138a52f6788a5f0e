"""The conformance checks, as plain functions that raise :class:`ConformanceFailure`.

The pytest suite (:mod:`pai_zoo_conformance.suite`) calls them on a family's ``tiny``
preset; they can also be called directly, e.g. on a deliberately broken family.

They live in modules by what they check, and every name is importable from here: :mod:`.cases` (the case under
test and :class:`ConformanceFailure`), :mod:`.config_checks` (registration, presets, the config translation),
:mod:`.weight_checks` (table coverage, weight round trips), :mod:`.forward_checks` (logits, one process and
parallel), :mod:`.generation_checks`, :mod:`.tokenizer_checks` and :mod:`.training_checks` (training, LoRA). This
module adds :func:`check_variant`, which runs several of them on one variant of a preset.
"""
from __future__ import annotations

from pai_zoo.families.family import Family

# the private names (_fail, _randomise, _hf_dict ...) stay importable from here, as before the split
from .cases import (  # noqa: F401
    _SHARED_CASES,
    Case,
    ConformanceFailure,
    _fail,
    _randomise,
    build_case,
    copy_case,
    odd_preset,
    shared_case,
    zero_centered_norms,
)
from .config_checks import (  # noqa: F401
    _hf_dict,
    check_config_round_trip,
    check_preset_matches_published,
    check_registration,
)
from .forward_checks import (  # noqa: F401
    LOGITS_ATOL,
    PARALLEL_ATOL,
    PARALLEL_LAYOUTS,
    _check_vision_forward,
    _handles,
    check_forward_equivalence,
    check_parallel_equivalence,
    logits_delta,
    vision_example,
)
from .generation_checks import GENERATION_TIE_TOL, _check_vision_generation, check_generation  # noqa: F401
from .thresholds import check_layer_kinds, forward_plan, layer_kinds, thresholds  # noqa: F401
from .tokenizer_checks import (  # noqa: F401
    MIXED_TEXT,
    _model_token_ids,
    _test_tokenizers,
    check_tokenizer,
    check_tokenizer_against_model,
)
from .tool_checks import check_inspect, check_megatron_args, check_plan  # noqa: F401
from .training_checks import check_lora, check_training
from .weight_checks import _read_json, check_disk_round_trip, check_mapping_coverage, check_weight_round_trip  # noqa: F401

__all__ = [
    "GENERATION_TIE_TOL",
    "LOGITS_ATOL",
    "MIXED_TEXT",
    "PARALLEL_ATOL",
    "PARALLEL_LAYOUTS",
    "Case",
    "ConformanceFailure",
    "build_case",
    "check_config_round_trip",
    "check_disk_round_trip",
    "check_forward_equivalence",
    "check_generation",
    "check_inspect",
    "check_layer_kinds",
    "check_lora",
    "check_mapping_coverage",
    "check_megatron_args",
    "check_parallel_equivalence",
    "check_plan",
    "check_preset_matches_published",
    "check_registration",
    "check_tokenizer",
    "check_tokenizer_against_model",
    "check_training",
    "check_variant",
    "check_weight_round_trip",
    "copy_case",
    "odd_preset",
    "shared_case",
    "vision_example",
    "zero_centered_norms",
]


def check_variant(family: Family, preset: str | None = None, *, generation: bool = False, **overrides) -> float:
    """A variant of ``preset`` (default: the tiny one; ``overrides`` on its config): built in both backends, the
    table covers it both ways, the weights round-trip bit-identically and the logits agree
    (:func:`check_forward_equivalence`); with ``generation``, greedy generation too (:func:`check_generation`).
    Returns max |logits delta|."""
    case = build_case(family, preset, **overrides)
    check_mapping_coverage(case)
    check_weight_round_trip(case)
    delta = check_forward_equivalence(case)
    if generation:
        check_generation(case)
    return delta
