"""tests/megatron_lm_mla_writer.py writes what megatron-core builds for DeepSeek-V2/V3 with multi-latent attention:
the TP1 local-spec checkpoint loads strictly (every key, in order, every shape and dtype) into megatron-core's own
GPTModel, configured from the written args the way Megatron-LM's core_transformer_config_from_args does, and gives
the HF model's logits; the TP2 / EP2 / PP2 and Transformer Engine forms merge back (an independent merge here) to the
TP1 tensors bit for bit."""

from __future__ import annotations

import dataclasses
import importlib.util
from pathlib import Path

import megatron_lm_mla_writer as mw
import megatron_lm_writer as mlw  # noqa: E402 - registered by conftest.py
import pytest
import torch

from pai_zoo.formats.safe_pickle import allowing

VOCAB = 997
IDS = torch.tensor([[5, 996, 17, 300, 42, 7, 811, 12, 64], [1, 2, 3, 500, 600, 700, 800, 900, 3]])


def _config(kind: str, **extra):
    import transformers

    common = dict(vocab_size=VOCAB, hidden_size=48, intermediate_size=64, moe_intermediate_size=16,
                  num_hidden_layers=2, num_attention_heads=6, kv_lora_rank=20, qk_nope_head_dim=12,
                  qk_rope_head_dim=6, v_head_dim=10, first_k_dense_replace=1, n_routed_experts=6,
                  num_experts_per_tok=4, max_position_embeddings=256, rms_norm_eps=1e-6, tie_word_embeddings=False)
    if kind == "v3":
        rope = dict(rope_type="yarn", rope_theta=10000.0, factor=8.0, original_max_position_embeddings=32,
                    mscale=1.0, mscale_all_dim=0.5, beta_fast=32.0, beta_slow=1.0)
        v3 = dict(q_lora_rank=None, n_group=3, topk_group=2, n_shared_experts=1, routed_scaling_factor=1.7,
                  rope_parameters=rope, num_mtp_layers=0)
        return transformers.DeepseekV3Config(**common, **(v3 | extra))
    assert kind == "v2"
    return transformers.DeepseekV2Config(**common, q_lora_rank=24, n_group=1, topk_method="greedy",
                                         n_shared_experts=2, routed_scaling_factor=1.3,
                                         rope_parameters=dict(rope_type="default", rope_theta=5000.0), **extra)


_MODELS: dict = {}


def _model(kind: str, **extra):
    """A tiny random HF DeepSeek model (built once per kind), norms and the V3 expert bias away from 1 / 0."""
    key = (kind, tuple(sorted(extra.items())))
    if key not in _MODELS:
        import transformers

        torch.manual_seed(3)
        config = _config(kind, **extra)
        model = mlw.randomise_weights(transformers.AutoModelForCausalLM.from_config(config))
        _MODELS[key] = (model, config)
    return _MODELS[key]


def _load(path: Path) -> dict:
    """torch.load as Megatron-LM loads checkpoints: weights_only with megatron-core's SAFE_GLOBALS."""
    from megatron.core.safe_globals import SAFE_GLOBALS

    with allowing(SAFE_GLOBALS):
        return torch.load(path, map_location="cpu", weights_only=True)


# --------------------------------------------------------------------------------------------------------------
# args


