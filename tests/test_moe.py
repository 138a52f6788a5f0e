"""Mixture-of-experts members of the families (Mixtral, Qwen2-MoE, Qwen3-MoE, GLM-4.5): the ``{expert}`` rows of
the mapping engine and its MoE-only / dense-only layer rows, every routing field's translation both ways (the
generic rules of ``layouts.moe_config_rules`` and the families'), that the conformance forward check catches a
broken router (swapped experts, top-k ignored, renormalisation flipped, routed scaling, groups or expert bias
dropped), expert parallelism (the suite's EP=2 check, ``convert --ep``, an EP run's save read back in one
process) and greedy generation token for token against transformers."""
from __future__ import annotations

import copy
import dataclasses

import pytest

from pai_zoo import ConfigTranslationError, Copy, GateUp, MappingError, WeightMap
from pai_zoo.families.registry import get_registry
from pai_zoo.tables.mapping import TO_HF, TO_MCORE, MappingContext
from pai_zoo_conformance.cli_runs import run_cli, run_cli_on_ranks


def _ctx(experts: int, layers: int = 2) -> MappingContext:
    return MappingContext(num_layers=layers, num_attention_heads=4, num_query_groups=2, head_dim=8, vocab_size=10,
                          padded_vocab_size=16, tied_embeddings=False, num_experts=experts)


EXPERT_TABLE = WeightMap(
    Copy("model.layers.{layer}.mlp.gate.weight", "decoder.layers.{layer}.mlp.router.weight"),
    GateUp("model.layers.{layer}.mlp.experts.{expert}.{gate,up}_proj.weight",
           "decoder.layers.{layer}.mlp.experts.local_experts.{expert}.linear_fc1.weight"),
)


def test_expert_placeholder_expands_every_expert_of_every_layer():
    names = EXPERT_TABLE.target_names(TO_MCORE, _ctx(3))
    fc1 = sorted(n for n in names if "linear_fc1" in n)
    assert fc1 == [f"decoder.layers.{layer}.mlp.experts.local_experts.{e}.linear_fc1.weight"
                   for layer in range(2) for e in range(3)]
    sources = EXPERT_TABLE.source_names(TO_MCORE, _ctx(3))
    assert "model.layers.1.mlp.experts.2.up_proj.weight" in sources
    assert len(sources) == 2 * (1 + 3 * 2)


def test_expert_coverage_names_a_missing_and_an_extra_expert():
    ctx = _ctx(3, layers=1)
    names = EXPERT_TABLE.source_names(TO_MCORE, ctx)
    with pytest.raises(MappingError, match=r"missing source tensors: model\.layers\.0\.mlp\.experts\.2\.gate_proj"):
        EXPERT_TABLE.check_coverage(TO_MCORE, ctx, [n for n in names if "experts.2.gate" not in n])
    with pytest.raises(MappingError, match=r"no row consumes: model\.layers\.0\.mlp\.experts\.3\.gate_proj"):
        EXPERT_TABLE.check_coverage(TO_MCORE, ctx, names + ["model.layers.0.mlp.experts.3.gate_proj.weight"])


def test_expert_rows_without_experts_are_a_table_error():
    with pytest.raises(MappingError, match="no experts"):
        EXPERT_TABLE.plan(TO_HF, _ctx(0))


def test_expert_round_trip_keeps_each_expert_apart():
    import torch

    ctx = _ctx(3, layers=1)
    hf = {n: torch.full((4, 2), float(i)) for i, n in enumerate(EXPERT_TABLE.source_names(TO_MCORE, ctx))}
    there = EXPERT_TABLE.convert(TO_MCORE, ctx, hf)
    fc1 = there["decoder.layers.0.mlp.experts.local_experts.1.linear_fc1.weight"]
    assert torch.equal(fc1[:4], hf["model.layers.0.mlp.experts.1.gate_proj.weight"])
    assert torch.equal(fc1[4:], hf["model.layers.0.mlp.experts.1.up_proj.weight"])
    back = EXPERT_TABLE.convert(TO_HF, ctx, there)
    assert back.keys() == hf.keys() and all(torch.equal(back[k], hf[k]) for k in hf)


