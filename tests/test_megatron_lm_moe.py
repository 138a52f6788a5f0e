"""Megatron-LM checkpoints of a mixture of experts (issue 19): Mixtral, Qwen2-MoE and Qwen3-MoE models written by
the reference generator (tests/megatron_lm_writer.py, proved against megatron-core's own modules in
test_megatron_lm_writer.py) in the layouts Megatron-LM saves them: tensor and expert parallel rank folders, the
experts as SequentialMLP (local spec), TEGroupedMLP (Transformer Engine's grouped GEMM) or the legacy GroupedMLP,
and torch_dist (dense layers among the MoE layers included).
Each reads back with the args alone picking the family, every tensor bit-identical to the HF model's checkpoint
tensors, and loads with its logits; bad folders get one line naming the file.
"""
from __future__ import annotations

from pathlib import Path

import pytest
import torch

import pai_zoo
from pai_zoo.cli import main
from pai_zoo.models.megatron_checkpoint import open_megatron
from pai_zoo.models.state_dicts import hf_state_dict

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

import megatron_lm_writer as mlw  # noqa: E402 - registered by conftest.py

LOGITS_ATOL = 1e-4


def _randomised(model, seed: int):
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * (0.2 if "norm" not in name else 0.1)
                    + (1.0 if "norm" in name else 0.0))
    return model.eval()