def test_args_in_megatron_lm_names():
    import megatron.core.transformer.transformer_config as tc

    _, v3 = _model("v3")
    _, v2 = _model("v2")
    a3, a2 = mw.mla_args(v3, tp=2, ep=3), mw.mla_args(v2)
    common = dict(multi_latent_attention=True, kv_lora_rank=20, qk_head_dim=12, qk_pos_emb_head_dim=6,
                  v_head_dim=10, kv_channels=18, qk_layernorm=True, num_query_groups=6, group_query_attention=False,
                  rotary_interleaved=False, position_embedding_type="rope", num_experts=6, moe_router_topk=4,
                  moe_ffn_hidden_size=16, ffn_hidden_size=64, moe_layer_freq=[0, 1], moe_shared_expert_gate=False,
                  moe_router_dtype="fp32", moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0,
                  moe_grouped_gemm=False, moe_token_dispatcher_type="alltoall", swiglu=True, normalization="RMSNorm",
                  add_bias_linear=False, add_qkv_bias=False, layernorm_epsilon=1e-6,
                  untie_embeddings_and_output_weights=True, num_layers=2, hidden_size=48, num_attention_heads=6,
                  vocab_size=997)
    want3 = dict(common, q_lora_rank=None, rope_type="yarn", rotary_base=10000, rotary_scaling_factor=8.0, mscale=1.0,
                 mscale_all_dim=0.5, original_max_position_embeddings=32, beta_fast=32.0, beta_slow=1.0,
                 moe_shared_expert_intermediate_size=16, moe_router_score_function="sigmoid",
                 moe_router_pre_softmax=False, moe_router_enable_expert_bias=True,
                 moe_router_topk_scaling_factor=1.7, moe_router_num_groups=3, moe_router_group_topk=2,
                 tensor_model_parallel_size=2, expert_model_parallel_size=3, expert_tensor_parallel_size=2,
                 padded_vocab_size=1024)
    want2 = dict(common, q_lora_rank=24, rope_type="rope", rotary_base=5000, rotary_scaling_factor=1.0, mscale=1.0,
                 mscale_all_dim=0.0, moe_shared_expert_intermediate_size=32, moe_router_score_function="softmax",
                 moe_router_pre_softmax=True, moe_router_enable_expert_bias=False,
                 moe_router_topk_scaling_factor=1.3, moe_router_num_groups=None, moe_router_group_topk=None,
                 tensor_model_parallel_size=1, expert_tensor_parallel_size=1, padded_vocab_size=1024)
    for args, want in ((a3, want3), (a2, want2)):
        got = {k: getattr(args, k, "<missing>") for k in want}
        assert got == want
        assert type(args.rotary_base) is int  # --rotary-base is an int flag
    assert not hasattr(a2, "original_max_position_embeddings")  # no YaRN for V2
    stock = mw.mla_args(v3, yarn_config_fields=False)
    assert not {"original_max_position_embeddings", "beta_fast", "beta_slow"} & set(vars(stock))
    assert mw.mla_args(v3, te_names=True).transformer_impl == "transformer_engine"
    assert a3.transformer_impl == "local"
    # every MLA / MoE field is a megatron-core config field that core_transformer_config_from_args copies by name
    fields = set(tc.MLATransformerConfig.__dataclass_fields__)
    by_name = [k for k in want3 if k.startswith(("moe_", "q_", "kv_", "qk_", "v_head", "rope", "rotary", "mscale",
                                                  "original_max", "beta_", "multi_latent", "expert_tensor"))]
    assert by_name and not set(by_name) - fields
    # the aux-loss coefficient of a config that has DeepSeek's aux_loss_alpha
    a = mw.mla_args(v2.to_dict() | {"aux_loss_alpha": 0.003})
    assert (a.moe_router_load_balancing_type, a.moe_aux_loss_coeff) == ("seq_aux_loss", 0.003)
    # the k == 0 layer pattern, and V2 group-limited routing only where Megatron's group score is V2's
    assert mw.mla_args(v2.to_dict() | {"first_k_dense_replace": 0}).moe_layer_freq == 1
    grouped = v2.to_dict() | {"topk_method": "group_limited_greedy", "n_group": 3, "topk_group": 2}
    with pytest.raises(ValueError, match="group_limited_greedy"):
        mw.mla_args(grouped)
    a = mw.mla_args(grouped | {"topk_group": 3, "num_experts_per_tok": 3})
    assert (a.moe_router_num_groups, a.moe_router_group_topk) == (3, 3)


def test_args_fields_in_megatron_lm_parser():
    """Megatron-LM's own argument parser (megatron.training, where installed) defines every MLA/MoE field written,
    except the YaRN config fields it has no flag for."""
    arguments = pytest.importorskip("megatron.training.arguments")
    import argparse

    parser = arguments.add_megatron_arguments(argparse.ArgumentParser(allow_abbrev=False))
    dests = {a.dest for a in parser._actions}
    _, v3 = _model("v3")
    base = set(vars(mw.megatron_args(v3.to_dict() | {"model_type": "llama"})))
    extra = set(vars(mw.mla_args(v3))) - base
    assert extra - dests == {"original_max_position_embeddings", "beta_fast", "beta_slow"}
    assert {"multi_latent_attention", "q_lora_rank", "qk_pos_emb_head_dim", "moe_router_enable_expert_bias"} <= dests


