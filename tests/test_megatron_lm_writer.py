"""The proof that tests/megatron_lm_writer.py writes what NVIDIA Megatron-LM writes.

For each real Megatron-LM fixture in ../shared/megatron-lm-fixtures (see its README), the generator writes the same
layout from the fixture's HF source model `llama-hf`, and the two folders are compared: file and folder names, the
pickled entries, every model tensor bit for bit, the architecture args, and for torch_dist the .metadata keys,
global shapes, dtypes, shard layout and the tensors read back. Further tests cover layouts the fixtures do not
(PP, virtual pipeline, EP, TE names, qkv bias, tied embeddings, padding, rng and optimizer state) by rebuilding the HF
tensors from what the generator wrote, with a merge written here.
"""

from __future__ import annotations

import argparse
import io
import signal
from pathlib import Path

import pytest
import torch

from pai_zoo.formats.safe_pickle import allowing

HERE = Path(__file__).resolve().parent
FIXTURES = Path(__file__).resolve().parents[1].parent / "shared" / "megatron-lm-fixtures"
HAVE_FIXTURES = (FIXTURES / "llama-hf" / "model.safetensors").is_file()
pytestmark = pytest.mark.filterwarnings("ignore:torch.distributed is disabled:UserWarning")
needs_fixtures = pytest.mark.skipif(
    not HAVE_FIXTURES, reason="Megatron-LM fixtures not present (../shared/megatron-lm-fixtures)"
)

# the architecture fields of the fixture README's "Args fields" table (ckpt_format, the parallel sizes and
# world_size are compared separately, per fixture)
ARCH_FIELDS = (
    "num_layers hidden_size ffn_hidden_size num_attention_heads group_query_attention num_query_groups kv_channels "
    "normalization layernorm_epsilon apply_layernorm_1p swiglu add_bias_linear add_qkv_bias qk_layernorm "
    "position_embedding_type rotary_base rotary_percent rotary_interleaved use_rope_scaling add_position_embedding "
    "max_position_embeddings seq_length untie_embeddings_and_output_weights vocab_size padded_vocab_size "
    "make_vocab_size_divisible_by tokenizer_type tokenizer_model params_dtype bf16 fp16 transformer_impl "
    "use_legacy_models ckpt_format tensor_model_parallel_size pipeline_model_parallel_size world_size "
    "attention_dropout hidden_dropout"
).split()


import megatron_lm_writer as mlw  # noqa: E402 - registered by conftest.py


def _safe_load(path: Path):
    """torch.load with weights_only=True and only the classes Megatron-LM's args pickle needs."""
    from megatron.core.enums import ModelType
    from megatron.core.transformer.enums import AttnBackend

    with allowing([argparse.Namespace, ModelType, AttnBackend, signal.Signals]):
        return torch.load(path, map_location="cpu", weights_only=True)


def _megatron_load(path_or_buffer):
    """torch.load as Megatron-LM itself loads checkpoints: weights_only=True with megatron-core's SAFE_GLOBALS."""
    from megatron.core.safe_globals import SAFE_GLOBALS

    with allowing(SAFE_GLOBALS):
        return torch.load(path_or_buffer, map_location="cpu", weights_only=True)


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


def _assert_same_args(ours: argparse.Namespace, theirs: argparse.Namespace) -> None:
    for field in ARCH_FIELDS:
        a, b = getattr(ours, field), getattr(theirs, field)
        assert (a, type(a)) == (b, type(b)), field
    # every field the generator writes is a Megatron-LM field, of the type Megatron-LM stores
    theirs_vars = vars(theirs)
    unknown = sorted(set(vars(ours)) - set(theirs_vars))
    assert not unknown, unknown
    for k, v in vars(ours).items():
        w = theirs_vars[k]
        if v is not None and w is not None:
            assert type(v) is type(w), (k, v, w)


@pytest.fixture(scope="module")
def llama_hf():
    from safetensors.torch import load_file
    from transformers import LlamaConfig

    config = LlamaConfig.from_pretrained(FIXTURES / "llama-hf")
    return load_file(FIXTURES / "llama-hf" / "model.safetensors"), config


# --------------------------------------------------------------------------------------------------------------
# against the real fixtures


@needs_fixtures
@pytest.mark.parametrize("tp", [1, 2])
def test_legacy_matches_megatron_lm(tmp_path, llama_hf, tp):
    fixture = FIXTURES / f"llama-legacy-tp{tp}"
    state, config = llama_hf
    mlw.write_legacy(state, config, tmp_path, tp=tp, with_rng=False)

    assert _tree(tmp_path) == _tree(fixture)
    assert (tmp_path / mlw.TRACKER).read_text() == (fixture / mlw.TRACKER).read_text() == "1"
    for rank in sorted((fixture / "iter_0000001").iterdir()):
        theirs = _safe_load(rank / "model_optim_rng.pt")
        ours = _safe_load(tmp_path / "iter_0000001" / rank.name / "model_optim_rng.pt")
        assert list(ours) == list(theirs)
        for k in ("checkpoint_version", "iteration", "num_floating_point_operations_so_far"):
            assert (ours[k], type(ours[k])) == (theirs[k], type(theirs[k])), k
        assert list(ours["model"]) == list(theirs["model"])  # same keys, same order
        for k, v in theirs["model"].items():
            w = ours["model"][k]
            if v is None:
                assert w is None, k
            else:
                assert w.dtype == v.dtype and torch.equal(w, v), k
        _assert_same_args(ours["args"], theirs["args"])


