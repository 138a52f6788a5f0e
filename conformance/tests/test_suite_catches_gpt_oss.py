"""The conformance checks catch gpt-oss's mechanisms switched off: the attention sinks dropped, the SwiGLU clamp
removed, an MXFP4 scale read one exponent off."""
import dataclasses

import pytest

from pai_zoo import ConfigMap, Dropped, Fixed, WeightMap
from pai_zoo.families.registry import get_registry
from pai_zoo.formats.encodings import mxfp4
from pai_zoo_conformance import ConformanceFailure, checks

pytest.importorskip("pai_zoo_gpt_oss")
import pai_zoo_gpt_oss  # noqa: E402
from pai_zoo_gpt_oss.mxfp4_folder import check_mxfp4_folder, write_mxfp4_folder  # noqa: E402

GPT_OSS = get_registry().family("gpt-oss")


def _variant(name: str, rules=None, table=None):
    """gpt-oss with its config rules mapped by ``rules`` and its table's rows by ``table``."""
    config_map = GPT_OSS.config_map
    if rules is not None:
        config_map = ConfigMap(*map(rules, config_map.rules), passthrough=tuple(config_map.passthrough))
    weight_map = GPT_OSS.weight_map
    if table is not None:
        weight_map = lambda config: WeightMap(*map(table, pai_zoo_gpt_oss.weights(config).rows))  # noqa: E731
    return dataclasses.replace(GPT_OSS, name=name, config_map=config_map, weight_map=weight_map)


def test_sinks_dropped_fail_forward_equivalence():
    """megatron-core's plain softmax (softmax_type vanilla) and the sinks dropped on the way in."""
    def vanilla(rule):
        if isinstance(rule, Fixed) and rule.mcore.get("softmax_type") == "learnable":
            return dataclasses.replace(rule, mcore={**rule.mcore, "softmax_type": "vanilla"})
        return rule

    def drop_sinks(row):
        return Dropped(row.hf[0]) if row.hf and row.hf[0].endswith("self_attn.sinks") else row

    family = _variant("gpt-oss-no-sinks", vanilla, drop_sinks)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(family))


def test_clamp_removed_fails_forward_equivalence():
    """The experts' SwiGLU without its clamp (activation_func_clamp_value None) on the odd preset, whose
    swiglu_limit the test weights exceed."""
    class Unclamped(pai_zoo_gpt_oss.ClampedSwiglu):
        def to_mcore(self, hf, arch):
            super().to_mcore(hf, arch)
            arch["family.dropped_clamp"] = arch.pop("activation_func_clamp_value")

        def to_hf(self, arch, hf):  # transformers' model keeps its clamp
            super().to_hf({**arch, "activation_func_clamp_value": arch["family.dropped_clamp"]}, hf)

    family = _variant("gpt-oss-unclamped", lambda r: Unclamped() if isinstance(r, pai_zoo_gpt_oss.ClampedSwiglu)
                      else r)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(family, GPT_OSS.odd))


def test_the_real_mxfp4_decoding_passes_and_an_exponent_off_by_one_fails(tmp_path, monkeypatch):
    folder = write_mxfp4_folder(tmp_path / "mxfp4")
    check_mxfp4_folder(folder, logits=False)
    monkeypatch.setattr(mxfp4, "SCALE_BIAS", mxfp4.SCALE_BIAS + 1)  # every scale read one exponent low
    with pytest.raises(ConformanceFailure, match=r"\[mxfp4\].*differs from transformers'"):
        check_mxfp4_folder(folder, logits=False)