# --------------------------------------------------------------------------------------------------------------
# against megatron-core's GPTModel


class _CpuCoreAttention(torch.nn.Module):
    """Causal softmax attention with MLA's own q/k and v widths: megatron-core's local DotProductAttention takes
    no k_channels/v_channels, so the local MLA spec cannot build it (0.16 and 0.19); no parameters, no state."""

    def __init__(self, config=None, layer_number=None, attn_mask_type=None, attention_type=None,
                 softmax_scale=None, k_channels=None, v_channels=None, **kwargs):
        super().__init__()
        self.softmax_scale = softmax_scale

    def forward(self, query, key, value, attention_mask, attn_mask_type=None, attention_bias=None,
                packed_seq_params=None):
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))  # [b, n, s, d]
        s = q.shape[2]
        causal = torch.ones(s, s, dtype=torch.bool).tril()
        w = (q @ k.transpose(-1, -2) * self.softmax_scale).masked_fill(~causal, float("-inf")).softmax(-1)
        out = (w @ v).permute(2, 0, 1, 3)
        return out.reshape(out.shape[0], out.shape[1], -1)


def _megatron_model(args, monkeypatch):
    """megatron-core's GPTModel, local spec, from the written args: MLATransformerConfig takes every args field of
    its name (as Megatron-LM's core_transformer_config_from_args does), num_moe_experts = num_experts, SwiGLU."""
    import pai_zoo.mcore.compat  # noqa: F401 - MoE on the CPU needs its patches before megatron-core's MoE
    from pai_zoo.mcore.compat import ensure_model_parallel

    ensure_model_parallel()
    import megatron.core.transformer.multi_latent_attention as mla
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer import MLATransformerConfig

    if mla.TELinear is not None and not isinstance(mla.TELinear, type):
        # megatron-core 0.16 without Transformer Engine binds TELinear to a MagicMock, which isinstance refuses
        monkeypatch.setattr(mla, "TELinear", type("NoTELinear", (), {}))
    kw = {f.name: getattr(args, f.name) for f in dataclasses.fields(MLATransformerConfig) if hasattr(args, f.name)}
    kw.update(num_moe_experts=args.num_experts, num_query_groups=None, gated_linear_unit=args.swiglu,
              activation_func=torch.nn.functional.silu, pipeline_dtype=args.params_dtype)
    # CPU, eval: no fusions, no dropout, no balance loss
    kw.update(use_cpu_initialization=True, perform_initialization=False, masked_softmax_fusion=False,
              bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False,
              persist_layer_norm=False, gradient_accumulation_fusion=False, hidden_dropout=0.0, attention_dropout=0.0,
              moe_router_load_balancing_type="none", moe_aux_loss_coeff=0.0, tensor_model_parallel_size=1,
              expert_tensor_parallel_size=1, expert_model_parallel_size=1, pipeline_model_parallel_size=1)
    config = MLATransformerConfig(**kw)
    spec = get_gpt_decoder_block_spec(config, use_transformer_engine=False, normalization=args.normalization)
    for layer_spec in spec.layer_specs:
        layer_spec.submodules.self_attention.submodules.core_attention = _CpuCoreAttention
    return GPTModel(config, spec, vocab_size=args.padded_vocab_size,
                    max_sequence_length=args.max_position_embeddings, position_embedding_type="rope",
                    rotary_base=args.rotary_base,
                    share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights).eval()


def _logits_close(megatron, hf_model) -> None:
    s = IDS.shape[1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).expand(IDS.shape[0], 1, s, s)
    with torch.no_grad():
        got = megatron(IDS, torch.arange(s).expand(IDS.shape[0], s), mask)[..., :VOCAB]
        want = hf_model(IDS).logits
    assert want.abs().max() > 0.5  # the model is not trivial
    torch.testing.assert_close(got, want, atol=2e-4, rtol=2e-4)


def _skip_without_q_lora_on_resolver() -> None:
    """megatron-core >= 0.19 resolves MLA's q/kv norms (QKNormConfigResolver): with qk_layernorm and no q_lora_rank
    the local spec's standalone q_layernorm is refused and there is no local fused norm+linear for linear_q_proj,
    so such a model (DeepSeek-V3 here, V2-Lite) has no local-spec build there; 0.16 builds it."""
    if importlib.util.find_spec("megatron.core.transformer.mla_qk_norm_config") is not None:
        pytest.skip("megatron-core >= 0.19: no local-spec MLA build with qk_layernorm and q_lora_rank None")