# -- config translation ----------------------------------------------------------------------------------------
def _arch(family: str, preset: str, **changes):
    fam = get_registry().family(family)
    from pai_zoo.hf import models as hf

    return fam, fam.to_mcore_config(hf.config_dict(hf.hf_config(fam, {**fam.presets[preset], **changes})))


@pytest.mark.parametrize("family, preset, experts, topk, pre_softmax", [
    ("mixtral", "mixtral-odd", 3, 2, False),  # always renormalised
    ("qwen2-moe", "qwen2-moe-tiny", 4, 2, True),  # norm_topk_prob false: top-k of the softmax over all experts
    ("qwen2-moe", "qwen2-moe-odd", 5, 3, False),
    ("qwen3-moe", "qwen3-moe-odd", 3, 2, True),
])
def test_routing_fields_in_megatron_names(family, preset, experts, topk, pre_softmax):
    _, cfg = _arch(family, preset)
    assert cfg["num_moe_experts"] == experts and cfg["moe_router_topk"] == topk
    assert cfg["moe_router_pre_softmax"] is pre_softmax
    assert cfg["moe_grouped_gemm"] is False and cfg["moe_token_dispatcher_type"] == "alltoall"


def test_mixtral_experts_are_intermediate_size_wide():
    fam, cfg = _arch("mixtral", "mixtral-odd")
    assert cfg["moe_ffn_hidden_size"] == cfg["ffn_hidden_size"] == 100
    cfg.arch["moe_ffn_hidden_size"] = 64
    with pytest.raises(ConfigTranslationError, match="moe_ffn_hidden_size=64 != ffn_hidden_size=100"):
        fam.to_hf_config_dict(cfg)


def test_qwen2_moe_shared_expert_and_its_gate():
    _, cfg = _arch("qwen2-moe", "qwen2-moe-odd")
    assert cfg["moe_shared_expert_intermediate_size"] == 56 and cfg["moe_shared_expert_gate"] is True
    assert cfg["moe_ffn_hidden_size"] == 40 and cfg["add_qkv_bias"] is True


def test_norm_topk_prob_survives_the_round_trip_both_ways():
    for value in (True, False):
        fam, cfg = _arch("qwen3-moe", "qwen3-moe-odd", norm_topk_prob=value)
        assert cfg["moe_router_pre_softmax"] is (not value)
        assert fam.to_hf_config_dict(cfg)["norm_topk_prob"] is value


def test_qwen3_moe_reads_the_published_num_experts_key():
    # config.json files say num_experts; transformers 5's Qwen3MoeConfig calls it num_local_experts.
    preset = dict(get_registry().family("qwen3-moe").presets["qwen3-30b-a3b"])
    assert preset["num_experts"] == 128
    _, cfg = _arch("qwen3-moe", "qwen3-30b-a3b")
    assert cfg["num_moe_experts"] == 128 and cfg["moe_ffn_hidden_size"] == 768


@pytest.mark.parametrize("family, preset, changes, message", [
    ("mixtral", "mixtral-odd", {"router_jitter_noise": 0.1}, "router_jitter_noise"),
    ("qwen2-moe", "qwen2-moe-odd", {"use_sliding_window": True, "sliding_window": 4}, "sliding"),
    ("qwen3-moe", "qwen3-moe-odd", {"mlp_only_layers": [0, 1, 2]}, "no layer is a mixture of experts"),
])
def test_unsupported_routing_layouts_are_refused(family, preset, changes, message):
    with pytest.raises(ConfigTranslationError, match=message):
        _arch(family, preset, **changes)


@pytest.mark.parametrize("family, preset, changes, pattern", [
    ("qwen2-moe", "qwen2-moe-odd", {"decoder_sparse_step": 2}, [0, 1, 0]),  # layer i MoE when (i + 1) % 2 == 0
    ("qwen3-moe", "qwen3-moe-odd", {"mlp_only_layers": [1]}, [1, 0, 1]),
    ("qwen3-moe", "qwen3-moe-odd", {"decoder_sparse_step": 3, "mlp_only_layers": [0]}, [0, 0, 1]),
    ("qwen3-moe", "qwen3-moe-odd", {}, 1),
])
def test_dense_layers_among_moe_layers_become_moe_layer_freq_and_come_back(family, preset, changes, pattern):
    fam, cfg = _arch(family, preset, **changes)
    assert cfg["moe_layer_freq"] == pattern
    back = fam.to_hf_config_dict(cfg)
    for key in ("decoder_sparse_step", "mlp_only_layers"):
        assert back[key] == changes.get(key, fam.presets[preset].get(key, 1 if key == "decoder_sparse_step" else []))
    cfg.arch["moe_layer_freq"] = [1, 1, 0]  # changed in megatron's names: written as dense layers
    back = fam.to_hf_config_dict(cfg)
    assert (back["decoder_sparse_step"], back["mlp_only_layers"]) == (1, [2])


