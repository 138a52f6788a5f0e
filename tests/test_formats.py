"""pai_zoo.formats (issue 42): one module per checkpoint format, one function that opens any of them.

- ``detect`` names each format from its marker files, and a folder no format fits is one line listing each format
  tried and why;
- every reader hands out plain tensors through one interface (names, shape, dtype, config, read, read_slice), the
  same values as the files hold;
- writers stage beside the destination and publish whole: a failed write leaves nothing, an existing folder is kept
  without force;
- ``pai_zoo.load`` of each format reads it in that format's module: the walk of the path through pai-zoo's modules
  (bench/load_trace.py) never goes back and forth between two format modules;
- no module outside pai_zoo/formats names a format's marker files.
"""
from __future__ import annotations

import json
import re
import sys
from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from pai_zoo import formats
from pai_zoo.formats import hf_folder, megatron_folder, peft_adapter
from pai_zoo.formats.base import FolderWriter
from pai_zoo.plugin.errors import PaiZooError

ROOT = Path(__file__).resolve().parents[1]
FIXTURES = ROOT.parent / "shared" / "megatron-lm-fixtures"
HAVE_FIXTURES = (FIXTURES / "llama-hf" / "model.safetensors").is_file()


def _touch(path: Path, text: str = "{}") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


# -- detection ----------------------------------------------------------------------------------------------------
@pytest.mark.no_megatron
def test_detect_names_each_format_from_its_markers(tmp_path):
    _touch(tmp_path / "hf" / "config.json")
    _touch(tmp_path / "peft" / "adapter_config.json")
    for name in ("mcore", "run", "lora"):
        _touch(tmp_path / name / "latest_checkpointed_iteration.txt", "release")
        (tmp_path / name / "release").mkdir()
        (tmp_path / name / "release" / ".metadata").write_bytes(b"")
        _touch(tmp_path / name / "pai_zoo.json")
    _touch(tmp_path / "run" / "train_config.json")
    _touch(tmp_path / "lora" / "lora.json")
    _touch(tmp_path / "rl" / "actor" / "latest_checkpointed_iteration.txt", "release")
    _touch(tmp_path / "dist" / "latest_checkpointed_iteration.txt", "3")
    _touch(tmp_path / "dist" / "iter_0000003" / ".metadata")
    _touch(tmp_path / "legacy" / "latest_checkpointed_iteration.txt", "release")
    _touch(tmp_path / "legacy" / "release" / "mp_rank_00" / "model_optim_rng.pt")
    found = {name: formats.detect(tmp_path / name) for name in
             ("hf", "peft", "mcore", "run", "lora", "rl", "dist", "legacy")}
    assert found == {"hf": "hf", "peft": "peft", "mcore": "mcore", "run": "run", "lora": "lora-run",
                     "rl": "rl-run", "dist": "megatron-lm", "legacy": "megatron-lm-legacy"}
    assert set(found.values()) == set(formats.FORMATS)
    # a pai-zoo folder read at another iteration is read as Megatron-LM's, from its args
    assert formats.detect(tmp_path / "mcore", iteration="release") == "megatron-lm"


@pytest.mark.no_megatron
def test_a_folder_no_format_fits_lists_each_format_tried(tmp_path):
    (tmp_path / "empty").mkdir()
    with pytest.raises(formats.UnknownFormatError) as caught:
        formats.detect(tmp_path / "empty")
    message = str(caught.value)
    assert "\n" not in message and message.startswith(f"{tmp_path / 'empty'}: not a checkpoint folder")
    for why in ("pai-zoo run (no lora.json", "PEFT adapter (no adapter_config.json)",
                "Megatron-Core or Megatron-LM (no latest_checkpointed_iteration.txt", "Hugging Face (no config.json)"):
        assert why in message
    with pytest.raises(PaiZooError, match="no such file or folder"):
        formats.detect(tmp_path / "missing")
    with pytest.raises(formats.UnknownFormatError, match="a file; a checkpoint is a folder"):
        formats.detect(_touch(tmp_path / "file.json"))


@pytest.mark.no_megatron
def test_a_damaged_megatron_folder_says_what_is_wrong_not_that_no_format_fits(tmp_path):
    _touch(tmp_path / "ckpt" / "latest_checkpointed_iteration.txt", "seven")
    with pytest.raises(megatron_folder.MegatronCheckpointError, match="expected 'release' or an iteration number"):
        formats.detect(tmp_path / "ckpt")
    _touch(tmp_path / "ckpt" / "latest_checkpointed_iteration.txt", "7")
    with pytest.raises(megatron_folder.MegatronCheckpointError, match="iteration 7 was not saved"):
        formats.detect(tmp_path / "ckpt")