def _models():
    """Odd shapes: 6 heads / 2 KV (GQA 3), head_dim 12 != 48 / 6, vocabularies not a multiple of 128."""
    from transformers import (
        MixtralConfig,
        MixtralForCausalLM,
        Qwen2MoeConfig,
        Qwen2MoeForCausalLM,
        Qwen3MoeConfig,
        Qwen3MoeForCausalLM,
    )

    shape = dict(hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=12, num_hidden_layers=4,
                 max_position_embeddings=64, rms_norm_eps=1e-6, tie_word_embeddings=False)
    return {
        "qwen2-moe": (Qwen2MoeForCausalLM, Qwen2MoeConfig(
            **shape, vocab_size=997, intermediate_size=72, moe_intermediate_size=40, num_experts=4,
            num_experts_per_tok=2, shared_expert_intermediate_size=56, norm_topk_prob=False, mlp_only_layers=[1],
            decoder_sparse_step=1, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
        "mixtral": (MixtralForCausalLM, MixtralConfig(
            **shape, vocab_size=1001, intermediate_size=40, num_local_experts=4, num_experts_per_tok=2,
            sliding_window=None, rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
        "qwen3-moe": (Qwen3MoeForCausalLM, Qwen3MoeConfig(
            **shape, vocab_size=997, intermediate_size=72, moe_intermediate_size=40, num_experts=4,
            num_experts_per_tok=2, norm_topk_prob=True, mlp_only_layers=[], decoder_sparse_step=1,
            rope_parameters={"rope_type": "default", "rope_theta": 1e6})),
    }


@pytest.fixture(scope="module")
def moe_models(tmp_path_factory):
    out = {}
    for i, (name, (cls, config)) in enumerate(_models().items()):
        torch.manual_seed(i)
        model = _randomised(cls(config), i)
        folder = tmp_path_factory.mktemp(name) / "hf"
        model.save_pretrained(folder)
        out[name] = (model, config, folder)
    return out


def _write(model, config, dst: Path, kind: str = "legacy", **options) -> None:
    write = mlw.write_legacy if kind == "legacy" else mlw.write_torch_dist
    overrides = {"layernorm_epsilon": config.rms_norm_eps, "rotary_base": 1000000, **options.pop("args_overrides", {})}
    write(model, config, dst, args_overrides=overrides, **options)


def _checkpoint_tensors(model) -> dict:
    """The HF model's tensors under its checkpoint names (per expert), as save_pretrained writes them."""
    return hf_state_dict(model, pai_zoo.registry.get_registry().family_for_hf_config(model.config.to_dict())
                         .to_mcore_config(model.config.to_dict()))


LAYOUTS = {
    "tp2": dict(tp=2),
    "ep2": dict(ep=2),
    "tp2-ep2-te-grouped": dict(tp=2, ep=2, experts="te_grouped"),
    "ep2-grouped": dict(ep=2, experts="grouped"),
    "tp2-grouped-pp2": dict(tp=2, pp=2, experts="grouped"),
    "dist-tp2": dict(kind="dist", tp=2),
}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", ["qwen2-moe", "mixtral", "qwen3-moe"])
def test_moe_layouts_read_bit_identical_and_the_args_pick_the_family(name, layout, moe_models, tmp_path):
    model, config, _ = moe_models[name]
    _write(model, config, tmp_path / "ckpt", **LAYOUTS[layout])
    want = _checkpoint_tensors(model)
    with open_megatron(tmp_path / "ckpt") as checkpoint:  # the args alone
        assert checkpoint.family.name == name
        assert checkpoint.config["num_moe_experts"] == 4 and checkpoint.config.kv_channels == 12
        got = dict(checkpoint.hf_tensors(expected=want.keys()))
    assert got.keys() == want.keys()
    wrong = [k for k in want if not torch.equal(got[k], want[k])]
    assert not wrong, wrong


@pytest.mark.parametrize("name, options", [("qwen2-moe", dict(tp=2, ep=2, experts="te_grouped")),
                                           ("mixtral", dict(ep=2, experts="grouped")),
                                           ("qwen3-moe", dict(kind="dist", tp=2))])
def test_moe_checkpoint_loads_with_the_hf_logits(name, options, moe_models, tmp_path):
    model, config, _ = moe_models[name]
    _write(model, config, tmp_path / "ckpt", **options)
    ids = torch.tensor([[3, 17, 250, 299, 5, 42, 7, 1, 990]])
    with torch.no_grad():
        expected = model(ids).logits
    handle = pai_zoo.load(tmp_path / "ckpt")
    assert handle.family.name == name
    assert (handle.logits(ids) - expected).abs().max().item() < LOGITS_ATOL
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--to", "hf"]) == 0
    back = pai_zoo.load(tmp_path / "out", backend="hf")
    assert (back.logits(ids) - expected).abs().max().item() < 1e-5


def test_swapped_experts_in_one_expert_rank_are_seen(moe_models, tmp_path):
    """The reader puts expert rank 1's local expert 0 at global expert 2: writing rank 1's two experts swapped
    changes exactly those tensors."""
    model, config, _ = moe_models["mixtral"]
    _write(model, config, tmp_path / "ckpt", ep=2)
    file = tmp_path / "ckpt" / "iter_0000001" / "mp_rank_00_001" / "model_optim_rng.pt"
    state = torch.load(file, weights_only=False)
    key = "decoder.layers.0.mlp.experts.local_experts.{}.linear_fc2.weight"
    sd = state["model"]
    sd[key.format(0)], sd[key.format(1)] = sd[key.format(1)], sd[key.format(0)]
    torch.save(state, file)
    want = _checkpoint_tensors(model)
    with open_megatron(tmp_path / "ckpt") as checkpoint:
        got = dict(checkpoint.hf_tensors(expected=want.keys()))
    wrong = sorted(k for k in want if not torch.equal(got[k], want[k]))
    assert wrong == [f"model.layers.0.block_sparse_moe.experts.{e}.w2.weight" for e in (2, 3)]


BAD = {
    "missing-expert-rank": (dict(ep=2), lambda c: (c / "iter_0000001" / "mp_rank_00_001" / "model_optim_rng.pt")
                            .unlink(), "mp_rank_00_001/model_optim_rng.pt: missing"),
    "own-expert-tp": (dict(tp=2, args_overrides={"expert_tensor_parallel_size": 1}), None,
                      "expert_tensor_parallel_size=1 differs from tensor_model_parallel_size=2"),
    "experts-not-divisible": (dict(args_overrides={"expert_model_parallel_size": 3}), None, "not divisible by"),
}


@pytest.mark.parametrize("case", list(BAD))
def test_bad_moe_checkpoints_fail_with_one_line_naming_the_file(case, moe_models, tmp_path, capsys):
    model, config, _ = moe_models["qwen2-moe"]
    options, damage, message = BAD[case]
    _write(model, config, tmp_path / "ckpt", **dict(options))
    if damage:
        damage(tmp_path / "ckpt")
    code = main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--to", "hf"])
    err = capsys.readouterr().err
    assert code == 1, err
    assert message in err and "Traceback" not in err
    assert len([line for line in err.splitlines() if line.startswith("pai-zoo: error:")]) == 1
    assert not (tmp_path / "out").exists()


def test_inspect_shows_the_expert_layout_and_routing(moe_models, tmp_path, capsys):
    model, config, _ = moe_models["qwen2-moe"]
    _write(model, config, tmp_path / "ckpt", tp=2, ep=2, experts="te_grouped")
    assert main(["inspect", str(tmp_path / "ckpt")]) == 0
    out = capsys.readouterr().out
    assert "tensor parallel 2, pipeline parallel 1, expert parallel 2" in out and "family:       qwen2-moe" in out
    rows = dict(line.split(None, 1) for line in out.splitlines() if line.startswith("  moe_") or "num_moe" in line)
    assert rows["num_moe_experts"] == "4" and rows["moe_router_topk"] == "2"
    assert rows["moe_router_pre_softmax"] == "True"  # norm_topk_prob False
    assert rows["moe_shared_expert_intermediate_size"] == "56" and rows["moe_layer_freq"] == "[1, 0, 1, 1]"


def test_torch_dist_with_transformer_engine_moe_norm_keys_reads(moe_models, tmp_path):
    """A TE layer spec saves a MoE layer's pre-MLP norm as ``pre_mlp_layernorm.weight``; megatron-core's local spec
    (pai-zoo's layout) calls it ``mlp.linear_fc1.layer_norm_weight``. Both read the same tensors."""
    model, config, _ = moe_models["qwen3-moe"]
    _write(model, config, tmp_path / "ckpt", kind="dist", tp=2)
    assert mlw.rename_dist_keys(tmp_path / "ckpt", "mlp.linear_fc1.layer_norm_", "pre_mlp_layernorm.") == 1
    want = _checkpoint_tensors(model)
    with open_megatron(tmp_path / "ckpt") as checkpoint:
        got = dict(checkpoint.hf_tensors(expected=want.keys()))
    assert all(torch.equal(got[k], want[k]) for k in want)
    mlw.rename_dist_keys(tmp_path / "ckpt", "pre_mlp_layernorm.", "post_mlp_layernorm.")  # no such layer
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--to", "hf"]) == 1