def test_mixtral_has_no_dense_layers():
    fam, cfg = _arch("mixtral", "mixtral-odd")
    cfg.arch["moe_layer_freq"] = [0, 1, 1]
    with pytest.raises(ConfigTranslationError, match="every layer of this family is a mixture of experts"):
        fam.to_hf_config_dict(cfg)


# -- the generic routing rules (layouts.moe_config_rules): every field, both ways ---------------------------------
def _deepseek_like_map():
    from pai_zoo import ConfigMap, Field
    from pai_zoo.tables.layouts import FirstKDense, moe_config_rules

    return ConfigMap(
        Field("num_hidden_layers", "num_layers"),
        *moe_config_rules("n_routed_experts", aux_loss=None, score="sigmoid", score_key="scoring_func",
                          groups=("n_group", "topk_group"), scaling="routed_scaling_factor", expert_bias=True,
                          shared_count="n_shared_experts", dense_layers=FirstKDense(), router_fp32=True),
    )


def _two_way(config_map, hf: dict):
    cfg = config_map.to_mcore("x", hf)
    return cfg.arch, config_map.to_hf(cfg)


SIGMOID_GROUPED = {"n_routed_experts": 12, "num_experts_per_tok": 4, "moe_intermediate_size": 24,
                   "norm_topk_prob": True, "n_group": 3, "topk_group": 2, "routed_scaling_factor": 2.5,
                   "n_shared_experts": 2, "first_k_dense_replace": 2, "scoring_func": "sigmoid", "num_hidden_layers": 6}


def test_sigmoid_grouped_routing_in_megatron_names_and_back():
    arch, back = _two_way(_deepseek_like_map(), SIGMOID_GROUPED)
    assert back == SIGMOID_GROUPED
    expected = {"num_moe_experts": 12, "moe_router_topk": 4, "moe_ffn_hidden_size": 24,
                "moe_router_score_function": "sigmoid", "moe_router_pre_softmax": False,
                "moe_router_num_groups": 3, "moe_router_group_topk": 2, "moe_router_topk_scaling_factor": 2.5,
                "moe_router_enable_expert_bias": True, "moe_shared_expert_intermediate_size": 48,
                "moe_shared_expert_gate": False, "moe_layer_freq": [0, 0, 1, 1, 1, 1], "moe_router_dtype": "fp32",
                "moe_router_load_balancing_type": "none"}
    assert {k: arch[k] for k in expected} == expected
    import megatron.core.transformer.transformer_config as tc

    fields = set(tc.TransformerConfig.__dataclass_fields__)
    assert set(expected) <= fields  # every translated name is a TransformerConfig field


@pytest.mark.parametrize("changes, kept", [
    ({"n_group": 1, "topk_group": 1}, {}),  # one group: plain top-k, no megatron groups, 1/1 written back
    ({"n_group": None, "topk_group": None}, {}),
    ({"n_shared_experts": 0}, {}),
    ({"first_k_dense_replace": 0}, {"moe_layer_freq": 1}),
])
def test_degenerate_routing_values_come_back_as_given(changes, kept):
    arch, back = _two_way(_deepseek_like_map(), {**SIGMOID_GROUPED, **changes})
    assert back == {**SIGMOID_GROUPED, **changes}
    assert "moe_router_num_groups" not in arch or changes.get("n_group", 3) not in (None, 1)
    assert all(arch[k] == v for k, v in kept.items())


@pytest.mark.parametrize("changes, message", [
    ({"norm_topk_prob": False}, "megatron-core always renormalises the top-k sigmoid scores"),
    ({"topk_group": 1}, r"scores a group by its top 2 experts, megatron-core by its top .* = 4"),
    ({"n_group": 5}, "need a group count dividing them"),
    ({"first_k_dense_replace": 6}, "no layer is a mixture of experts"),
    ({"scoring_func": "softmax"}, "expert bias needs sigmoid scores"),
])
def test_routing_values_megatron_cannot_compute_are_refused(changes, message):
    with pytest.raises(ConfigTranslationError, match=message):
        _two_way(_deepseek_like_map(), {**SIGMOID_GROUPED, **changes})


