"""``inspect`` verifies what it describes (issue 44, item 4): every file's size against its index or metadata
(safetensors headers and index, torch.distributed.checkpoint ``.metadata``, legacy ``model_optim_rng.pt`` zip
archives, ``.idx`` against ``.bin``), before anything is described; ``--deep`` reads every tensor and checks it is
finite. Each failure is exit 1, one line naming the file (and tensor), no traceback; a whole checkpoint still says
what it said before, plus what was checked.

The damaged checkpoints are refused before megatron-core or torch is imported, so these tests are megatron-free but
the one that describes a whole Megatron-Core checkpoint.
"""
from __future__ import annotations

import argparse
import json
import pickle
import shutil
import struct
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from pai_zoo.data.indexed import IndexedDatasetWriter
from pai_zoo.formats.integrity import deep_check, safetensors_entries, verify_checkpoint
from pai_zoo.plugin.errors import PaiZooError
from pai_zoo_conformance.cli_runs import main_result as run

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]  # tests/conftest.py

INCOMPLETE = "the checkpoint is incomplete (re-copy or re-save it)"




def one_line(code, out, err) -> str:
    """The single error line of a refused run (exit 1, nothing on stdout, no traceback)."""
    assert code == 1 and out == "" and "Traceback" not in err, (code, out, err)
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("pai-zoo: error: "), err
    return lines[0].removeprefix("pai-zoo: error: ")


def _truncate(file: Path, size: int) -> Path:
    with open(file, "r+b") as f:
        f.truncate(size)
    return file


@pytest.fixture(scope="module")
def hf(tmp_path_factory) -> Path:
    """llama3-tiny in 4 safetensors shards with its test tokenizer."""
    import pai_zoo
    from pai_zoo.tokenizers.names import bundled_tokenizer_folder

    folder = tmp_path_factory.mktemp("integrity") / "hf"
    handle = pai_zoo.load("llama3-tiny", backend="hf", seed=0)
    handle.model.save_pretrained(folder, max_shard_size="200KB")
    for file in bundled_tokenizer_folder(handle.family, "test").iterdir():
        shutil.copy(file, folder)
    return folder


@pytest.fixture
def copy(hf, tmp_path):
    def make(name="model"):
        return Path(shutil.copytree(hf, tmp_path / name))
    return make


def test_a_whole_folder_says_what_it_said_before_and_what_was_checked(hf, capsys):
    code, out, err = run(["inspect", hf], capsys)
    assert code == 0, err
    lines = out.splitlines()
    for line in (f"checkpoint:   {hf}", "format:       Hugging Face (safetensors)", "family:       llama",
                 "architecture:", "conversion:", "  needs nothing more",
                 "files:        4 safetensors files, sizes match their headers and the index (--deep also reads "
                 "the tensors)",
                 "tokenizer:    600 tokens, bos 1, eos 2: fits the model (vocab_size 1000)"):
        assert line in lines, (line, out)
    assert lines.index("family:       llama") < next(i for i, x in enumerate(lines) if x.startswith("files:"))
    code, out, err = run(["inspect", hf, "--deep"], capsys)
    assert code == 0 and "files:        4 safetensors files, whole; 21 tensors read, all finite (--deep)" in out


def test_a_truncated_shard_is_named(copy, capsys):
    folder = copy()
    shard = folder / "model-00002-of-00004.safetensors"
    need = shard.stat().st_size
    _truncate(shard, 1000)
    assert one_line(*run(["inspect", folder], capsys)) == (f"{shard}: truncated: 1000 bytes, its header needs "
                                                          f"{need}; {INCOMPLETE}")
    _truncate(shard, 5)  # not even the header's length
    assert one_line(*run(["inspect", folder], capsys)) == (f"{shard}: truncated: 5 bytes, the safetensors header "
                                                          f"length needs 8; {INCOMPLETE}")


def test_a_shard_longer_than_its_header_says_is_named(copy, capsys):
    folder = copy()
    shard = folder / "model-00001-of-00004.safetensors"
    size = shard.stat().st_size
    with open(shard, "ab") as f:
        f.write(b"\0" * 16)
    assert one_line(*run(["inspect", folder], capsys)) == (f"{shard}: {size + 16} bytes, its header describes "
                                                          f"{size}: not a whole safetensors file; {INCOMPLETE}")


def test_a_missing_shard_and_a_tensor_in_the_wrong_shard_are_named(copy, capsys):
    folder = copy()
    (folder / "model-00003-of-00004.safetensors").unlink()
    assert one_line(*run(["inspect", folder], capsys)) == (
        f"{folder / 'model-00003-of-00004.safetensors'}: missing: model.safetensors.index.json names it; {INCOMPLETE}")
    folder = copy("moved")
    index = folder / "model.safetensors.index.json"
    record = json.loads(index.read_text())
    name, shard = next((n, s) for n, s in record["weight_map"].items() if s.startswith("model-00001"))
    record["weight_map"][name] = "model-00004-of-00004.safetensors"
    index.write_text(json.dumps(record))
    assert one_line(*run(["inspect", folder], capsys)) == (
        f"{index}: tensor {name} is not in model-00004-of-00004.safetensors, the shard the index names for it; "
        f"{INCOMPLETE}")