@pytest.mark.parametrize("kind", ["v3", "v2"])
def test_tp1_loads_strictly_into_megatron_core_and_gives_the_hf_logits(tmp_path, monkeypatch, kind):
    torch.set_num_threads(1)
    if kind == "v3":
        _skip_without_q_lora_on_resolver()
    model, config = _model(kind)
    it_dir = mw.write_legacy_mla(model, config, tmp_path)
    assert (tmp_path / "latest_checkpointed_iteration.txt").read_text() == "1"
    assert sorted(p.name for p in it_dir.iterdir()) == ["mp_rank_00"]
    ckpt = _load(it_dir / "mp_rank_00" / "model_optim_rng.pt")
    assert (ckpt["checkpoint_version"], ckpt["iteration"]) == (3.0, 1)
    ours, args = ckpt["model"], ckpt["args"]
    megatron = _megatron_model(args, monkeypatch)
    theirs = megatron.state_dict()
    assert list(ours) == list(theirs)  # every key, in megatron's order
    for k, v in theirs.items():
        if isinstance(v, torch.Tensor):
            assert (ours[k].shape, ours[k].dtype) == (v.shape, v.dtype), k
        else:
            assert ours[k] is None and v is None, k
    megatron.load_state_dict(ours, strict=True)
    _logits_close(megatron, model)

    # the tensors are the HF ones, copied as they are (independently of the writer's tables)
    from transformers.core_model_loading import revert_weight_conversion

    hf = revert_weight_conversion(model, model.state_dict())
    a, layer = "model.layers.1.self_attn.", "decoder.layers.1."
    pairs = {"self_attention.linear_kv_down_proj.weight": "kv_a_proj_with_mqa.weight",
             "self_attention.linear_kv_up_proj.weight": "kv_b_proj.weight",
             "self_attention.kv_layernorm.weight": "kv_a_layernorm.weight",
             "self_attention.linear_proj.weight": "o_proj.weight"}
    if kind == "v3":
        pairs["self_attention.linear_q_proj.weight"] = "q_proj.weight"
        assert torch.equal(ours[layer + "mlp.router.expert_bias"],
                           hf["model.layers.1.mlp.gate.e_score_correction_bias"])
    else:
        pairs.update({"self_attention.linear_q_down_proj.weight": "q_a_proj.weight",
                      "self_attention.linear_q_up_proj.weight": "q_b_proj.weight",
                      "self_attention.q_layernorm.weight": "q_a_layernorm.weight"})
        assert layer + "mlp.router.expert_bias" not in ours
    for mine, theirs_name in pairs.items():
        assert torch.equal(ours[layer + mine], hf[a + theirs_name]), mine
    e5 = "model.layers.1.mlp.experts.5."
    assert torch.equal(ours[layer + "mlp.experts.local_experts.5.linear_fc1.weight"],
                       torch.cat([hf[e5 + "gate_proj.weight"], hf[e5 + "up_proj.weight"]]))
    assert torch.equal(ours[layer + "mlp.router.weight"], hf["model.layers.1.mlp.gate.weight"])


def test_rope_interleave_false_gets_megatron_pairs(tmp_path, monkeypatch):
    """DeepSeek-V3 with rotate-half rope (rope_interleave False): the rope rows are reordered so that Megatron's
    de-interleaving rope gives the HF logits."""
    torch.set_num_threads(1)
    model, config = _model("v3", rope_interleave=False, q_lora_rank=24)
    it_dir = mw.write_legacy_mla(model, config, tmp_path)
    ckpt = _load(it_dir / "mp_rank_00" / "model_optim_rng.pt")
    megatron = _megatron_model(ckpt["args"], monkeypatch)
    megatron.load_state_dict(ckpt["model"], strict=True)
    _logits_close(megatron, model)
    # and copied as is, the logits differ: the reordering is needed
    as_is = dict(ckpt["model"])
    for i in range(2):
        p = f"decoder.layers.{i}.self_attention."
        as_is[p + "linear_kv_down_proj.weight"] = model.model.layers[i].self_attn.kv_a_proj_with_mqa.weight.detach()
        as_is[p + "linear_q_up_proj.weight"] = model.model.layers[i].self_attn.q_b_proj.weight.detach()
    megatron.load_state_dict(as_is, strict=True)
    with pytest.raises(AssertionError):
        _logits_close(megatron, model)
    # stock Megatron-LM args (no YaRN original_max_position_embeddings / beta fields): megatron-core then uses its
    # defaults (4096, 32, 1), and this model's YaRN (original 32) is not what it computes
    stock = mw.write_legacy_mla(model, config, tmp_path / "stock", yarn_config_fields=False)
    ckpt = _load(stock / "mp_rank_00" / "model_optim_rng.pt")
    megatron = _megatron_model(ckpt["args"], monkeypatch)
    assert megatron.config.original_max_position_embeddings == mw.MLA_YARN_DEFAULTS["original_max_position_embeddings"]
    megatron.load_state_dict(ckpt["model"], strict=True)
    with pytest.raises(AssertionError):
        _logits_close(megatron, model)