def _dcp_read(ckpt_dir: Path, metadata) -> dict:
    from torch.distributed.checkpoint import FileSystemReader, load
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    out = {}
    for key, md in metadata.state_dict_metadata.items():
        if isinstance(md, BytesStorageMetadata):
            out[key] = io.BytesIO()
        else:
            out[key] = torch.empty(md.size, dtype=md.properties.dtype)
    load(out, storage_reader=FileSystemReader(ckpt_dir), no_dist=True)
    for key, value in out.items():
        if isinstance(value, io.BytesIO):
            value.seek(0)
            out[key] = _megatron_load(value)
    return out


def _compare_dist(ours_dir: Path, theirs_dir: Path, *, extra_keys: frozenset = frozenset()) -> dict:
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata, TensorStorageMetadata

    ours_md = FileSystemReader(ours_dir).read_metadata()
    theirs_md = FileSystemReader(theirs_dir).read_metadata()
    assert set(ours_md.state_dict_metadata) == set(theirs_md.state_dict_metadata) | extra_keys
    for key, md in theirs_md.state_dict_metadata.items():
        mine = ours_md.state_dict_metadata[key]
        assert type(mine) is type(md), key
        if isinstance(md, TensorStorageMetadata):
            assert mine.size == md.size and mine.properties.dtype == md.properties.dtype, key
            chunks = {(tuple(c.offsets), tuple(c.sizes)) for c in md.chunks}
            assert {(tuple(c.offsets), tuple(c.sizes)) for c in mine.chunks} == chunks, key
        else:
            assert isinstance(mine, BytesStorageMetadata)
    # the tensors and byte objects read back
    ours, theirs = _dcp_read(ours_dir, ours_md), _dcp_read(theirs_dir, theirs_md)
    for key, v in theirs.items():
        if isinstance(v, torch.Tensor):
            assert torch.equal(ours[key], v), key
        else:
            assert ours[key] == v, key
    assert (ours_dir / "metadata.json").read_text() == (theirs_dir / "metadata.json").read_text()
    return ours


@needs_fixtures
def test_torch_dist_matches_megatron_lm(tmp_path, llama_hf):
    fixture = FIXTURES / "llama-dist-tp2"
    state, config = llama_hf
    mlw.write_torch_dist(state, config, tmp_path, tp=2)

    assert _tree(tmp_path) == _tree(fixture)
    assert (tmp_path / mlw.TRACKER).read_text() == "1"
    _compare_dist(tmp_path / "iter_0000001", fixture / "iter_0000001")
    ours, theirs = (_safe_load(d / "iter_0000001" / "common.pt") for d in (tmp_path, fixture))
    assert list(ours) == list(theirs)
    for k in ("checkpoint_version", "iteration", "num_floating_point_operations_so_far", "content_metadata"):
        assert (ours[k], type(ours[k])) == (theirs[k], type(theirs[k])), k
    _assert_same_args(ours["args"], theirs["args"])
    # megatron-core's own torch_dist readers see the same checkpoint
    from megatron.core import dist_checkpointing
    from megatron.core.dist_checkpointing.core import maybe_load_config

    ours_ckpt, theirs_ckpt = str(tmp_path / "iter_0000001"), str(fixture / "iter_0000001")
    assert maybe_load_config(ours_ckpt) == maybe_load_config(theirs_ckpt)
    summary = [
        {k: (tuple(v.global_shape), v.dtype) for k, v in dist_checkpointing.load_tensors_metadata(d).items()}
        for d in (ours_ckpt, theirs_ckpt)
    ]
    assert summary[0] == summary[1]
    from megatron.core.safe_globals import SAFE_GLOBALS

    with allowing(SAFE_GLOBALS):  # Megatron-LM registers these at start-up
        assert list(dist_checkpointing.load_common_state_dict(ours_ckpt)) == list(theirs)
    assert not hasattr(ours["args"], "model_type") and not hasattr(theirs["args"], "model_type")
    for k in ("use_dist_ckpt", "expert_tensor_parallel_size", "iteration"):
        assert getattr(ours["args"], k) == getattr(theirs["args"], k), k


