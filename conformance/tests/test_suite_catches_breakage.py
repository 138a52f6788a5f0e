"""The conformance checks can fail: deliberately broken tables and config translations are caught."""
import dataclasses

import pytest
import torch

from pai_zoo import QKV, ConfigMap, Copy, Field, GateUp, Rope, WeightMap
from pai_zoo.families.registry import get_registry
from pai_zoo.plugin.config_map import ROPE_SCALING
from pai_zoo_conformance import ConformanceFailure, checks

LLAMA = get_registry().family("llama")
BASE_ROWS = LLAMA.weight_map_for(LLAMA.to_mcore_config(checks._hf_dict(LLAMA, LLAMA.tiny))).rows


def broken_table(replace: dict | None = None, drop: str | None = None, extra=()):
    """The Llama table with rows replaced (by index), one dropped (by HF name), or rows added."""
    rows = list(BASE_ROWS)
    for index, row in (replace or {}).items():
        rows[index] = row
    if drop:
        rows = [r for r in rows if not any(drop in name for name in r.hf)]
    return dataclasses.replace(LLAMA, name="llama-broken", weight_map=WeightMap(*rows, *extra))


def index_of(kind, hf_part: str) -> int:
    return next(i for i, r in enumerate(BASE_ROWS) if isinstance(r, kind) and hf_part in r.hf[0])


L, M = "model.layers.{layer}.", "decoder.layers.{layer}."


def test_the_real_table_passes():
    checks.check_variant(LLAMA)


def test_swapped_key_and_value_heads_fail_forward_equivalence():
    family = broken_table(
        {index_of(QKV, "q_proj"): QKV(L + "self_attn.{q,v,k}_proj.weight", M + "self_attention.linear_qkv.weight")}
    )
    case = checks.build_case(family)
    checks.check_weight_round_trip(case)  # a swap is its own inverse: only the forward pass can tell
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(case)


def test_swapped_gate_and_up_fail_forward_equivalence():
    family = broken_table(
        {index_of(GateUp, "gate_proj"): GateUp(L + "mlp.{up,gate}_proj.weight", M + "mlp.linear_fc1.weight")}
    )
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(family))


def test_swapped_norms_fail_forward_equivalence():
    i, j = index_of(Copy, "input_layernorm"), index_of(Copy, "post_attention_layernorm")
    family = broken_table({
        i: Copy(L + "input_layernorm.weight", M + "pre_mlp_layernorm.weight"),
        j: Copy(L + "post_attention_layernorm.weight", M + "input_layernorm.weight"),
    })
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(family))


def test_missing_row_fails_mapping_coverage():
    family = broken_table(drop="post_attention_layernorm")
    case = checks.build_case(LLAMA)
    case.family = family
    with pytest.raises(ConformanceFailure, match=r"(?s)\[mapping\].*post_attention_layernorm") as err:
        checks.check_mapping_coverage(case)
    assert "pre_mlp_layernorm" in str(err.value)
    with pytest.raises(ConformanceFailure, match=r"(?s)\[mapping\].*loading.*pre_mlp_layernorm"):
        checks.build_case(family)  # loading through the broken table fails the same way


class LossyCopy(Copy):
    """Rounds through bfloat16 on the way back: not bit-identical."""

    def to_hf(self, tensors, ctx):
        return [t.to(torch.bfloat16).to(t.dtype) for t in tensors]


def test_lossy_row_fails_weight_round_trip():
    family = broken_table(
        {index_of(Copy, "o_proj"): LossyCopy(L + "self_attn.o_proj.weight", M + "self_attention.linear_proj.weight")}
    )
    case = checks.build_case(family)
    with pytest.raises(ConformanceFailure, match=r"\[weights\].*o_proj"):
        checks.check_weight_round_trip(case)


def broken_config(drop: str | None = None, replace: dict | None = None):
    def key(rule):
        return rule.hf if isinstance(getattr(rule, "hf", None), str) else type(rule).__name__

    rules = [replace.get(key(r), r) if replace else r for r in LLAMA.config_map.rules if key(r) != drop]
    return dataclasses.replace(
        LLAMA, name="llama-broken", config_map=ConfigMap(*rules, passthrough=tuple(LLAMA.config_map.passthrough))
    )


def test_untranslated_field_fails_config_check():
    family = broken_config(drop="rms_norm_eps")
    with pytest.raises(ConformanceFailure, match=r"\[config\].*not translated.*rms_norm_eps"):
        checks.check_config_round_trip(family, family.tiny)


class RopeWithoutScaling(Rope):
    """Forgets llama3 RoPE scaling (the parameters pai_zoo.mcore.rope computes the frequencies from)."""

    def to_mcore(self, hf, arch):
        super().to_mcore(hf, arch)
        assert arch.pop(ROPE_SCALING)["rope_type"] == "llama3"  # the tiny preset has llama3 scaling to forget


def test_lossy_rope_translation_fails_config_and_forward_checks():
    family = broken_config(replace={"Rope": RopeWithoutScaling()})
    with pytest.raises(ConformanceFailure, match=r"\[config\].*rope_parameters"):
        checks.check_config_round_trip(family, family.tiny)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):  # the llama3 scaling is lost
        checks.check_forward_equivalence(checks.build_case(family))


def test_wrong_norm_epsilon_field_fails_forward_equivalence():
    family = broken_config(
        replace={
            "rms_norm_eps": Field(
                "rms_norm_eps", "layernorm_epsilon", encode=lambda e: e * 1e5, decode=lambda e: e / 1e5
            )
        }
    )
    checks.check_config_round_trip(family, family.tiny)  # lossless, yet wrong: only the forward pass can tell
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(checks.build_case(family))


def test_tokenizer_check_fails_without_a_test_tokenizer(tmp_path):
    family = dataclasses.replace(LLAMA, name="llama-broken", test_tokenizer=None)
    with pytest.raises(ConformanceFailure, match=r"\[tokenizer\].*no test tokenizer"):
        checks.check_tokenizer(family, tmp_path)


def test_training_check_fails_when_nothing_learns():
    with pytest.raises(ConformanceFailure, match=r"\[training\] loss did not fall"):
        checks.check_training(checks.build_case(LLAMA), lr=0.0)


def test_lora_rows_placed_per_head_instead_of_per_query_group_fail_the_lora_check(monkeypatch):
    """The LoRA check sees B's rows placed by a wrong rule: q, k and v adapters' rows laid out as one [q; k; v] block
    (ChatGLM's layout) where megatron-core interleaves them per query group."""
    from pai_zoo import FusedQKV
    from pai_zoo.lora import targets

    case = checks.shared_case(LLAMA)
    checks.check_lora(case)
    real = targets.fused_positions

    def wrong(target, ctx, fused_rows):
        if target.megatron_name != "linear_qkv":
            return real(target, ctx, fused_rows)
        index = torch.arange(fused_rows, dtype=torch.float64).unsqueeze(1)
        (flat,) = FusedQKV("x.weight", "y.weight").to_mcore([index], ctx)  # a [q; k; v] block read as fused
        return [p.reshape(-1).long() for p in flat.split(
            [ctx.num_attention_heads * ctx.head_dim, ctx.num_query_groups * ctx.head_dim,
             ctx.num_query_groups * ctx.head_dim])]

    monkeypatch.setattr(targets, "fused_positions", wrong)
    import pai_zoo.lora.adapters as mcore_lora

    monkeypatch.setattr(mcore_lora, "fused_positions", wrong)
    with pytest.raises(ConformanceFailure, match=r"\[lora\]"):
        checks.check_lora(case)
