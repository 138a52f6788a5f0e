"""Megatron-LM checkpoints of DeepSeek-V2/V3 (``--multi-latent-attention`` with experts), from the reference writer
(tests/megatron_lm_mla_writer.py, proved against megatron-core's own modules in test_megatron_lm_mla_writer.py):
the args alone pick the family through pai-zoo-deepseek's ``megatron_lm_rules``, every tensor reads back
bit-identical to the HF model's checkpoint tensors in TP, EP, PP and Transformer Engine layouts, and the model
loads with the HF logits (odd shapes: 6 heads, v_head_dim 10 != qk_nope 12, rope 6, vocab 997)."""
from __future__ import annotations

import pytest
import torch

import pai_zoo
from pai_zoo.cli import main
from pai_zoo.families.registry import get_registry
from pai_zoo.models.megatron_checkpoint import open_megatron
from pai_zoo.models.state_dicts import hf_state_dict

pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")

import megatron_lm_mla_writer as mw  # noqa: E402 - registered by conftest.py


def _model(kind: str):
    """V3: no q LoRA, YaRN (factor 8, megatron-core's own original 4096 and betas), sigmoid grouped routing with
    expert bias; V2: q LoRA, plain RoPE, softmax routing. Norms and the expert bias drawn away from 1 / 0."""
    import transformers

    common = dict(vocab_size=997, hidden_size=48, intermediate_size=64, moe_intermediate_size=16, num_hidden_layers=2,
                  num_attention_heads=6, num_key_value_heads=6, kv_lora_rank=20, qk_nope_head_dim=12,
                  qk_rope_head_dim=6, v_head_dim=10, first_k_dense_replace=1, n_routed_experts=6,
                  num_experts_per_tok=4, max_position_embeddings=32768, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if kind == "deepseek-v3":
        rope = dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, original_max_position_embeddings=4096,
                    mscale=1.0, mscale_all_dim=0.5, beta_fast=32, beta_slow=1)
        config = transformers.DeepseekV3Config(**common, q_lora_rank=None, n_group=3, topk_group=2,
                                               n_shared_experts=1, routed_scaling_factor=1.7, rope_parameters=rope,
                                               num_nextn_predict_layers=0)
        cls = transformers.DeepseekV3ForCausalLM
    else:
        config = transformers.DeepseekV2Config(**common, q_lora_rank=24, n_group=1, topk_group=1,
                                               topk_method="greedy", n_shared_experts=2, routed_scaling_factor=1.3,
                                               rope_parameters=dict(rope_type="default", rope_theta=5000.0))
        cls = transformers.DeepseekV2ForCausalLM
    torch.manual_seed(3)
    model = cls(config).eval()
    gen = torch.Generator().manual_seed(4)
    with torch.no_grad():
        for name, p in model.named_parameters():
            p.copy_(torch.randn(p.shape, generator=gen) * 0.2 + (1.0 if "norm" in name else 0.0))
        for layer in model.model.layers[1:]:
            bias = getattr(layer.mlp.gate, "e_score_correction_bias", None)
            if bias is not None:
                bias.copy_(torch.randn(bias.shape, generator=gen))
    return model, config


@pytest.fixture(scope="module")
def deepseek():
    return {kind: _model(kind) for kind in ("deepseek-v3", "deepseek-v2")}


def _checkpoint_tensors(name, model) -> dict:
    family = get_registry().family(name)
    return hf_state_dict(model, family.to_mcore_config(model.config.to_dict()))


LAYOUTS = {"tp2": dict(tp=2), "ep2": dict(ep=2), "tp2-ep2-te": dict(tp=2, ep=2, te_names=True),
           "pp2": dict(pp=2)}


@pytest.mark.parametrize("layout", list(LAYOUTS))
@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2"])
def test_mla_layouts_read_bit_identical_and_the_args_pick_deepseek(name, layout, deepseek, tmp_path):
    model, config = deepseek[name]
    mw.write_legacy_mla(model, config, tmp_path / "ckpt", **LAYOUTS[layout])
    want = _checkpoint_tensors(name, model)
    with open_megatron(tmp_path / "ckpt") as checkpoint:
        assert checkpoint.family.name == name
        assert checkpoint.config["family.v_head_dim"] == 10 and checkpoint.config["family.qk_head_dim"] == 12
        got = dict(checkpoint.hf_tensors(expected=want.keys()))
    assert got.keys() == want.keys()
    wrong = [k for k in want if not torch.equal(got[k], want[k])]
    assert not wrong, wrong


@pytest.mark.parametrize("name", ["deepseek-v3", "deepseek-v2"])
def test_mla_checkpoint_loads_with_the_hf_logits_and_converts(name, deepseek, tmp_path):
    model, config = deepseek[name]
    mw.write_legacy_mla(model, config, tmp_path / "ckpt", tp=2, ep=2, te_names=True)
    ids = torch.tensor([[5, 996, 17, 300, 42, 7, 811, 12, 64]])
    with torch.no_grad():
        expected = model(ids).logits
    handle = pai_zoo.load(tmp_path / "ckpt")
    assert handle.family.name == name
    assert (handle.logits(ids) - expected).abs().max().item() < 1e-4
    assert main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--to", "hf"]) == 0
    back = pai_zoo.load(tmp_path / "out", backend="hf")
    assert (back.logits(ids) - expected).abs().max().item() < 1e-5


def test_interleaved_rotation_is_refused_with_one_line(deepseek, tmp_path, capsys):
    model, config = deepseek["deepseek-v3"]
    mw.write_legacy_mla(model, config, tmp_path / "ckpt", args_overrides={"rotary_interleaved": True})
    code = main(["convert", str(tmp_path / "ckpt"), str(tmp_path / "out"), "--to", "hf"])
    err = capsys.readouterr().err
    assert code == 1 and "rotary_interleaved=True" in err and "Traceback" not in err
    assert not (tmp_path / "out").exists()


def test_torch_dist_with_transformer_engine_mla_norm_keys_reads_from_its_args(deepseek, tmp_path):
    """pai-zoo's own DeepSeek-V2 torch_dist checkpoint read as Megatron-LM's would be (no pai_zoo.json: the family
    and config come from its args, through the family's MLA rules), with the low-rank norms under the names a
    Transformer Engine layer spec saves them (``linear_q_up_proj.layer_norm_weight`` ...)."""
    import megatron_lm_writer as mlw

    from pai_zoo.conversion.entry import convert
    from pai_zoo.formats.mcore_dist import PAI_ZOO_CONFIG

    model, _ = deepseek["deepseek-v2"]
    model.save_pretrained(tmp_path / "hf")
    convert(tmp_path / "hf", tmp_path / "ckpt", "mcore", tp=2)
    (tmp_path / "ckpt" / PAI_ZOO_CONFIG).unlink()
    renamed = sum(mlw.rename_dist_keys(tmp_path / "ckpt", local, te) for local, te in (
        ("self_attention.q_layernorm.", "self_attention.linear_q_up_proj.layer_norm_"),
        ("self_attention.kv_layernorm.", "self_attention.linear_kv_up_proj.layer_norm_")))
    assert renamed == 2 * 2  # two norms in each of the two layers (the first dense)
    want = _checkpoint_tensors("deepseek-v2", model)
    with open_megatron(tmp_path / "ckpt", reference=tmp_path / "hf") as checkpoint:
        assert checkpoint.family.name == "deepseek-v2"
        got = dict(checkpoint.hf_tensors(expected=want.keys()))
    assert got.keys() == want.keys() and all(torch.equal(got[k], want[k]) for k in want)