@needs_fixtures
def test_torch_dist_common_state_in_metadata(tmp_path, llama_hf):
    """The newer form (megatron-core 0.19, Megatron-LM PR #5160): the common state is a DCP byte entry."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject

    assert mlw.COMMON_STATE_KEY == ShardedObject("common_state", None, (1,), (0,)).unique_key
    fixture = FIXTURES / "llama-dist-tp2" / "iter_0000001"
    state, config = llama_hf
    it_dir = mlw.write_torch_dist(state, config, tmp_path, tp=2, common_in_metadata=True)

    assert not (it_dir / "common.pt").exists()
    assert _tree(it_dir) == [p for p in _tree(fixture) if p != "common.pt"]
    ours = _compare_dist(it_dir, fixture, extra_keys=frozenset({mlw.COMMON_STATE_KEY}))
    common = ours[mlw.COMMON_STATE_KEY]
    assert isinstance(common, list) and len(common) == 1
    theirs = _safe_load(fixture / "common.pt")
    assert list(common[0]) == list(theirs)
    _assert_same_args(common[0]["args"], theirs["args"])


# --------------------------------------------------------------------------------------------------------------
# layouts the fixtures do not have: merged back to HF here and compared with the source model


def _tiny(kind: str, *, tied: bool = False, layers: int = 4):
    import transformers

    common = dict(
        vocab_size=250,  # not a multiple of 128: Megatron pads the vocabulary
        hidden_size=32,
        intermediate_size=48,
        num_hidden_layers=layers,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=64,
        tie_word_embeddings=tied,
    )
    if kind == "qwen2":
        config = transformers.Qwen2Config(**common)
        model = transformers.Qwen2ForCausalLM(config)
    else:
        config = transformers.LlamaConfig(**common)
        model = transformers.LlamaForCausalLM(config)
    torch.manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.normal_()
    return model, config


def _merge_to_hf(ckpt: Path, config, *, tp: int, pp: int, vpp: int | None, ep: int, te_names: bool) -> dict:
    """An HF state dict rebuilt from a legacy checkpoint (rank 0 of each expert group is read; all must agree)."""
    h, nh, ng, L = config.hidden_size, config.num_attention_heads, config.num_key_value_heads, config.num_hidden_layers
    d = h // nh
    tracker = (ckpt / mlw.TRACKER).read_text()
    it_dir = ckpt / ("release" if tracker == "release" else f"iter_{int(tracker):07d}")
    files = {}
    for p in range(pp):
        for t in range(tp):
            parts = [
                _megatron_load(it_dir / mlw.rank_folder(t, p, e, pp=pp, ep=ep) / "model_optim_rng.pt")
                for e in range(ep)
            ]
            # every expert-parallel copy holds the same dense weights
            for other in parts[1:]:
                assert list(other["model" if not vpp else "model0"]) == list(parts[0]["model" if not vpp else "model0"])
            files[t, p] = parts[0]
    L_per = L // (pp * (vpp or 1))
    shards: dict[tuple[str, int], list] = {}  # (HF-side name, global layer) -> per-TP-rank tensors
    top: dict[str, list] = {}
    for (t, p), ckpt_dict in sorted(files.items()):
        chunks = [ckpt_dict[f"model{c}"] for c in range(vpp)] if vpp else [ckpt_dict["model"]]
        for c, sd in enumerate(chunks):
            for k, v in sd.items():
                if k.endswith("_extra_state"):
                    assert v is None
                    continue
                if k.startswith("decoder.layers."):
                    local, rest = k[len("decoder.layers."):].split(".", 1)
                    glob = c * (L // (vpp or 1)) + p * L_per + int(local)
                    shards.setdefault((rest, glob), [None] * tp)[t] = v
                else:
                    top.setdefault(k, [None] * tp)[t] = v
    hf = {}
    vocab = config.vocab_size
    hf["model.embed_tokens.weight"] = torch.cat(top["embedding.word_embeddings.weight"])[:vocab]
    if "output_layer.weight" in top:
        out = torch.cat(top["output_layer.weight"])[:vocab]
        if config.tie_word_embeddings:
            assert torch.equal(out, hf["model.embed_tokens.weight"])
        else:
            hf["lm_head.weight"] = out
    hf["model.norm.weight"] = top["decoder.final_layernorm.weight"][0]
    in_norm = "self_attention.linear_qkv.layer_norm_weight" if te_names else "input_layernorm.weight"
    mlp_norm = "mlp.linear_fc1.layer_norm_weight" if te_names else "pre_mlp_layernorm.weight"
    hpg = nh // ng
    for i in range(L):
        pre = f"model.layers.{i}."
        hf[pre + "input_layernorm.weight"] = shards[in_norm, i][0]
        hf[pre + "post_attention_layernorm.weight"] = shards[mlp_norm, i][0]
        for name in ("weight", "bias"):
            if (f"self_attention.linear_qkv.{name}", i) not in shards:
                continue
            qkv = torch.cat(shards[f"self_attention.linear_qkv.{name}", i])
            grouped = qkv.reshape(ng, (hpg + 2) * d, *qkv.shape[1:])
            q, k, v = grouped.split([hpg * d, d, d], dim=1)
            hf[pre + f"self_attn.q_proj.{name}"] = q.reshape(nh * d, *qkv.shape[1:])
            hf[pre + f"self_attn.k_proj.{name}"] = k.reshape(ng * d, *qkv.shape[1:])
            hf[pre + f"self_attn.v_proj.{name}"] = v.reshape(ng * d, *qkv.shape[1:])
        hf[pre + "self_attn.o_proj.weight"] = torch.cat(shards["self_attention.linear_proj.weight", i], dim=1)
        gates, ups = zip(*(s.chunk(2) for s in shards["mlp.linear_fc1.weight", i]))
        hf[pre + "mlp.gate_proj.weight"] = torch.cat(gates)
        hf[pre + "mlp.up_proj.weight"] = torch.cat(ups)
        hf[pre + "mlp.down_proj.weight"] = torch.cat(shards["mlp.linear_fc2.weight", i], dim=1)
    return hf


@pytest.mark.parametrize(
    "kind,tied,tp,pp,vpp,ep,te_names",
    [
        ("llama", False, 1, 2, None, 1, False),  # PP 2
        ("llama", False, 2, 2, None, 1, True),  # TP x PP = 2 x 2, TE names
        ("qwen2", False, 2, 2, 2, 1, False),  # qkv bias, virtual pipeline
        ("qwen2", True, 2, 2, None, 2, False),  # tied embeddings across stages, EP 2
    ],
)
def test_legacy_layouts_round_trip(tmp_path, kind, tied, tp, pp, vpp, ep, te_names):
    model, config = _tiny(kind, tied=tied)
    mlw.write_legacy(model, config, tmp_path, tp=tp, pp=pp, vpp=vpp, ep=ep, te_names=te_names, with_optimizer=True)
    it_dir = tmp_path / "iter_0000001"
    names = sorted(p.name for p in it_dir.iterdir())
    ranks = [(t, p, e) for t in range(tp) for p in range(pp) for e in range(ep)]
    assert names == sorted(mlw.rank_folder(t, p, e, pp=pp, ep=ep) for t, p, e in ranks)
    for folder in it_dir.iterdir():
        assert sorted(p.name for p in folder.iterdir()) == ["distrib_optim.pt", "model_optim_rng.pt"]
    # loadable as Megatron-LM loads them (the rng state holds numpy arrays); distrib_optim.pt too
    first = _megatron_load(next(it_dir.glob("*/model_optim_rng.pt")))
    assert "per_bucket_numel" in _megatron_load(next(it_dir.glob("*/distrib_optim.pt")))
    assert isinstance(first["rng_state"], list) and set(first["rng_state"][0]) == {
        "random_rng_state", "np_rng_state", "torch_rng_state", "cuda_rng_state", "rng_tracker_states"
    }
    assert "optimizer" in first and first["args"].padded_vocab_size == 256
    assert first["args"].add_qkv_bias == (kind == "qwen2")
    assert first["args"].untie_embeddings_and_output_weights == (not tied)
    assert first["args"].virtual_pipeline_model_parallel_size == vpp

    hf = _merge_to_hf(tmp_path, config, tp=tp, pp=pp, vpp=vpp, ep=ep, te_names=te_names)
    source = {k: v for k, v in model.state_dict().items() if not (tied and k == "lm_head.weight")}
    assert set(hf) == set(source)
    for k, v in source.items():
        assert torch.equal(hf[k], v), k


def test_vocab_padding_and_interleaved_layers():
    assert mlw.padded_vocab(250, 1) == 256 and mlw.padded_vocab(250, 2) == 256 and mlw.padded_vocab(300, 2) == 512
    assert mlw.padded_vocab(32000, 2) == 32000
    # 8 layers, PP 2, VPP 2: stage 0 holds layers 0-1 and 4-5, stage 1 holds 2-3 and 6-7
    assert [mlw.chunk_layers(8, 2, 2, p, c) for p in range(2) for c in range(2)] == [[0, 1], [4, 5], [2, 3], [6, 7]]
    assert mlw.chunk_layers(4, 2, None, 1) == [2, 3]
    assert mlw.rank_folder(1, 1, 0, pp=2, ep=1) == "mp_rank_01_001"
    assert mlw.rank_folder(1, 0, 1, pp=1, ep=2) == "mp_rank_01_001"
    assert mlw.rank_folder(0, 1, 1, pp=2, ep=2) == "mp_rank_00_001_001"


def test_release_and_torch_dist_of_a_qwen2(tmp_path):
    model, config = _tiny("qwen2", layers=2)
    mlw.write_legacy(model, config, tmp_path / "legacy", release=True, with_rng=False)
    assert (tmp_path / "legacy" / mlw.TRACKER).read_text() == "release"
    assert (tmp_path / "legacy" / "release" / "mp_rank_00" / "model_optim_rng.pt").is_file()

    it_dir = mlw.write_torch_dist(model, config, tmp_path / "dist", tp=2, iteration=7)
    assert it_dir.name == "iter_0000007" and (tmp_path / "dist" / mlw.TRACKER).read_text() == "7"
    from torch.distributed.checkpoint import FileSystemReader

    md = FileSystemReader(it_dir).read_metadata()
    back = _dcp_read(it_dir, md)
    sd = model.state_dict()
    bias = back["decoder.layers.self_attention.linear_qkv.bias"]
    assert bias.shape == (2, (4 + 2 * 2) * 8)
    # group 0 of layer 1: the two query heads' biases, then the key head's, then the value head's
    q, k, v = (sd[f"model.layers.1.self_attn.{n}_proj.bias"] for n in "qkv")
    assert torch.equal(bias[1, :32], torch.cat([q[:16], k[:8], v[:8]]))
    emb = back["embedding.word_embeddings.weight"]
    assert emb.shape == (256, 32) and torch.equal(emb[:250], sd["model.embed_tokens.weight"])
    assert not emb[250:].any()
    assert sorted(p.name for p in it_dir.iterdir()) == [
        ".metadata", "__0_0.distcp", "__0_1.distcp", "__1_0.distcp", "__1_1.distcp", "common.pt", "metadata.json"
    ]


# --------------------------------------------------------------------------------------------------------------
# mixture-of-experts models (Mixtral, Qwen2-MoE, Qwen3-MoE): against megatron-core's own GPTModel, and the parallel
# and grouped forms merged back here


def _moe_config(kind: str):
    import transformers

    common = dict(vocab_size=997, hidden_size=48, num_attention_heads=6, num_key_value_heads=2, head_dim=12,
                  max_position_embeddings=64, num_experts_per_tok=2, tie_word_embeddings=False)
    if kind == "mixtral":
        return transformers.MixtralConfig(**common, intermediate_size=40, num_hidden_layers=2, num_local_experts=4)
    moe = dict(intermediate_size=64, moe_intermediate_size=40, num_experts=4, norm_topk_prob=False)
    if kind == "qwen2_moe":  # a dense layer among MoE layers, a gated shared expert, q/k/v biases
        return transformers.Qwen2MoeConfig(**common, **moe, num_hidden_layers=3, shared_expert_intermediate_size=56,
                                           mlp_only_layers=[1])
    if kind == "qwen2_moe_all":  # every layer MoE
        return transformers.Qwen2MoeConfig(**common, **moe, num_hidden_layers=2, shared_expert_intermediate_size=56)
    assert kind == "qwen3_moe"  # q/k norms, top-k not renormalised
    return transformers.Qwen3MoeConfig(**common, **moe, num_hidden_layers=2)


_MOE_MODELS: dict = {}


def _moe_model(kind: str):
    """A tiny random HF MoE model (built once per kind), its norms perturbed away from 1."""
    if kind not in _MOE_MODELS:
        import transformers

        torch.manual_seed(1)
        config = _moe_config(kind)
        model = mlw.randomise_weights(transformers.AutoModelForCausalLM.from_config(config))
        _MOE_MODELS[kind] = (model, config)
    return _MOE_MODELS[kind]


def _load_model_dict(folder: Path, key: str = "model") -> dict:
    return _megatron_load(folder / "model_optim_rng.pt")[key]


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_args_in_megatron_lm_names(kind):
    model, config = _moe_model(kind)
    args = mlw.megatron_args(config, tensor_model_parallel_size=2)
    expected = {
        "mixtral": dict(num_experts=4, moe_ffn_hidden_size=40, ffn_hidden_size=40, moe_router_pre_softmax=False,
                        moe_layer_freq=1, moe_shared_expert_intermediate_size=None, moe_shared_expert_gate=False,
                        add_qkv_bias=False, qk_layernorm=False),
        "qwen2_moe": dict(num_experts=4, moe_ffn_hidden_size=40, ffn_hidden_size=64, moe_router_pre_softmax=True,
                          moe_layer_freq=[1, 0, 1], moe_shared_expert_intermediate_size=56,
                          moe_shared_expert_gate=True, add_qkv_bias=True, qk_layernorm=False),
        "qwen3_moe": dict(num_experts=4, moe_ffn_hidden_size=40, ffn_hidden_size=64, moe_router_pre_softmax=True,
                          moe_layer_freq=1, moe_shared_expert_intermediate_size=None, moe_shared_expert_gate=False,
                          add_qkv_bias=False, qk_layernorm=True),
    }[kind]
    expected.update(moe_router_topk=2, moe_router_score_function="softmax", moe_token_dispatcher_type="alltoall",
                    moe_router_load_balancing_type="aux_loss", moe_aux_loss_coeff=0.001, moe_grouped_gemm=False,
                    moe_router_dtype=None, moe_router_topk_scaling_factor=None, moe_router_enable_expert_bias=False,
                    moe_router_num_groups=None, moe_router_group_topk=None, expert_tensor_parallel_size=2,
                    kv_channels=12, num_query_groups=2, padded_vocab_size=1024)
    assert {k: getattr(args, k) for k in expected} == expected
    # a renormalised top-k is Megatron's top-k-then-softmax routing; Mixtral always renormalises
    assert mlw.megatron_args(config.to_dict() | {"norm_topk_prob": True}).moe_router_pre_softmax is False
    if kind == "mixtral":
        assert mlw.megatron_args(config.to_dict() | {"norm_topk_prob": False}).moe_router_pre_softmax is False
    assert mlw.megatron_args(config, moe_router_topk=3).moe_router_topk == 3  # overrides win
    # the MoE fields are Megatron-LM's: the TransformerConfig fields megatron-core builds from them
    import megatron.core.transformer.transformer_config as tc

    fields = set(tc.TransformerConfig.__dataclass_fields__)
    for k in expected:
        if k.startswith("moe_") or k == "expert_tensor_parallel_size":
            assert k in fields, k
    if HAVE_FIXTURES:  # and every one of them is in the args Megatron-LM 0.16 pickled
        theirs = _safe_load(FIXTURES / "llama-legacy-tp1" / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt")
        assert not set(vars(args)) - set(vars(theirs["args"]))


def test_hf_expert_tensor_forms_agree():
    """The fused in-memory experts (transformers 5) and the per-expert names save_pretrained writes give the same
    Megatron tensors, and those are the HF per-expert tensors: [gate ; up] and down."""
    from transformers.core_model_loading import revert_weight_conversion

    for kind in ("mixtral", "qwen2_moe"):
        model, config = _moe_model(kind)
        saved = revert_weight_conversion(model, model.state_dict())
        assert not any("gate_up_proj" in k for k in saved)
        fused, per_expert = (mlw.megatron_global(sd, config, 1024) for sd in (model.state_dict(), saved))
        for a, b in zip(fused["layers"], per_expert["layers"]):
            assert a.keys() == b.keys()
            for k in a:
                if k == "experts":
                    assert all(torch.equal(x[n], y[n]) for x, y in zip(a[k], b[k]) for n in ("fc1", "fc2"))
                else:
                    assert torch.equal(a[k], b[k]), k
        p = "model.layers.0.block_sparse_moe.experts.3." if kind == "mixtral" else "model.layers.0.mlp.experts.3."
        gate, up, down = (("w1", "w3", "w2") if kind == "mixtral" else ("gate_proj", "up_proj", "down_proj"))
        x = fused["layers"][0]["experts"][3]
        assert torch.equal(x["fc1"], torch.cat([saved[p + gate + ".weight"], saved[p + up + ".weight"]]))
        assert torch.equal(x["fc2"], saved[p + down + ".weight"])
        if kind == "qwen2_moe":
            assert "experts" not in fused["layers"][1] and fused["layers"][1]["fc1"].shape == (128, 48)
            assert torch.equal(fused["layers"][2]["shared_gate"], saved["model.layers.2.mlp.shared_expert_gate.weight"])


def _rope_theta(config) -> float:
    params = getattr(config, "rope_parameters", None) or {}
    return float(params.get("rope_theta") or getattr(config, "rope_theta", None) or 10000.0)


def _megatron_moe_model(args, config):
    """megatron-core's own GPTModel (local spec, SequentialMLP experts) from the written args."""
    from megatron.core.models.gpt import GPTModel
    from megatron.core.models.gpt.gpt_layer_specs import get_gpt_decoder_block_spec
    from megatron.core.transformer import TransformerConfig

    from pai_zoo.mcore.compat import ensure_model_parallel

    ensure_model_parallel()
    tc = TransformerConfig(
        num_layers=args.num_layers, hidden_size=args.hidden_size, ffn_hidden_size=args.ffn_hidden_size,
        num_attention_heads=args.num_attention_heads, num_query_groups=args.num_query_groups,
        kv_channels=args.kv_channels, normalization=args.normalization, layernorm_epsilon=config.rms_norm_eps,
        gated_linear_unit=args.swiglu, activation_func=torch.nn.functional.silu, add_bias_linear=args.add_bias_linear,
        add_qkv_bias=args.add_qkv_bias, qk_layernorm=args.qk_layernorm, num_moe_experts=args.num_experts,
        moe_ffn_hidden_size=args.moe_ffn_hidden_size, moe_router_topk=args.moe_router_topk,
        moe_router_pre_softmax=args.moe_router_pre_softmax,
        moe_router_score_function=args.moe_router_score_function,
        moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
        moe_shared_expert_gate=args.moe_shared_expert_gate, moe_layer_freq=args.moe_layer_freq,
        moe_token_dispatcher_type=args.moe_token_dispatcher_type, moe_grouped_gemm=args.moe_grouped_gemm,
        moe_router_load_balancing_type="none", hidden_dropout=0.0, attention_dropout=0.0,
        use_cpu_initialization=True, perform_initialization=False, masked_softmax_fusion=False,
        bias_activation_fusion=False, bias_dropout_fusion=False, apply_rope_fusion=False, persist_layer_norm=False,
        gradient_accumulation_fusion=False, params_dtype=args.params_dtype,
    )
    spec = get_gpt_decoder_block_spec(tc, use_transformer_engine=False)
    return GPTModel(tc, spec, vocab_size=args.padded_vocab_size, max_sequence_length=args.max_position_embeddings,
                    position_embedding_type="rope", rotary_base=_rope_theta(config),
                    share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights).eval()