@pytest.mark.parametrize("arch_change, message", [
    ({"moe_layer_freq": [1, 0, 1, 1, 1, 1]}, "dense layers are the first first_k_dense_replace layers only"),
    ({"moe_shared_expert_intermediate_size": 30}, "not a whole number of experts"),
    ({"moe_shared_expert_gate": True}, "shared experts have no gate"),
    ({"moe_router_pre_softmax": True}, "no Hugging Face form"),
])
def test_megatron_values_without_a_hugging_face_form_are_refused(arch_change, message):
    config_map = _deepseek_like_map()
    cfg = config_map.to_mcore("x", SIGMOID_GROUPED)
    cfg.arch.update(arch_change)
    with pytest.raises(ConfigTranslationError, match=message):
        config_map.to_hf(cfg)


# -- the conformance forward check catches a broken router -----------------------------------------------------
@pytest.fixture(scope="module")
def odd_cases():
    from pai_zoo_conformance import checks

    return {name: checks.build_case(get_registry().family(name), get_registry().family(name).odd)
            for name in ("mixtral", "qwen2-moe")}


def _rebuilt(case, **arch):
    """``case`` with a megatron-core model built from a changed arch, holding the same weights."""
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.models.state_dicts import hf_model_to_mcore

    config = dataclasses.replace(case.mcore_config, arch={**case.mcore_config.arch, **arch})
    model = build_gpt_model(case.family, config).eval()
    hf_model_to_mcore(case.family, config, case.hf_model, model)
    return dataclasses.replace(case, mcore_config=config, mcore_model=model)


@pytest.mark.parametrize("name", ["mixtral", "qwen2-moe"])
def test_forward_check_passes_then_fails_on_swapped_experts(odd_cases, name):
    import torch

    from pai_zoo_conformance import checks
    from pai_zoo_conformance.checks import ConformanceFailure

    case = odd_cases[name]
    assert checks.check_forward_equivalence(case) < 1e-4
    broken = _rebuilt(case)
    experts = broken.mcore_model.decoder.layers[1].mlp.experts.local_experts
    with torch.no_grad():
        first = copy.deepcopy(experts[0].linear_fc1.weight.data)
        experts[0].linear_fc1.weight.data.copy_(experts[1].linear_fc1.weight.data)
        experts[1].linear_fc1.weight.data.copy_(first)
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(broken)


@pytest.mark.parametrize("name, arch", [
    ("mixtral", {"moe_router_topk": 3}),  # top-k ignored: every expert
    ("mixtral", {"moe_router_pre_softmax": True}),  # renormalisation dropped
    ("qwen2-moe", {"moe_router_pre_softmax": True}),  # qwen2-moe-odd renormalises (norm_topk_prob true)
])
def test_forward_check_fails_on_a_wrong_router(odd_cases, name, arch):
    from pai_zoo_conformance import checks
    from pai_zoo_conformance.checks import ConformanceFailure

    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(_rebuilt(odd_cases[name], **arch))


@pytest.fixture(scope="module")
def glm_case():
    """GLM-4.5's tiny preset (sigmoid scores, 2 groups, scaling 2.5); the suite draws the score-correction bias
    (a buffer, zero at init) as it draws the parameters."""
    from pai_zoo_conformance import checks

    return checks.build_case(get_registry().family("glm4-moe"), "glm4-moe-tiny")


def test_glm4_moe_expert_bias_reaches_megatron(glm_case):
    import torch

    from pai_zoo_conformance import checks

    bias = glm_case.mcore_model.decoder.layers[1].mlp.router.expert_bias
    assert bias.abs().min().item() > 0.0 and len(set(bias.tolist())) == bias.numel()  # drawn, all distinct
    assert torch.equal(bias, glm_case.hf_model.model.layers[1].mlp.gate.e_score_correction_bias)
    assert checks.check_forward_equivalence(glm_case) < 1e-4