# --------------------------------------------------------------------------------------------------------------
# parallel forms, merged back independently

REPLICATED = ("layernorm.weight", "layer_norm_weight", "router.weight", "router.expert_bias")
ROWS = ("word_embeddings.weight", "output_layer.weight", "linear_q_proj.weight", "linear_q_up_proj.weight",
        "linear_kv_up_proj.weight")
DOWN = ("linear_q_down_proj.weight", "linear_kv_down_proj.weight")
COLS = ("linear_proj.weight", "linear_fc2.weight")


def _merge_tp(shards: list[dict], te: bool) -> dict:
    out = {}
    for k, v in shards[0].items():
        vs = [s[k] for s in shards]
        if v is None:
            assert all(x is None for x in vs), k
            out[k] = None
        elif k.endswith(REPLICATED) or (te and k.endswith(DOWN)):  # every rank holds the whole tensor
            assert all(torch.equal(x, v) for x in vs), k
            out[k] = v
        elif k.endswith(ROWS + DOWN):
            out[k] = torch.cat(vs, dim=0)
        elif k.endswith(COLS):
            out[k] = torch.cat(vs, dim=1)
        elif k.endswith("linear_fc1.weight"):  # each rank: [its gate rows ; its up rows]
            halves = [x.chunk(2, dim=0) for x in vs]
            out[k] = torch.cat([h[0] for h in halves] + [h[1] for h in halves], dim=0)
        else:
            raise AssertionError(f"no merge rule for {k}")
    return out


def _merge(it_dir: Path, tp: int, pp: int, ep: int, num_layers: int, num_experts: int, te: bool) -> dict:
    import re

    merged: dict = {}
    per_stage, per_rank = num_layers // pp, num_experts // ep
    for p in range(pp):
        for e in range(ep):
            folders = [f"mp_rank_{t:02d}" + (f"_{p:03d}" if pp > 1 else "") + (f"_{e:03d}" if ep > 1 else "")
                       for t in range(tp)]
            ckpts = [_load(it_dir / f / "model_optim_rng.pt") for f in folders]
            assert all(c["args"].tensor_model_parallel_size == tp for c in ckpts)
            stage = _merge_tp([c["model"] for c in ckpts], te)
            for k, v in stage.items():
                m = re.match(r"decoder\.layers\.(\d+)\.(.*)$", k)
                if m:
                    rest = m.group(2)
                    x = re.match(r"mlp\.experts\.local_experts\.(\d+)\.(.*)$", rest)
                    if x:
                        rest = f"mlp.experts.local_experts.{e * per_rank + int(x.group(1))}.{x.group(2)}"
                    k = f"decoder.layers.{p * per_stage + int(m.group(1))}.{rest}"
                if k in merged:  # a non-expert tensor: every EP rank holds the same copy
                    same = v is None and merged[k] is None or torch.equal(merged[k], v)
                    assert same, k
                merged[k] = v
    return merged


def _assert_identical(a: dict, b: dict) -> None:
    assert sorted(a) == sorted(b)
    for k in a:
        if a[k] is None:
            assert b[k] is None, k
        else:
            assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


