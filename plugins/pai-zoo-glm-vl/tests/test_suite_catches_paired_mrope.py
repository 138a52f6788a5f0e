"""The conformance suite fails on GLM-4.1V without :mod:`pai_zoo.mcore.mrope_pairs`: with each frequency's angle
laid out as halves (megatron-core's M-RoPE layout) instead of on interleaved pairs, the forward check fails."""
import pytest
import torch

from pai_zoo.families.registry import get_registry
from pai_zoo.mcore import mrope_pairs
from pai_zoo_conformance import ConformanceFailure, checks


def _halves(inv_freq, position_ids, mrope_section):
    paired = _paired(inv_freq, position_ids, mrope_section)
    one = paired[..., 0::2]  # each frequency once
    return torch.cat([one, one], dim=-1)


_paired = mrope_pairs.paired_mrope_angles
pytestmark = pytest.mark.megatron_once(first=True)  # the angles are pai-zoo's: one megatron-core pass tells


def test_paired_mrope_angles_repeat_each_sections_frequency_twice():
    inv = torch.tensor([1.0, 0.5, 0.25, 0.125])
    pos = torch.stack([torch.full((1, 2), 3), torch.full((1, 2), 5), torch.full((1, 2), 7)])  # t, h, w
    angles = _paired(inv, pos, [1, 2, 1])[0, 0, 0]
    assert angles.tolist() == [3.0, 3.0, 2.5, 2.5, 1.25, 1.25, 0.875, 0.875]


def test_forward_check_fails_with_megatron_cores_half_layout(monkeypatch):
    case = checks.shared_case(get_registry().family("glm4v"))  # the suite's case: the angles are made per forward
    monkeypatch.setattr(mrope_pairs, "paired_mrope_angles", _halves)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)