def test_a_nan_tensor_is_named_with_deep_and_not_read_without(copy, capsys):
    folder = copy()
    shard = folder / "model-00004-of-00004.safetensors"
    name, (dtype, shape, start, end) = next((n, e) for n, e in safetensors_entries(shard).items()
                                            if e[0] == "F32" and e[3] - e[2] >= 8)
    with open(shard, "r+b") as f:
        f.seek(start + 4)
        f.write(struct.pack("<f", float("nan")))
    code, out, err = run(["inspect", folder], capsys)
    assert code == 0 and "needs nothing more" in out, err  # the sizes are right: only --deep reads the values
    count = int(np.prod(shape))
    assert one_line(*run(["inspect", folder, "--deep"], capsys)) == (
        f"{shard}: tensor {name} holds 1 non-finite values (NaN or inf) of {count}; the checkpoint is damaged "
        "(re-save it from a good copy)")


# -- Megatron-Core torch_dist --------------------------------------------------------------------------------------
def Chunk(name, local_slice, key, offsets, sizes, global_shape):  # noqa: N802 - pai_zoo.mcore.dist_ckpt.Chunk's fields
    """The fields of a chunk that DistCheckpointWriter reads (pai_zoo.mcore.dist_ckpt imports megatron-core)."""
    return SimpleNamespace(name=name, local_slice=local_slice, key=key, offsets=offsets, sizes=sizes,
                           global_shape=global_shape)


@pytest.fixture
def dist(tmp_path) -> Path:
    """A pai-zoo Megatron-Core folder written by the project's own writer (torch only): one tensor in two chunks."""
    import torch

    from pai_zoo.formats.mcore_dist import DistCheckpointWriter

    folder = tmp_path / "mcore"
    writer = DistCheckpointWriter(folder / "release")
    emb = torch.randn(10, 4)
    for start in (0, 5):
        writer.write_chunk(Chunk("e", (slice(start, start + 5),), "embedding.word_embeddings.weight", (start, 0),
                                 (5, 4), (10, 4)), emb[start:start + 5])
    writer.write_chunk(Chunk("n", (slice(0, 4),), "decoder.final_layernorm.weight", (0,), (4,), (4,)), torch.ones(4))
    writer.finish({"args": None, "iteration": 0})
    (folder / "latest_checkpointed_iteration.txt").write_text("release")
    (folder / "pai_zoo.json").write_text(json.dumps({"format": 1, "mcore_config": {}, "dtype": "float32"}))
    return folder


def test_a_truncated_or_missing_distcp_is_named_never_needs_nothing_more(dist, capsys):
    assert verify_checkpoint(dist, "mcore").line() == ("3 torch_dist files, sizes match the .metadata (--deep also "
                                                       "reads the tensors)")
    data = dist / "release" / "__0_0.distcp"
    need = data.stat().st_size
    _truncate(data, 1234)
    assert one_line(*run(["inspect", dist], capsys)) == (f"{data}: truncated: 1234 bytes, the metadata needs {need}; "
                                                        f"{INCOMPLETE}")
    data.unlink()
    assert one_line(*run(["inspect", dist], capsys)) == (f"{data}: missing: {dist / 'release' / '.metadata'} names "
                                                        f"it; {INCOMPLETE}")


@pytest.mark.parametrize("argv", [["generate", "--model", "{m}", "--prompt", "hi"], ["eval", "{m}", "--data", "{m}/x"]])
def test_commands_that_load_a_model_name_a_truncated_file_before_loading(dist, argv, capsys):
    """pai_zoo.load's resolve checks the files as inspect does: generate, eval, train and rl name the file."""
    data = _truncate(dist / "release" / "__0_0.distcp", 99)
    with IndexedDatasetWriter(dist / "x", np.uint16) as writer:  # eval's --data exists: the model is what is wrong
        writer.add_document([1, 2, 3])
    assert one_line(*run([a.format(m=dist) for a in argv], capsys)).startswith(f"{data}: truncated: 99 bytes, the "
                                                                               "metadata needs ")