# -- readers ------------------------------------------------------------------------------------------------------
def _hf_folder(tmp_path: Path) -> tuple[Path, dict]:
    tensors = {"a.weight": torch.randn(5, 3), "b.bias": torch.arange(7, dtype=torch.int64),
               "c.weight": torch.randn(2, 3, 4).to(torch.bfloat16)}
    folder = tmp_path / "hf"
    folder.mkdir()
    save_file({k: tensors[k] for k in ("a.weight", "b.bias")}, folder / "model-00001-of-00002.safetensors")
    save_file({"c.weight": tensors["c.weight"]}, folder / "model-00002-of-00002.safetensors")
    index = {"metadata": {}, "weight_map": {"a.weight": "model-00001-of-00002.safetensors",
                                           "b.bias": "model-00001-of-00002.safetensors",
                                           "c.weight": "model-00002-of-00002.safetensors"}}
    _touch(folder / "model.safetensors.index.json", json.dumps(index))
    _touch(folder / "config.json", json.dumps({"model_type": "llama"}))
    return folder, tensors


def test_the_hf_reader_hands_out_the_stored_tensors(tmp_path):
    folder, tensors = _hf_folder(tmp_path)
    with formats.open_checkpoint(folder) as reader:
        assert reader.format == "hf" and reader.config == {"model_type": "llama"}
        assert sorted(reader.names()) == sorted(tensors)
        for name, want in tensors.items():
            assert reader.shape(name) == tuple(want.shape) and reader.dtype(name) == want.dtype
            assert torch.equal(reader.read(name), want)
        assert torch.equal(reader.read_slice("c.weight", (1, 0, 2), (1, 3, 2)), tensors["c.weight"][1:2, :, 2:4])
        assert [f.name for f in reader.weight_files()] == ["model-00001-of-00002.safetensors",
                                                           "model-00002-of-00002.safetensors"]


def test_the_hf_reader_refuses_an_encoding_it_does_not_read_in_one_line(tmp_path):
    folder, _ = _hf_folder(tmp_path)
    _touch(folder / "config.json", json.dumps({"model_type": "llama", "quantization_config": {"quant_method": "awq"}}))
    with pytest.raises(PaiZooError) as caught:
        formats.open_checkpoint(folder)
    assert str(caught.value).startswith(f"{folder / 'config.json'}: quantization_config quant_method 'awq' is not "
                                        "supported")


def test_fp8_blocks_decode_on_the_hf_reader(tmp_path):
    """An FP8 block-scaled folder reads as plain tensors: the scales hidden, each weight ``q * scale_inv`` per
    128x128 block (the edge blocks partial), in the requested dtype."""
    from pai_zoo.formats.encodings.fp8_blocks import quantize

    weight = torch.randn(300, 200)
    q, inv = quantize(weight)
    folder = tmp_path / "fp8"
    folder.mkdir()
    save_file({"w.weight": q, "w.weight_scale_inv": inv, "n.weight": torch.ones(200, dtype=torch.bfloat16)},
              folder / "model.safetensors")
    quant = {"quant_method": "fp8", "fmt": "e4m3", "weight_block_size": [128, 128], "activation_scheme": "dynamic"}
    _touch(folder / "config.json", json.dumps({"model_type": "deepseek_v3", "quantization_config": quant}))
    with formats.open_checkpoint(folder, dtype=torch.float32) as reader:
        assert sorted(reader.names()) == ["n.weight", "w.weight"]
        got = reader.read("w.weight")
        assert got.dtype == torch.float32 and reader.dtype("w.weight") == torch.float32
        blocks = torch.repeat_interleave(torch.repeat_interleave(inv, 128, 0), 128, 1)[:300, :200]
        assert torch.equal(got, q.float() * blocks)
        assert torch.equal(reader.read_slice("w.weight", (128, 0), (172, 50)), got[128:, :50])