@pytest.mark.parametrize("arch", [
    {"moe_router_topk_scaling_factor": None},  # routed scaling dropped
    {"moe_router_num_groups": None, "moe_router_group_topk": None},  # grouped routing ignored
    {"moe_router_topk": 4, "moe_router_num_groups": None, "moe_router_group_topk": None},  # top-k ignored
    {"bias": 0.0},  # the score-correction bias ignored
])
def test_forward_check_fails_on_a_wrong_sigmoid_router(glm_case, arch):
    import torch

    from pai_zoo_conformance import checks
    from pai_zoo_conformance.checks import ConformanceFailure

    broken = _rebuilt(glm_case, **{k: v for k, v in arch.items() if k != "bias"})
    if "bias" in arch:
        with torch.no_grad():
            for layer in broken.mcore_model.decoder.layers:
                if hasattr(layer.mlp, "router"):
                    layer.mlp.router.expert_bias.fill_(arch["bias"])
    with pytest.raises(ConformanceFailure, match=r"\[forward\]"):
        checks.check_forward_equivalence(broken)


# -- expert parallelism: a converted checkpoint loaded with EP=2 -------------------------------------------------
def _ep_logits(folder, swap: bool = False, checkpoint: str = "mcore", save: str | None = None):
    from pai_zoo_conformance.expert_parallel import expert_parallel_logits

    return expert_parallel_logits(folder / checkpoint, folder / "ids.pt", 2, swap=swap,
                                  save=folder / save if save else None)


def test_the_suites_expert_parallel_check_passes_and_sees_a_wrong_expert_layout(tmp_path):
    """The suite's EP=2 check (every MoE family runs it in its parallel check) on mixtral-tiny: the 2-process
    logits equal the one-process load's; with two experts swapped on one rank the same comparison is far off."""
    import torch

    import pai_zoo
    from pai_zoo_conformance import checks
    from pai_zoo_conformance.expert_parallel import check_expert_parallel_equivalence

    case = checks.build_case(get_registry().family("mixtral"), "mixtral-tiny")
    assert check_expert_parallel_equivalence(case, tmp_path) <= 1e-5
    vocab = case.mcore_config["vocab_size"]
    reference = pai_zoo.load(tmp_path / "mcore", backend="mcore").logits(torch.load(tmp_path / "ids.pt"))
    assert (_ep_logits(tmp_path, swap=True)[..., :vocab] - reference).abs().max().item() > 1e-4


def _hf_tensors(folder):
    from safetensors.torch import load_file

    out = {}
    for file in sorted(folder.glob("*.safetensors")):
        out.update(load_file(file))
    return out


def test_convert_ep_2_and_an_expert_parallel_save_read_back_in_one_process(tmp_path):
    """GLM-4.5's tiny preset (a dense layer, score-correction bias, shared expert): ``convert --ep 2`` records the
    layout (args, pai_zoo.json) and 2 EP processes load it with the one-process logits; what those 2 processes
    save (each rank its own experts) is read back in one process by ``pai_zoo.load`` (same logits) and by
    ``convert --to hf`` (every tensor bit-identical to the original folder's)."""
    import json

    import torch

    import pai_zoo
    from pai_zoo.conversion.entry import convert
    from pai_zoo.formats import mcore_dist
    from pai_zoo_conformance import checks

    case = checks.build_case(get_registry().family("glm4-moe"), "glm4-moe-tiny")  # the bias drawn, non-zero
    case.hf_model.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "mcore", "mcore", ep=2)
    record = json.loads((tmp_path / "mcore" / mcore_dist.PAI_ZOO_CONFIG).read_text())
    assert (record["expert_parallel"], record["expert_tensor_parallel"]) == (2, 1)
    vocab = case.mcore_config["vocab_size"]
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(5))
    torch.save(ids, tmp_path / "ids.pt")
    reference = pai_zoo.load(tmp_path / "mcore", backend="mcore").logits(ids)
    with torch.no_grad():
        hf_logits = case.hf_model(input_ids=ids).logits
    assert (reference - hf_logits).abs().max().item() < 1e-4
    got = _ep_logits(tmp_path, save="ep-saved")[..., :vocab]
    assert (got - reference).abs().max().item() <= 1e-5
    files = {f.name.split("_")[2] for f in (tmp_path / "ep-saved" / mcore_dist.RELEASE).glob("__*_*.distcp")}
    assert files == {"0", "1"}  # both ranks wrote their part
    again = pai_zoo.load(tmp_path / "ep-saved", backend="mcore").logits(ids)
    assert (again - reference).abs().max().item() <= 1e-5
    as_hf = pai_zoo.load(tmp_path / "ep-saved", backend="hf")  # transformers' fused experts, from per-expert names
    assert type(as_hf.model).__name__ == "Glm4MoeForCausalLM"
    assert (as_hf.logits(ids) - hf_logits).abs().max().item() < 1e-5
    convert(tmp_path / "ep-saved", tmp_path / "back", "hf")
    original, back = _hf_tensors(tmp_path / "hf"), _hf_tensors(tmp_path / "back")
    assert back.keys() == original.keys()
    assert all(torch.equal(back[k], original[k]) for k in original)