def test_a_damaged_or_hostile_metadata_is_refused_without_running_it(dist, tmp_path, capsys):
    metadata = dist / "release" / ".metadata"
    _truncate(metadata, metadata.stat().st_size // 2)
    line = one_line(*run(["inspect", dist], capsys))
    assert line.startswith(f"{metadata}: truncated or corrupt torch.distributed.checkpoint metadata (")
    assert line.endswith(INCOMPLETE)

    class Hostile:
        def __reduce__(self):
            return (Path.touch, (tmp_path / "ran",))

    metadata.write_bytes(pickle.dumps(Hostile()))
    assert one_line(*run(["inspect", dist], capsys)) == (
        f"{metadata}: truncated or corrupt torch.distributed.checkpoint metadata (UnpicklingError: it names "
        f"pathlib.Path.touch, which a torch.distributed.checkpoint .metadata file never holds); {INCOMPLETE}")
    assert not (tmp_path / "ran").exists()


def test_deep_reads_every_chunk_of_a_dist_checkpoint_and_names_a_non_finite_one(dist):
    import torch

    from pai_zoo.formats.mcore_dist import DistCheckpointWriter

    assert deep_check(dist, "mcore") == 2
    bad = dist.parent / "bad"
    writer = DistCheckpointWriter(bad / "release")
    writer.write_chunk(Chunk("n", (slice(0, 4),), "decoder.final_layernorm.weight", (0,), (4,), (4,)),
                       torch.tensor([1.0, float("inf"), 2.0, float("nan")]))
    writer.finish({"args": None, "iteration": 0})
    (bad / "latest_checkpointed_iteration.txt").write_text("release")
    with pytest.raises(PaiZooError, match=r"__0_0.distcp: tensor decoder.final_layernorm.weight holds 2 non-finite "
                                        r"values \(NaN or inf\) of 4"):
        deep_check(bad, "mcore")


# -- Megatron-LM legacy --------------------------------------------------------------------------------------------
def _legacy(root: Path, ranks=("mp_rank_00",)) -> Path:
    import torch

    for rank in ranks:
        (root / "iter_0000001" / rank).mkdir(parents=True)
        torch.save({"model": {"embedding.word_embeddings.weight": torch.randn(8, 4)}, "iteration": 1,
                    "args": argparse.Namespace(num_layers=1)}, root / "iter_0000001" / rank / "model_optim_rng.pt")
    (root / "latest_checkpointed_iteration.txt").write_text("1")
    return root


def test_a_truncated_legacy_rank_file_or_a_missing_rank_is_named(tmp_path, capsys):
    root = _legacy(tmp_path / "legacy")
    assert verify_checkpoint(root, "megatron-lm-legacy").files == 1 and deep_check(root, "megatron-lm-legacy") == 1
    file = root / "iter_0000001" / "mp_rank_00" / "model_optim_rng.pt"
    size = file.stat().st_size
    _truncate(file, size - 100)  # the zip's central directory is at the end
    line = one_line(*run(["inspect", root], capsys))
    assert line.startswith(f"{file}: truncated or corrupt: {size - 100} bytes, not a whole zip archive (")
    assert line.endswith(INCOMPLETE)
    grid = _legacy(tmp_path / "grid", ranks=("mp_rank_00", "mp_rank_02"))  # tensor-parallel rank 1 is missing
    assert one_line(*run(["inspect", grid], capsys)) == (
        f"{grid / 'iter_0000001' / 'mp_rank_01' / 'model_optim_rng.pt'}: missing: the rank grid of "
        f"{grid / 'iter_0000001'} (3 x 1 x 1 rank folders) names it; {INCOMPLETE}")


# -- datasets: .idx against .bin -----------------------------------------------------------------------------------
def test_dataset_inspect_names_a_short_or_missing_bin(tmp_path, capsys):
    with IndexedDatasetWriter(tmp_path / "data", np.uint16) as writer:
        for i in range(5):
            writer.add_document(list(range(i, i + 7)))
    bin_file, idx_file = tmp_path / "data.bin", tmp_path / "data.idx"
    _truncate(bin_file, 50)
    assert one_line(*run(["dataset", "inspect", tmp_path / "data"], capsys)) == (
        f"{bin_file}: truncated: 50 bytes, but {idx_file} says 70")
    bin_file.unlink()
    code, out, err = run(["dataset", "inspect", tmp_path / "data"], capsys)
    assert code == 1 and "Traceback" not in err
    assert err.startswith(f"pai-zoo: error: no such file or folder: {bin_file} ")


@pytest.mark.megatron  # describing a Megatron-Core checkpoint builds its layout with megatron-core
def test_a_whole_converted_checkpoint_is_described_checked_and_read(hf, tmp_path, capsys):
    from pai_zoo.conversion.entry import convert

    convert(hf, tmp_path / "mcore", "mcore")
    code, out, err = run(["inspect", tmp_path / "mcore", "--deep"], capsys)
    assert code == 0, err
    lines = out.splitlines()
    for line in ("format:       torch_dist (written by pai-zoo)", "family:       llama", "  needs nothing more",
                 "files:        3 torch_dist files, whole; 9 tensors read, all finite (--deep)",
                 "tokenizer:    600 tokens, bos 1, eos 2: fits the model (vocab_size 1000)"):
        assert line in lines, (line, out)
    data = tmp_path / "mcore" / "release" / "__0_0.distcp"
    need = data.stat().st_size
    _truncate(data, need - 1)
    assert one_line(*run(["inspect", tmp_path / "mcore"], capsys)) == (
        f"{data}: truncated: {need - 1} bytes, the metadata needs {need}; {INCOMPLETE}")
