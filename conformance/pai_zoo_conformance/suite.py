"""The conformance suite as a pytest test class.

A family plugin runs it against itself with a three-line test module::

    from pai_zoo_conformance import ConformanceSuite

    class TestLlamaConformance(ConformanceSuite):
        family = "llama"
        once = True   # optional: the full suite in one megatron-core pass, the forward checks in every pass

``pai-zoo conformance NAME`` runs the same class on any installed family.

With ``once = True`` every test but :data:`EVERY_PASS` is marked ``megatron_once`` at collection
(:func:`mark_once`, called by the pytest plugin): ``make test`` runs them in the megatron-core 0.19 pass only, and the
forward checks in both; ``once = "first"`` runs them in the megatron-core 0.16 pass instead (to balance the two).
"""
from __future__ import annotations

import pytest

from . import checks

#: The ``user_properties`` name under which a check reports its max |delta|s (label -> float); the pytest plugin
#: (:mod:`pai_zoo_conformance.plugin`) records them with the outcome.
DELTAS = "pai_zoo_max_abs_delta"


#: The checks a ``once`` suite still runs in every megatron-core pass: the logits against transformers.
EVERY_PASS = ("test_forward_equivalence", "test_odd_preset_forward_equivalence")


def mark_once(items) -> None:
    """Mark ``megatron_once`` every collected test of a ``once = True`` :class:`ConformanceSuite` subclass but the
    checks of :data:`EVERY_PASS` (before :func:`pai_zoo_conformance.megatron_free.modify_items` selects)."""
    from .megatron_free import ONCE

    for item in items:
        cls = getattr(item, "cls", None)
        if cls is None or not issubclass(cls, ConformanceSuite) or not getattr(cls, "once", False):
            continue
        if (getattr(item, "originalname", None) or item.name) not in EVERY_PASS:
            item.add_marker(getattr(pytest.mark, ONCE)(first=True) if cls.once == "first" else ONCE)


def _record(request, deltas: dict) -> None:
    """Report a passed check's max |delta|s (label -> float) for the conformance record."""
    request.node.user_properties.append((DELTAS, deltas))


def _parallel(deltas: dict) -> dict:
    return {f"tp={tp} pp={pp}": delta for (tp, pp), delta in deltas.items()}


class ConformanceSuite:
    """Every conformance check on one family's ``tiny`` preset (float32, CPU), and the forward,
    round-trip and tensor-parallel checks on its ``odd`` preset (unusual shapes)."""

    #: The family name or alias to check (``pai-zoo conformance`` parametrizes it instead).
    family: str | None = None
    #: True: every check runs in one megatron-core pass (``megatron_once``), the forward checks in every pass;
    #: ``"first"``: the same in the first pass (``megatron_once(first=True)``).
    once: bool | str = False

    @pytest.fixture(scope="class")
    @classmethod
    def family_name(cls):
        if cls.family is None:
            pytest.fail("set `family = \"<name>\"` on the ConformanceSuite subclass")
        return cls.family

    @pytest.fixture(scope="class")
    @classmethod
    def fam(cls, family_name):
        from pai_zoo.families.registry import get_registry

        return get_registry().family(family_name)

    @pytest.fixture(scope="class")
    @classmethod
    def case(cls, fam):
        return checks.shared_case(fam)

    @pytest.fixture(scope="class")
    @classmethod
    def odd_case(cls, fam):
        return checks.shared_case(fam, checks.odd_preset(fam))

    def test_registration(self, fam):
        checks.check_registration(fam)

    def test_config_round_trip_every_preset(self, fam):
        for preset in fam.presets:
            checks.check_config_round_trip(fam, preset)

    def test_mapping_coverage(self, case):
        checks.check_mapping_coverage(case)

    def test_weights_round_trip_bit_identical(self, case, request):
        _record(request, {"round trip": checks.check_weight_round_trip(case)})

    def test_forward_equivalence(self, case, request):
        _record(request, {"forward": checks.check_forward_equivalence(case)})

    def test_inspect_plan_and_megatron_lm_args(self, case, tmp_path):
        from .tool_checks import check_inspect, check_megatron_args, check_plan

        check_inspect(case, tmp_path / "hf")
        check_plan(case)
        check_megatron_args(case)

    def test_tokenizer_matches_transformers(self, fam, tmp_path_factory):
        checks.check_tokenizer(fam, tmp_path_factory.mktemp(f"{fam.name}-tokenizer"))

    def test_tokenizer_fits_the_model(self, fam, tmp_path):
        checks.check_tokenizer_against_model(fam, tmp_path)

    def test_training_lowers_loss(self, case):
        checks.check_training(case)

    def test_packed_records_stay_apart(self, case, request):
        from .packing_checks import check_packed_records

        _record(request, {"packing": check_packed_records(case)})

    def test_disk_round_trip(self, case, tmp_path, request):
        _record(request, {"disk round trip": checks.check_disk_round_trip(case, tmp_path)})

    def test_tensor_and_pipeline_parallel_equivalence(self, case, tmp_path, request):
        deltas = _parallel(checks.check_parallel_equivalence(case, tmp_path))
        if case.mcore_config.get("num_moe_experts"):  # a mixture of experts: its experts split over 2 ranks too
            from .expert_parallel import check_expert_parallel_equivalence

            deltas["ep=2"] = check_expert_parallel_equivalence(case, tmp_path / "ep")
        _record(request, deltas)

    def test_greedy_generation_matches_transformers(self, case, request):
        result = checks.check_generation(case)
        _record(request, {"near-tie gap": result["max_gap"]})

    def test_lora_adapter_applies_as_peft_applies_it(self, case, request):
        _record(request, {"lora": checks.check_lora(case)})

    def test_odd_preset_mapping_and_weights_round_trip(self, odd_case, request):
        checks.check_mapping_coverage(odd_case)
        _record(request, {"round trip": checks.check_weight_round_trip(odd_case)})

    def test_odd_preset_forward_equivalence(self, odd_case, request):
        _record(request, {"forward": checks.check_forward_equivalence(odd_case)})

    def test_odd_preset_disk_round_trip(self, odd_case, tmp_path, request):
        _record(request, {"disk round trip": checks.check_disk_round_trip(odd_case, tmp_path)})

    def test_odd_preset_tensor_parallel_equivalence(self, odd_case, tmp_path, request):
        _record(request, _parallel(checks.check_parallel_equivalence(odd_case, tmp_path, layouts=((2, 1),))))