@pytest.mark.parametrize("kind", ["mixtral", "qwen2_moe", "qwen3_moe"])
def test_moe_sequential_loads_strictly_into_megatron_core_and_gives_the_hf_logits(tmp_path, kind):
    torch.set_num_threads(1)
    model, config = _moe_model(kind)
    mlw.write_legacy(model, config, tmp_path, experts="sequential", with_rng=False)
    ckpt = _megatron_load(tmp_path / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt")
    ours, args = ckpt["model"], ckpt["args"]
    megatron = _megatron_moe_model(args, config)
    theirs = megatron.state_dict()
    assert list(ours) == list(theirs)  # every key, in megatron's order
    for k, v in theirs.items():
        if isinstance(v, torch.Tensor):
            assert ours[k].shape == v.shape and ours[k].dtype == v.dtype, k
        else:
            assert ours[k] is None and v is None, k
    megatron.load_state_dict(ours, strict=True)

    ids = torch.tensor([[5, 996, 17, 300, 42, 7, 811], [1, 2, 3, 500, 600, 700, 800]])
    s = ids.shape[1]
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).expand(2, 1, s, s)
    positions = torch.arange(s).expand(2, s)
    with torch.no_grad():
        got = megatron(ids, positions, mask)[..., : config.vocab_size]
        want = model(ids).logits
    assert want.abs().max() > 1  # not vanishing logits
    assert torch.allclose(got, want, atol=1e-4, rtol=1e-4), (got - want).abs().max()


