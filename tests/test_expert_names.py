"""One weight table for both of megatron-core's expert layouts (issue 19): ``SequentialMLP``'s
``experts.local_experts.{e}.linear_fc1.weight`` and ``TEGroupedMLP``'s ``experts.linear_fc1.weight{e}``
(``pai_zoo.expert_names``). TEGroupedMLP needs Transformer Engine, so the in-memory test presents a CPU model's
tensors under TEGroupedMLP's names, as its ``state_dict`` has them."""
from __future__ import annotations

import pytest
import torch

from pai_zoo.families.registry import get_registry
from pai_zoo.tables.expert_names import grouped_name, sequential_name

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

L = "decoder.layers.3.mlp.experts."
PAIRS = [
    (L + "local_experts.12.linear_fc1.weight", L + "linear_fc1.weight12"),
    (L + "local_experts.0.linear_fc2.weight", L + "linear_fc2.weight0"),
    (L + "local_experts.7.linear_fc2.bias", L + "linear_fc2.bias7"),
]
UNCHANGED = ["decoder.layers.3.mlp.shared_experts.linear_fc1.weight", "decoder.layers.3.mlp.linear_fc1.weight",
             "decoder.layers.3.mlp.router.weight", "decoder.layers.3.mlp.experts.linear_fc1._extra_state",
             "decoder.layers.3.mlp.router.expert_bias", "embedding.word_embeddings.weight"]


@pytest.mark.parametrize("sequential, grouped", PAIRS)
def test_each_name_has_the_other_form(sequential, grouped):
    assert grouped_name(sequential) == grouped and sequential_name(grouped) == sequential
    assert sequential_name(sequential) == sequential and grouped_name(grouped) == grouped


@pytest.mark.parametrize("name", UNCHANGED)
def test_other_names_are_left_alone(name):
    assert grouped_name(name) == name and sequential_name(name) == name


class _GroupedView(torch.nn.Module):
    """A megatron-core model whose ``state_dict`` names its experts as TEGroupedMLP does."""

    def __init__(self, model):
        super().__init__()
        self.inner = model
        self.decoder = model.decoder

    def state_dict(self, *args, **kwargs):
        return {grouped_name(k): v for k, v in self.inner.state_dict(*args, **kwargs).items()}


@pytest.mark.megatron
def test_a_model_with_grouped_expert_names_loads_and_exports_with_the_same_table():
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.models.state_dicts import hf_model_to_mcore, hf_state_dict, mcore_tensors, mcore_to_hf
    from pai_zoo_conformance import checks

    case = checks.build_case(get_registry().family("mixtral"), "mixtral-odd")
    fresh = build_gpt_model(case.family, case.mcore_config).eval()
    view = _GroupedView(fresh)
    assert any("experts.linear_fc1.weight0" in k for k in view.state_dict())
    hf_model_to_mcore(case.family, case.mcore_config, case.hf_model, view)
    want = mcore_tensors(case.mcore_model)
    got = fresh.state_dict()
    assert all(torch.equal(got[k], v) for k, v in want.items())
    exported = mcore_to_hf(case.family, case.mcore_config, mcore_tensors(view))
    original = hf_state_dict(case.hf_model, case.mcore_config)
    assert exported.keys() == original.keys() and all(torch.equal(exported[k], original[k]) for k in original)