@pytest.mark.parametrize("kind", ["v3", "v2"])
def test_parallel_forms_merge_back_bit_identical(tmp_path, kind):
    torch.set_num_threads(1)
    model, config = _model(kind)
    tp1 = _load(mw.write_legacy_mla(model, config, tmp_path / "tp1") / "mp_rank_00" / "model_optim_rng.pt")["model"]
    for tp, pp, ep in ((2, 1, 1), (1, 1, 2), (1, 2, 1), (2, 2, 3)):
        it_dir = mw.write_legacy_mla(model, config, tmp_path / f"{tp}{pp}{ep}", tp=tp, pp=pp, ep=ep)
        names = sorted(p.name for p in it_dir.iterdir())
        assert len(names) == tp * pp * ep, names
        merged = _merge(it_dir, tp, pp, ep, 2, 6, te=False)
        if tp == 2:  # the local spec's down projections are column-parallel: half the rows each
            shard = _load(it_dir / names[0] / "model_optim_rng.pt")["model"]
            key = next(k for k in shard if k.endswith("linear_kv_down_proj.weight"))
            assert shard[key].shape == (13, 48)
        _assert_identical(merged, tp1)
    if kind == "v2":
        with pytest.raises(ValueError, match="not divisible"):  # 24 q_lora rows split 5 ways
            mw.write_legacy_mla(model, config, tmp_path / "bad", tp=5)


def test_te_names(tmp_path):
    """Transformer Engine names (megatron-core's TE spec for MLA with qk_layernorm): the q/kv norms fused into the
    up projections, input_layernorm separate, a dense layer's pre-MLP norm fused into fc1, a MoE layer's kept;
    the down projections duplicated (whole) on every TP rank."""
    torch.set_num_threads(1)
    model, config = _model("v2")
    it_dir = mw.write_legacy_mla(model, config, tmp_path / "te", tp=2, te_names=True)
    shards = [_load(it_dir / f"mp_rank_{t:02d}" / "model_optim_rng.pt") for t in range(2)]
    assert shards[0]["args"].transformer_impl == "transformer_engine"
    sd = shards[0]["model"]
    sa = "decoder.layers.{}.self_attention."
    attention = ["input_layernorm.weight"] + [sa[len("decoder.layers.{}."):] + n for n in (
        "core_attention._extra_state", "linear_proj.weight", "linear_proj._extra_state",
        "linear_q_down_proj.weight", "linear_q_down_proj._extra_state", "linear_q_up_proj.layer_norm_weight",
        "linear_q_up_proj.weight", "linear_q_up_proj._extra_state", "linear_kv_down_proj.weight",
        "linear_kv_down_proj._extra_state", "linear_kv_up_proj.layer_norm_weight", "linear_kv_up_proj.weight",
        "linear_kv_up_proj._extra_state")]
    dense = ["mlp.linear_fc1.layer_norm_weight", "mlp.linear_fc1.weight", "mlp.linear_fc1._extra_state",
             "mlp.linear_fc2.weight", "mlp.linear_fc2._extra_state"]
    experts = [f"mlp.experts.local_experts.{j}.linear_fc{n}.{s}" for j in range(6) for n in (1, 2)
               for s in ("weight", "_extra_state")]
    moe = ["pre_mlp_layernorm.weight", "mlp.router.weight", *experts, "mlp.shared_experts.linear_fc1.weight",
           "mlp.shared_experts.linear_fc1._extra_state", "mlp.shared_experts.linear_fc2.weight",
           "mlp.shared_experts.linear_fc2._extra_state"]
    want = (["embedding.word_embeddings.weight"] + [f"decoder.layers.0.{n}" for n in attention + dense]
            + [f"decoder.layers.1.{n}" for n in attention + moe]
            + ["decoder.final_layernorm.weight", "output_layer.weight", "output_layer._extra_state"])
    assert list(sd) == want
    hf = model.model.layers[0].self_attn
    for t, shard in enumerate(shards):
        m = shard["model"]
        assert torch.equal(m["decoder.layers.0.self_attention.linear_kv_down_proj.weight"],
                           hf.kv_a_proj_with_mqa.weight)
        assert torch.equal(m["decoder.layers.0.self_attention.linear_q_down_proj.weight"], hf.q_a_proj.weight)
        assert torch.equal(m["decoder.layers.0.self_attention.linear_q_up_proj.layer_norm_weight"],
                           hf.q_a_layernorm.weight)
        assert torch.equal(m["decoder.layers.0.self_attention.linear_kv_up_proj.layer_norm_weight"],
                           hf.kv_a_layernorm.weight)
        assert torch.equal(m["decoder.layers.0.mlp.linear_fc1.layer_norm_weight"],
                           model.model.layers[0].post_attention_layernorm.weight)
        assert torch.equal(m["decoder.layers.0.self_attention.linear_q_up_proj.weight"],
                           hf.q_b_proj.weight[t * 54:(t + 1) * 54])  # 3 of 6 heads, 18 rows each
    # merged, the TE form holds the local form's tensors under the fused names
    local = _load(mw.write_legacy_mla(model, config, tmp_path / "local") / "mp_rank_00" / "model_optim_rng.pt")["model"]
    merged = _merge_tp([s["model"] for s in shards], te=True)
    renames = {"self_attention.linear_q_up_proj.layer_norm_weight": "self_attention.q_layernorm.weight",
               "self_attention.linear_kv_up_proj.layer_norm_weight": "self_attention.kv_layernorm.weight",
               "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight"}
    as_local = {}
    for k, v in merged.items():
        if k.endswith("core_attention._extra_state"):
            continue
        for te_name, local_name in renames.items():
            if k.endswith(te_name):
                k = k[: -len(te_name)] + local_name
        as_local[k] = v
    _assert_identical(as_local, local)