def _merge_moe(ckpt: Path, config, *, tp: int, ep: int, experts: str, pp: int = 1) -> dict:
    """The TP 1, PP 1, EP 1, SequentialMLP model dict rebuilt from any TP x PP x EP legacy checkpoint of an MoE model
    (tensor entries only): written here, independently of the writer."""
    E = config.to_dict().get("num_experts") or config.to_dict().get("num_local_experts")
    h, per, L_per = config.hidden_size, E // ep, config.num_hidden_layers // pp
    it_dir = ckpt / "iter_0000001"
    files = {(t, p, e): _load_model_dict(it_dir / mlw.rank_folder(t, p, e, pp=pp, ep=ep)) for t in range(tp)
             for p in range(pp) for e in range(ep)}
    by_key: dict[str, dict] = {}  # sequential key -> {tp rank: tensor}, checked equal across EP copies
    for (t, p, e), sd in files.items():
        for k, v in sd.items():
            if v is None:
                assert k.endswith("_extra_state"), k
                continue
            if k.startswith("decoder.layers."):  # each pipeline stage numbers its layers from 0
                local, rest = k[len("decoder.layers."):].split(".", 1)
                k = f"decoder.layers.{p * L_per + int(local)}.{rest}"
            layer, _, rest = k.partition(".mlp.experts.")
            if not rest:
                prev = by_key.setdefault(k, {}).setdefault(t, v)
                assert torch.equal(prev, v), k  # non-expert tensors are the same in every EP rank's file
                continue
            if experts == "sequential":
                j, name = rest[len("local_experts."):].split(".", 1)
                pieces = {int(j): v}
            elif experts == "te_grouped":
                name, j = rest.rsplit(".weight", 1)
                name, pieces = name + ".weight", {int(j): v}
            else:
                assert rest in ("weight1", "weight2"), rest
                name = "linear_fc1.weight" if rest == "weight1" else "linear_fc2.weight"
                view = v.view(per, h, -1) if rest == "weight1" else v.view(per, -1, h)
                pieces = {j: view[j].t() for j in range(per)}
            for j, piece in pieces.items():
                key = f"{layer}.mlp.experts.local_experts.{e * per + j}.{name}"
                assert t not in by_key.setdefault(key, {}), key
                by_key[key][t] = piece
    out = {}
    for k, shards in by_key.items():
        parts = [shards[t] for t in range(tp)]
        if k.endswith("linear_fc1.weight"):  # column-parallel SwiGLU: [gate_t ; up_t] per rank
            gates, ups = zip(*(x.chunk(2) for x in parts))
            out[k] = torch.cat([*gates, *ups])
        elif k.endswith(("linear_fc2.weight", "linear_proj.weight")):
            out[k] = torch.cat(parts, dim=1)
        elif k.endswith(("linear_qkv.weight", "linear_qkv.bias", "word_embeddings.weight", "output_layer.weight")):
            out[k] = torch.cat(parts)
        else:  # norms, router, shared-expert gate: replicated
            assert all(torch.equal(x, parts[0]) for x in parts), k
            out[k] = parts[0]
    return out