def _mcore_checkpoint(tmp_path: Path) -> tuple[Path, dict]:
    """A pai-zoo folder with a tensor stored as two chunks, as a TP=2 layout stores it."""
    from pai_zoo.formats.mcore_dist import DistCheckpointWriter
    from pai_zoo.mcore.dist_ckpt import Chunk

    folder = tmp_path / "mcore"
    whole = {"embedding.word_embeddings.weight": torch.randn(10, 4), "decoder.final_layernorm.weight": torch.randn(4)}
    writer = DistCheckpointWriter(folder / "release")
    emb = whole["embedding.word_embeddings.weight"]
    for start in (0, 5):
        writer.write_chunk(Chunk("e", (slice(start, start + 5),), "embedding.word_embeddings.weight", (start, 0),
                                 (5, 4), (10, 4)), emb[start:start + 5])
    writer.write_chunk(Chunk("n", (slice(0, 4),), "decoder.final_layernorm.weight", (0,), (4,), (4,)),
                       whole["decoder.final_layernorm.weight"])
    writer.finish({"args": None, "iteration": 0})
    _touch(folder / "latest_checkpointed_iteration.txt", "release")
    _touch(folder / "pai_zoo.json", json.dumps({"format": 1, "mcore_config": {}, "dtype": "float32"}))
    return folder, whole


def test_the_mcore_reader_joins_chunks_and_reads_regions(tmp_path):
    folder, whole = _mcore_checkpoint(tmp_path)
    with formats.open_checkpoint(folder) as reader:
        assert reader.format == "mcore" and reader.config["format"] == 1
        assert sorted(reader.names()) == sorted(whole)
        for name, want in whole.items():
            assert reader.shape(name) == tuple(want.shape) and torch.equal(reader.read(name), want)
        emb = whole["embedding.word_embeddings.weight"]
        assert torch.equal(reader.read_slice("embedding.word_embeddings.weight", (3, 1), (4, 2)), emb[3:7, 1:3])
        assert [f.name for f in reader.weight_files()] == [".metadata", "__0_0.distcp", "common.pt"]


@pytest.mark.no_megatron
def test_the_peft_reader(tmp_path):
    folder = tmp_path / "peft"
    folder.mkdir()
    tensors = {"base_model.model.model.layers.0.self_attn.q_proj.lora_A.weight": torch.randn(4, 8),
               "base_model.model.model.layers.0.self_attn.q_proj.lora_B.weight": torch.randn(8, 4)}
    save_file(tensors, folder / peft_adapter.PEFT_WEIGHTS)
    _touch(folder / peft_adapter.PEFT_CONFIG, json.dumps({"peft_type": "LORA", "r": 4}))
    with formats.open_checkpoint(folder) as reader:
        assert reader.format == "peft" and reader.config["r"] == 4
        assert sorted(reader.names()) == sorted(tensors)
        for name, want in tensors.items():
            assert reader.shape(name) == tuple(want.shape) and torch.equal(reader.read(name), want)


# -- writers ------------------------------------------------------------------------------------------------------
def test_the_hf_writer_publishes_whole_or_not_at_all(tmp_path):
    dst = tmp_path / "out"
    a, b = torch.randn(3, 4), torch.randn(6)
    writer = hf_folder.HFFolderWriter(dst)
    writer.plan([("a", (3, 4), torch.float32), ("b", (6,), torch.float32)], max_shard_size=60)
    writer.write("a", a)
    assert not dst.exists() and writer.staging.is_dir()  # nothing at the destination before close
    writer.write("b", b)
    hf_folder.write_config(writer.staging, {"model_type": "llama"})
    assert writer.close() == dst and not writer.staging.exists()
    with formats.open_checkpoint(dst) as reader:
        assert torch.equal(reader.read("a"), a) and torch.equal(reader.read("b"), b)
    assert (dst / "model.safetensors.index.json").is_file()  # two shards at 60 bytes

    with pytest.raises(PaiZooError, match=f"{dst} exists; pass --force to replace it"):
        hf_folder.HFFolderWriter(dst)
    broken = hf_folder.HFFolderWriter(dst, force=True)
    broken.plan([("a", (3, 4), torch.float32)])
    with pytest.raises(PaiZooError, match="planned tensors were never written: a"):
        broken.close()  # a tensor never written: nothing is published, the old folder stays
    assert not broken.staging.exists()
    with formats.open_checkpoint(dst) as reader:
        assert torch.equal(reader.read("a"), a)


@pytest.mark.no_megatron
def test_the_peft_writer_round_trips_through_the_peft_reader(tmp_path):
    tensors = {"base_model.model.model.layers.0.mlp.up_proj.lora_A.weight": torch.randn(2, 6),
               "base_model.model.model.layers.0.mlp.up_proj.lora_B.weight": torch.randn(9, 2)}
    dst = tmp_path / "adapter"
    with peft_adapter.PeftAdapterWriter(dst, {"peft_type": "LORA", "r": 2}) as writer:
        for name, tensor in tensors.items():
            writer.write(name, tensor)
        assert not dst.exists()
    with formats.open_checkpoint(dst) as reader:
        assert reader.format == "peft" and reader.config == {"peft_type": "LORA", "r": 2}
        assert all(torch.equal(reader.read(n), t) for n, t in tensors.items()) and len(reader.names()) == 2


