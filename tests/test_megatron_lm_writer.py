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

from pai_zoo.megatron_lm.files import allowing

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