@pytest.mark.parametrize("kind,tp,ep,experts,pp", [
    ("qwen2_moe", 2, 1, "sequential", 1),
    ("qwen2_moe", 1, 2, "grouped", 1),
    ("qwen2_moe", 2, 2, "te_grouped", 1),
    ("mixtral", 2, 2, "te_grouped", 1),
    ("qwen3_moe", 2, 2, "grouped", 1),
    ("mixtral", 2, 1, "grouped", 2),
])
def test_moe_parallel_and_grouped_forms_merge_to_the_tp1_form(tmp_path, kind, tp, ep, experts, pp):
    model, config = _moe_model(kind)
    te = experts == "te_grouped"
    mlw.write_legacy(model, config, tmp_path / "ref", experts="sequential", te_names=te, with_rng=False)
    ref = {k: v for k, v in _load_model_dict(tmp_path / "ref" / "iter_0000001" / "mp_rank_00").items()
           if v is not None}
    mlw.write_legacy(model, config, tmp_path / "x", tp=tp, pp=pp, ep=ep, experts=experts, with_rng=False)
    it_dir = tmp_path / "x" / "iter_0000001"
    assert sorted(f.name for f in it_dir.iterdir()) == sorted(
        mlw.rank_folder(t, p, e, pp=pp, ep=ep) for t in range(tp) for p in range(pp) for e in range(ep))
    ckpt = _megatron_load(it_dir / mlw.rank_folder(tp - 1, 0, ep - 1, pp=pp, ep=ep) / "model_optim_rng.pt")
    args, sd = ckpt["args"], ckpt["model"]
    assert args.moe_grouped_gemm is (experts != "sequential")
    assert args.moe_use_legacy_grouped_gemm is (experts == "grouped")
    assert args.transformer_impl == ("transformer_engine" if te else "local")
    assert (args.expert_model_parallel_size, args.expert_tensor_parallel_size) == (ep, tp)
    # the per-rank shapes of layer 0's experts (2 local experts at EP 2, 4 at EP 1)
    per, fe, h = 4 // ep, 40 // tp, 48
    ex = "decoder.layers.0.mlp.experts."
    if experts == "grouped":
        assert sd[ex + "weight1"].shape == (h, per * 2 * fe) and sd[ex + "weight2"].shape == (per * fe, h)
        assert not any(k.startswith(ex) and not k.endswith(("weight1", "weight2")) for k in sd)
    elif experts == "te_grouped":
        names = [k[len(ex):] for k in sd if k.startswith(ex)]
        assert names == [*(f"linear_fc1.weight{j}" for j in range(per)), "linear_fc1._extra_state",
                         *(f"linear_fc2.weight{j}" for j in range(per)), "linear_fc2._extra_state"]
        assert sd[ex + "linear_fc1.weight0"].shape == (2 * fe, h) and sd[ex + "linear_fc2.weight0"].shape == (h, fe)
        assert "decoder.layers.0.pre_mlp_layernorm.weight" in sd  # no fused norm in a MoE layer
    else:
        assert sd[ex + f"local_experts.{per - 1}.linear_fc1.weight"].shape == (2 * fe, h)
        assert ex + f"local_experts.{per}.linear_fc1.weight" not in sd
    merged = _merge_moe(tmp_path / "x", config, tp=tp, ep=ep, experts=experts, pp=pp)
    assert set(merged) == set(ref)
    for k, v in ref.items():
        assert merged[k].dtype == v.dtype and torch.equal(merged[k], v), k
    # and expert 3 of the last layer is the HF one
    last = config.num_hidden_layers - 1
    hf = mlw.megatron_global(model, config, 1024)["layers"][last]["experts"][3]
    assert torch.equal(merged[f"decoder.layers.{last}.mlp.experts.local_experts.3.linear_fc1.weight"], hf["fc1"])