class _TE:
    """A stand-in for a Transformer Engine module class in megatron-core's TE spec."""


_TE_PARAMS = {  # the state-dict entries of each TE module (RMSNorm: no bias; no linear biases)
    "TENorm": ("weight",),
    "TELinear": ("weight", "_extra_state"),
    "TEColumnParallelLinear": ("weight", "_extra_state"),
    "TERowParallelLinear": ("weight", "_extra_state"),
    "TELayerNormColumnParallelLinear": ("layer_norm_weight", "weight", "_extra_state"),
    "TEDotProductAttention": ("_extra_state",),
}


def _spec_entries(obj, path=()):
    """(module path, TE stand-in class) of every TE module a layer spec names."""
    import functools

    from megatron.core.transformer.spec_utils import ModuleSpec

    if isinstance(obj, ModuleSpec):
        if isinstance(obj.module, type) and issubclass(obj.module, _TE):
            yield path, obj.module
        yield from _spec_entries(obj.submodules, path)
    elif isinstance(obj, functools.partial):
        yield from _spec_entries(obj.keywords.get("submodules"), path)
    elif dataclasses.is_dataclass(obj) and not isinstance(obj, type):
        for f in dataclasses.fields(obj):
            yield from _spec_entries(getattr(obj, f.name), (*path, f.name))
    elif isinstance(obj, type) and issubclass(obj, _TE):
        yield path, obj


def test_te_names_are_those_of_megatron_cores_te_spec(tmp_path, monkeypatch):
    """megatron-core's own get_gpt_layer_with_transformer_engine_spec (multi_latent_attention, qk_layernorm), built
    with stand-ins for the TE classes (Transformer Engine is not installed): the modules it names, with each TE
    module's entries, are the writer's TE keys of a dense and of a MoE layer (router and routed experts aside: built
    by MoELayer / SequentialMLP, tested above); the down projections are TELinear, which MLASelfAttention makes
    parallel_mode='duplicated'."""
    import megatron.core.models.gpt.gpt_layer_specs as specs
    from megatron.core.transformer.mlp import MLPSubmodules
    from megatron.core.transformer.moe.experts import SequentialMLP

    te = {name: type(name, (_TE,), {}) for name in _TE_PARAMS}

    class Provider:
        def __init__(self, *args, **kwargs):
            pass

        def linear(self):
            return te["TELinear"]

        def column_parallel_linear(self):
            return te["TEColumnParallelLinear"]

        def row_parallel_linear(self):
            return te["TERowParallelLinear"]

        def fuse_layernorm_and_linear(self):
            return True

        def column_parallel_layer_norm_linear(self):
            return te["TELayerNormColumnParallelLinear"]

        def layer_norm(self, *args, **kwargs):
            return te["TENorm"]

        def core_attention(self):
            return te["TEDotProductAttention"]

        def grouped_mlp_modules(self, *args, **kwargs):
            return SequentialMLP, MLPSubmodules(linear_fc1=te["TEColumnParallelLinear"],
                                                linear_fc2=te["TERowParallelLinear"])

        def activation_func(self):
            return None

    monkeypatch.setattr(specs, "TESpecProvider", Provider, raising=False)
    model, config = _model("v2")  # with a q LoRA: MLASelfAttention builds linear_q_down/up_proj, not linear_q_proj
    sd = _load(mw.write_legacy_mla(model, config, tmp_path, te_names=True) / "mp_rank_00" / "model_optim_rng.pt")
    for i, num_experts in ((0, None), (1, 6)):
        spec = specs.get_gpt_layer_with_transformer_engine_spec(
            num_experts=num_experts, moe_grouped_gemm=False, qk_layernorm=True, multi_latent_attention=True)
        entries = dict(_spec_entries(spec))
        assert entries[("self_attention", "linear_kv_down_proj")] is te["TELinear"]
        assert entries[("self_attention", "linear_q_down_proj")] is te["TELinear"]
        want = {".".join(path) + "." + p for path, cls in entries.items() for p in _TE_PARAMS[cls.__name__]
                if path != ("self_attention", "linear_q_proj") and path[:2] != ("mlp", "experts")}
        prefix = f"decoder.layers.{i}."
        got = {k[len(prefix):] for k in sd["model"] if k.startswith(prefix)}
        got = {k for k in got if not k.startswith(("mlp.router.", "mlp.experts."))}
        assert got == want, (i, got ^ want)