@pytest.mark.no_megatron
def test_a_folder_writer_left_by_an_error_leaves_nothing(tmp_path):
    dst = tmp_path / "out"
    with pytest.raises(RuntimeError):
        with FolderWriter(dst) as writer:
            (writer.staging / "half").write_text("x")
            raise RuntimeError("killed")
    assert not dst.exists() and list(tmp_path.iterdir()) == []


# -- one home per format --------------------------------------------------------------------------------------------
#: The files that mark a format: only pai_zoo/formats reads them (other modules name them in messages at most).
MARKERS = ("latest_checkpointed_iteration.txt", "model.safetensors.index.json", "common.pt", "adapter_config.json",
           "pai_zoo.json", "train_config.json", "lora.json", ".metadata", "model_optim_rng.pt")


@pytest.mark.no_megatron
def test_no_module_outside_formats_opens_a_marker_file():
    """A marker file's name appears outside pai_zoo/formats only inside a string that is a message or a docstring,
    never as a path that code builds (``/ "pai_zoo.json"``, ``open("common.pt")``)."""
    found = []
    for path in sorted((ROOT / "pai_zoo").rglob("*.py")):
        if path.is_relative_to(ROOT / "pai_zoo" / "formats"):
            continue
        text = path.read_text()
        for marker in MARKERS:
            for m in re.finditer(r'(/|\(|=)\s*"' + re.escape(marker) + '"', text):
                found.append(f"{path.relative_to(ROOT)}:{text[:m.start()].count(chr(10)) + 1}: {marker}")
    assert not found, "code outside pai_zoo/formats builds a format's marker path:\n" + "\n".join(found)


def _walks(tmp_path: Path) -> dict[str, list[str]]:
    sys.path.insert(0, str(ROOT / "bench"))
    try:
        import load_trace
    finally:
        sys.path.pop(0)
    import pai_zoo

    walks = {}
    for name, (path, kwargs) in load_trace._fixtures(tmp_path, FIXTURES if HAVE_FIXTURES else None).items():
        root = kwargs.get("adapter", path)
        walks[name] = load_trace.trace(lambda: pai_zoo.load(path, **kwargs), root)
    return walks


#: The modules that read one format each (pai_zoo.formats and its helpers, megatron_folder and safe_pickle, are not).
FORMAT_MODULES = ("pai_zoo.formats.hf_folder", "pai_zoo.formats.encodings", "pai_zoo.formats.mcore_dist",
                  "pai_zoo.formats.megatron_legacy", "pai_zoo.formats.peft_adapter", "pai_zoo.formats.training_run")


@pytest.mark.megatron_once
def test_each_format_is_read_in_its_own_module(tmp_path):
    """``pai_zoo.load`` of each format: the format modules the walk visits are that format's own, and every stretch
    of the walk spent inside pai_zoo.formats visits one format module at most (no back and forth between two; the
    shared helpers, megatron_folder and safe_pickle, are no format's)."""
    walks = _walks(tmp_path)
    assert len(walks) == (5 if HAVE_FIXTURES else 3)
    own = {"hf": {"pai_zoo.formats.hf_folder", "pai_zoo.formats.encodings"},
           "mcore (pai-zoo)": {"pai_zoo.formats.mcore_dist"},
           "peft adapter (on hf)": {"pai_zoo.formats.peft_adapter"},
           "megatron-lm torch_dist": {"pai_zoo.formats.mcore_dist"},
           "megatron-lm legacy torch": {"pai_zoo.formats.megatron_legacy"}}
    for name, walk in walks.items():
        stretches, current = [], []
        for module in walk + [""]:
            if module.startswith("pai_zoo.formats"):
                current.append(module)
            elif current:
                stretches.append(current)
                current = []
        read = {m for s in stretches for m in s if m.startswith(FORMAT_MODULES)}
        assert read <= own[name], (name, walk)
        for stretch in stretches:
            visited = [m for m in stretch if m.startswith(FORMAT_MODULES)]
            # an encoding is the HF reader's decoder: part of reading an HF folder
            kinds = {"pai_zoo.formats.hf_folder" if m.startswith("pai_zoo.formats.encodings") else m for m in visited}
            assert len(kinds) <= 1, (name, stretch)