def _megatron_layout(model) -> tuple[dict, set]:
    """megatron-core's torch_dist layout of a model: key -> (global shape, {(offsets, sizes)}), object keys."""
    from megatron.core.dist_checkpointing.mapping import ShardedObject, ShardedTensor, apply_factories

    sharded = model.sharded_state_dict()
    apply_factories(sharded)
    tensors, objects = {}, set()

    def walk(x):
        if isinstance(x, dict):
            for v in x.values():
                yield from walk(v)
        elif isinstance(x, (list, tuple)):
            for v in x:
                yield from walk(v)
        else:
            yield x

    for item in walk(sharded):
        if isinstance(item, ShardedObject):
            objects.add(item.unique_key)
        elif isinstance(item, ShardedTensor):
            entry = tensors.setdefault(item.key, (tuple(item.global_shape), set()))
            sizes = (1,) * item.prepend_axis_num + tuple(item.data.shape)
            entry[1].add((tuple(item.global_offset), sizes))
    return tensors, objects


@pytest.mark.parametrize("kind", ["qwen2_moe_all", "qwen3_moe", "qwen2_moe"])
def test_moe_torch_dist_has_megatron_cores_layout(tmp_path, kind):
    """Keys, global shapes, single-rank chunks and byte entries as megatron-core's GPTModel.sharded_state_dict gives
    them (stacked by layer, or per layer when dense and MoE layers are mixed), holding the TP 1 legacy tensors."""
    from torch.distributed.checkpoint import FileSystemReader
    from torch.distributed.checkpoint.metadata import BytesStorageMetadata

    torch.set_num_threads(1)
    model, config = _moe_model(kind)
    mlw.write_legacy(model, config, tmp_path / "legacy", with_rng=False)
    legacy = _megatron_load(tmp_path / "legacy" / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt")
    with torch.device("meta"):
        megatron = _megatron_moe_model(legacy["args"], config)
    tensors, objects = _megatron_layout(megatron)
    mixed = kind == "qwen2_moe"
    assert ("decoder.layers.0.mlp.experts.experts.linear_fc1.weight" if mixed
            else "decoder.layers.mlp.experts.experts.linear_fc1.weight") in tensors

    sd, L = legacy["model"], config.num_hidden_layers
    for tp in (1, 2):
        it_dir = mlw.write_torch_dist(model, config, tmp_path / f"dist{tp}", tp=tp)
        md = FileSystemReader(it_dir).read_metadata().state_dict_metadata
        ours_objects = {k for k, v in md.items() if isinstance(v, BytesStorageMetadata)}
        assert ours_objects == objects
        ours = {k: v for k, v in md.items() if not isinstance(v, BytesStorageMetadata)}
        assert set(ours) == set(tensors)
        for k, (shape, chunks) in tensors.items():
            assert tuple(ours[k].size) == shape, k
            if tp == 1:  # megatron-core's single-rank chunks, exactly
                assert {(tuple(c.offsets), tuple(c.sizes)) for c in ours[k].chunks} == chunks, k
        back = _dcp_read(it_dir, FileSystemReader(it_dir).read_metadata())

        def get(name: str, i: int) -> torch.Tensor:
            return back[f"decoder.layers.{i}.{name}"] if mixed else back[f"decoder.layers.{name}"][i]

        # the global tensors are the TP 1 legacy tensors, stacked by layer (and expert)
        for i in range(L):
            assert torch.equal(get("mlp.linear_fc1.layer_norm_weight", i),
                               sd[f"decoder.layers.{i}.pre_mlp_layernorm.weight"])
            if mixed and i == 1:  # the dense layer
                for name in ("linear_fc1.weight", "linear_fc2.weight"):
                    assert torch.equal(get("mlp." + name, i), sd[f"decoder.layers.{i}.mlp.{name}"])
                continue
            fc1 = get("mlp.experts.experts.linear_fc1.weight", i)
            assert fc1.shape == (4, 80, 48)
            for e in range(4):
                key = f"decoder.layers.{i}.mlp.experts.local_experts.{e}."
                assert torch.equal(fc1[e], sd[key + "linear_fc1.weight"])
                assert torch.equal(get("mlp.experts.experts.linear_fc2.weight", i)[e], sd[key + "linear_fc2.weight"])
            assert torch.equal(get("mlp.router.weight", i), sd[f"decoder.layers.{i}.mlp.router.weight"])
            if kind != "qwen3_moe":
                for name in ("gate_weight", "linear_fc1.weight", "linear_fc2.weight"):
                    assert torch.equal(get("mlp.shared_experts." + name, i),
                                       sd[f"decoder.layers.{i}.mlp.shared_experts.{name}"])