def test_fused_in_memory_experts_give_the_same_tensors():
    """transformers 5's in-memory state dict (experts fused: gate_up_proj [E, 2 Fe, h], down_proj [E, h, Fe]) and the
    checkpoint's per-expert names give the same Megatron tensors."""
    model, config = _model("v3")
    fused = model.state_dict()
    assert "model.layers.1.mlp.experts.gate_up_proj" in fused
    a, b = mw.mla_global(fused, config, 1024), mw.mla_global(model, config, 1024)
    for x, y in zip(a["layers"], b["layers"]):
        assert x.keys() == y.keys()
        for k in x:
            if k == "experts":
                assert all(torch.equal(p[n], q[n]) for p, q in zip(x[k], y[k]) for n in ("fc1", "fc2"))
            else:
                assert torch.equal(x[k], y[k]), k


def test_bf16_model_in_megatron_cores_dtypes(tmp_path, monkeypatch):
    """A bf16 HF model (transformers keeps its router weight and expert bias in float32): every tensor in the dtype
    Megatron-LM saves it in, from a bf16 run's model: Float16Module (module.bfloat16()), its first forward putting
    the router's expert_bias back in float32 (TopKRouter._maintain_float32_expert_bias), and
    state_dict_for_save_checkpoint, what save_checkpoint writes."""
    import transformers
    from megatron.core.transformer.module import Float16Module
    from megatron.core.transformer.moe.router import TopKRouter

    torch.manual_seed(4)
    config = _config("v3", q_lora_rank=24)  # with a q LoRA: megatron-core 0.16 and 0.19 build it
    model = transformers.AutoModelForCausalLM.from_config(config, dtype=torch.bfloat16).eval()
    assert model.model.layers[1].mlp.gate.weight.dtype == torch.float32  # HF's own choice
    ckpt = _load(mw.write_legacy_mla(model, config, tmp_path) / "mp_rank_00" / "model_optim_rng.pt")
    assert ckpt["args"].params_dtype == torch.bfloat16 and ckpt["args"].bf16
    ours = ckpt["model"]
    assert ours["decoder.layers.1.mlp.router.weight"].dtype == torch.bfloat16
    assert ours["decoder.layers.1.mlp.router.expert_bias"].dtype == torch.float32
    megatron = _megatron_model(ckpt["args"], monkeypatch)
    wrapped = Float16Module(megatron.config, megatron)
    routers = [m for m in megatron.modules() if isinstance(m, TopKRouter)]
    assert routers and all(r.expert_bias.dtype == torch.bfloat16 for r in routers)
    for r in routers:
        r._maintain_float32_expert_bias()
    theirs = wrapped.state_dict_for_save_checkpoint()
    assert list(ours) == list(theirs)
    for k, v in theirs.items():
        if isinstance(v, torch.Tensor):
            assert (ours[k].shape, ours[k].dtype) == (v.shape, v.dtype), k
    wrapped.module.load_state_dict(ours, strict=True)