def test_a_megatron_checkpoint_loads_as_transformers_moe_model(tmp_path):
    """``pai_zoo.load(mcore_checkpoint, backend="hf")`` of Qwen2-MoE (odd shapes, gated shared expert): the
    transformers model holds its experts fused in memory; it gets every one of the checkpoint's experts (same
    logits as the original model, which fail when two experts are swapped in the checkpoint)."""
    import torch

    import pai_zoo
    from pai_zoo.conversion.entry import convert
    from pai_zoo_conformance import checks

    case = checks.build_case(get_registry().family("qwen2-moe"), "qwen2-moe-odd")
    case.hf_model.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "mcore", "mcore")
    ids = torch.randint(0, case.mcore_config["vocab_size"], (2, 11), generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        want = case.hf_model(input_ids=ids).logits
    handle = pai_zoo.load(tmp_path / "mcore", backend="hf")
    assert handle.backend == "hf" and (handle.logits(ids) - want).abs().max().item() < 1e-5
    experts = case.hf_model.model.layers[1].mlp.experts
    with torch.no_grad():
        experts.gate_up_proj[[0, 1]] = experts.gate_up_proj[[1, 0]].clone()
        swapped = case.hf_model(input_ids=ids).logits
    assert (handle.logits(ids) - swapped).abs().max().item() > 1e-3


@pytest.mark.parametrize("preset, changes, message", [
    ("glm4-moe-tiny", {"ep": 3}, r"--ep 3 does not divide the 4 routed experts; valid --ep: 1, 2, 4"),
    ("glm4-moe-tiny", {"ep": 2, "etp": 5}, r"--etp 5 does not divide the experts' FFN width 48"),
    ("glm4-tiny", {"ep": 2}, "has no experts"),
])
def test_convert_refuses_an_expert_layout_the_model_cannot_have(tmp_path, preset, changes, message):
    from pai_zoo import PaiZooError
    from pai_zoo.conversion.entry import convert
    from pai_zoo_conformance import checks

    family = "glm4-moe" if "moe" in preset else "glm"
    checks.build_case(get_registry().family(family), preset).hf_model.save_pretrained(tmp_path / "hf")
    with pytest.raises(PaiZooError, match=message):
        convert(tmp_path / "hf", tmp_path / "mcore", "mcore", **changes)
    assert not (tmp_path / "mcore").exists()


def test_dense_layers_among_moe_layers_forward_equals_transformers():
    """Qwen3-MoE with layer 1 dense (mlp_only_layers): megatron's dense MLP there, experts elsewhere, the
    transformers logits; the dense layer's MLP rows are the plain ``mlp.{gate,up,down}_proj``."""
    from pai_zoo_conformance import checks

    case = checks.build_case(get_registry().family("qwen3-moe"), "qwen3-moe-odd", mlp_only_layers=[1])
    layers = case.mcore_model.decoder.layers
    assert not hasattr(layers[1].mlp, "router") and hasattr(layers[0].mlp, "router")
    assert checks.check_forward_equivalence(case) < 1e-4


# -- generation: greedy decoding equals transformers token for token ---------------------------------------------
@pytest.mark.parametrize("name", ["mixtral", "qwen2-moe", "qwen3-moe", "glm4-moe"])
def test_greedy_generation_equals_transformers_token_for_token(name):
    """pai-zoo's KV-cached loop on the megatron-core MoE model (a left-padded batch of different lengths, EOS off)
    and transformers' ``generate`` on the same weights give the same tokens, every row, no near-tie allowance."""
    import torch

    from pai_zoo.generation import Finisher, SamplingParams, hf_generate, mcore_generate
    from pai_zoo_conformance import checks

    fam = get_registry().family(name)
    case = checks.build_case(fam, fam.tiny)
    vocab = case.mcore_config["vocab_size"]
    gen = torch.Generator().manual_seed(11)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in (6, 1, 9)]
    params = SamplingParams(max_new_tokens=12)
    ours, theirs = [Finisher(params, (), None) for _ in prompts], [Finisher(params, (), None) for _ in prompts]
    mcore_generate(case.mcore_model, prompts, params, ours, vocab_size=vocab)
    hf_generate(case.hf_model, prompts, params, theirs)
    assert [len(f.tokens) for f in ours] == [12, 12, 12]
    assert [f.tokens for f in ours] == [f.tokens for f in theirs]
    assert len({tuple(f.tokens) for f in ours}) == 3  # the rows differ: the comparison sees each prompt


