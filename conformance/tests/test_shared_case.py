"""A case built from a preset and a seed is built once per session (checks.shared_case); a copy may be changed."""
from __future__ import annotations

import torch

from pai_zoo.families.registry import get_registry
from pai_zoo_conformance import checks


def test_one_build_per_family_preset_and_seed_and_copies_are_independent():
    family = get_registry().family("llama")
    case = checks.shared_case(family)
    assert checks.shared_case(family, family.tiny, 0) is case  # the same object: built once
    other_seed = checks.shared_case(family, seed=1)
    assert other_seed is not case
    name, weight = next(iter(case.mcore_model.state_dict().items()))
    assert not torch.equal(weight, other_seed.mcore_model.state_dict()[name])  # the seed is part of the key
    fresh = checks.build_case(family)  # and the shared case is what build_case gives
    assert all(torch.equal(v, fresh.mcore_model.state_dict()[k]) for k, v in case.mcore_model.state_dict().items()
               if not k.endswith("_extra_state"))
    copy = checks.copy_case(case)
    param = next(copy.mcore_model.parameters())
    with torch.no_grad():
        param.add_(1.0)
    assert not torch.equal(param, next(case.mcore_model.parameters()))  # the shared one did not change
    hf_param = next(copy.hf_model.parameters())
    with torch.no_grad():
        hf_param.add_(1.0)
    assert not torch.equal(hf_param, next(case.hf_model.parameters()))
    assert checks.check_forward_equivalence(checks.copy_case(case)) <= checks.LOGITS_ATOL  # a copy still agrees