# -- training with expert parallelism ----------------------------------------------------------------------------
def test_training_with_expert_parallel_2_repeats_the_one_process_losses(tmp_path):
    """``pai-zoo train --expert-model-parallel-size 2`` (the 2 gloo worker ranks, each holding half the experts,
    data parallel 2 for the rest) from a Hugging Face folder: the same loss curve as one process, within 1e-4."""
    import json

    import pai_zoo
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess

    toy.write_tokenizer(tmp_path / "hf", vocab_size=300)
    pai_zoo.load("mixtral-tiny", backend="hf", seed=3).model.save_pretrained(tmp_path / "hf")
    corpus = toy.write_corpus(tmp_path / "corpus.jsonl", documents=60)
    preprocess([corpus], tmp_path / "toy", str(tmp_path / "hf"), append_eod=True, progress=False)

    def train(save, *extra, nproc=1):
        """In this process, or on the session's 2 worker ranks (``nproc=2``), as under torchrun."""
        argv = ["train", "--model", str(tmp_path / "hf"), "--data", str(tmp_path / "toy_text_document"),
                "--save", str(save), "--global-batch-size", "4", "--batch-size", "1", "--seq-length", "32",
                "--train-iters", "6", "--warmup-iters", "1", "--lr", "3e-3", "--min-lr", "3e-4",
                "--save-interval", "6", "--no-progress", *extra]
        proc = run_cli_on_ranks(argv, timeout=600) if nproc == 2 else run_cli(argv)
        assert proc.returncode == 0, proc.stderr[-4000:]
        return [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()]

    one = train(tmp_path / "one")
    ep2 = train(tmp_path / "ep2", "--expert-model-parallel-size", "2", nproc=2)
    assert len(one) == len(ep2) == 6 and one[-1] < one[0]  # it trained
    assert max(abs(a - b) for a, b in zip(one, ep2)) <= 1e-4


def test_glm4_moe_mtp_tensors_the_config_does_not_count_are_refused_by_name(tmp_path):
    """A GLM-4.5 checkpoint holding a multi-token-prediction layer (model.layers.{num_hidden_layers}.*) that its
    config does not count (num_nextn_predict_layers 0) is refused naming its tensors, not converted without them."""
    import torch
    from safetensors.torch import load_file, save_file

    from pai_zoo import MappingError
    from pai_zoo.conversion.entry import convert
    from pai_zoo_conformance import checks

    case = checks.build_case(get_registry().family("glm4-moe"), "glm4-moe-tiny")
    case.hf_model.save_pretrained(tmp_path / "hf")
    (file,) = (tmp_path / "hf").glob("*.safetensors")
    tensors = load_file(file)
    tensors["model.layers.2.eh_proj.weight"] = torch.zeros(64, 128)
    tensors["model.layers.2.enorm.weight"] = torch.ones(64)
    save_file(tensors, file, metadata={"format": "pt"})
    with pytest.raises(MappingError, match=r"model\.layers\.2\.eh_proj\.weight, model\.layers\.2\.enorm\.weight: "
                                           r"multi-token-prediction .* set num_nextn_predict_layers"):
        convert(tmp_path / "hf", tmp_path / "mcore", "mcore")
    assert not (tmp_path / "mcore").exists()
