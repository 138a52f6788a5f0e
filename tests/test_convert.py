"""Checkpoint conversion on disk: round trips, layouts, dtypes, the CLI, and bad input."""
import json
import os
import shutil
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

import pai_zoo
from pai_zoo.conversion.entry import convert
from pai_zoo.formats import mcore_dist
from pai_zoo.formats.hf_folder import SAFETENSORS_INDEX
from pai_zoo.plugin.errors import MappingError, PaiZooError, UnknownModelError
from pai_zoo.util.progress import Progress
from pai_zoo_conformance.cli_runs import run_cli
from pai_zoo_conformance.parallel_worker import layout_logits


def tensors(folder) -> dict:
    out = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(file))
    return out


def assert_identical(a: dict, b: dict):
    assert a.keys() == b.keys()
    for k in a:
        assert a[k].dtype == b[k].dtype and torch.equal(a[k], b[k]), k


def save_hf(folder, preset="llama3-tiny", seed=0, shard="200KB", **overrides) -> Path:
    handle = pai_zoo.load(preset, backend="hf", seed=seed, **overrides)
    handle.model.save_pretrained(folder, max_shard_size=shard)
    return Path(folder)


@pytest.fixture(scope="module")
def hf_folder(tmp_path_factory):
    return save_hf(tmp_path_factory.mktemp("src") / "hf")


def test_round_trip_is_bit_identical_and_megatron_loads_it(hf_folder, tmp_path):
    report = convert(hf_folder, tmp_path / "mcore", "mcore")
    assert report.tensors == 15 and report.family == "llama"
    mcore = tmp_path / "mcore"
    assert (mcore / "latest_checkpointed_iteration.txt").read_text() == "release"
    assert {p.name for p in (mcore / "release").iterdir()} >= {
        ".metadata",
        "common.pt",
        "metadata.json",
        "__0_0.distcp",
    }
    assert (mcore / "hf" / "config.json").is_file()
    convert(mcore, tmp_path / "back", "hf", max_shard_size="300KB")
    assert_identical(tensors(hf_folder), tensors(tmp_path / "back"))
    assert (tmp_path / "back" / SAFETENSORS_INDEX).is_file() and (
        tmp_path / "back" / "generation_config.json"
    ).is_file()
    # transformers loads the result, pai_zoo.load reads both outputs (mcore through megatron-core's loader).
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(tmp_path / "back")
    ids = torch.randint(0, 1000, (2, 9), generator=torch.Generator().manual_seed(1))
    expected = model(input_ids=ids).logits
    for handle in (
        pai_zoo.load(mcore),
        pai_zoo.load(mcore, backend="hf"),
        pai_zoo.load(tmp_path / "back", backend="mcore"),
    ):
        assert (handle.logits(ids) - expected).abs().max() <= 1e-4


def test_common_state_holds_megatron_lm_args(hf_folder, tmp_path):
    convert(hf_folder, tmp_path / "m", "mcore", tp=2, pp=2)
    common = torch.load(tmp_path / "m" / "release" / "common.pt", weights_only=False)
    args = common["args"]
    assert (args.num_layers, args.hidden_size, args.num_attention_heads, args.num_query_groups) == (2, 64, 4, 2)
    assert args.swiglu and args.untie_embeddings_and_output_weights and args.normalization == "RMSNorm"
    assert (args.tensor_model_parallel_size, args.pipeline_model_parallel_size, args.padded_vocab_size) == (2, 2, 1024)
    assert common["checkpoint_version"] == 3.0
    record = json.loads((tmp_path / "m" / "pai_zoo.json").read_text())
    assert record["tensor_parallel"] == 2 and record["pipeline_parallel"] == 2


def test_tp_layout_pads_the_vocabulary_for_that_tp_and_trims_back(tmp_path):
    src = save_hf(tmp_path / "hf", vocab_size=1100)  # 1152 rows for TP=1, 1280 for TP=2
    convert(src, tmp_path / "tp2", "mcore", tp=2)
    reader = mcore_dist.DistCheckpointReader(tmp_path / "tp2" / "release")
    assert reader.global_shape("embedding.word_embeddings.weight") == (1280, 64)
    assert not reader.read("embedding.word_embeddings.weight", (1100, 0), (180, 64)).any()
    convert(tmp_path / "tp2", tmp_path / "back", "hf")
    assert_identical(tensors(src), tensors(tmp_path / "back"))


def test_bf16_and_tied_embeddings(tmp_path):
    src = save_hf(tmp_path / "hf", tie_word_embeddings=True)
    assert "lm_head.weight" not in tensors(src)
    convert(src, tmp_path / "m", "mcore", dtype="bf16")
    reader = mcore_dist.DistCheckpointReader(tmp_path / "m" / "release")
    assert reader.dtype("decoder.layers.self_attention.linear_qkv.weight") == torch.bfloat16
    assert "output_layer.weight" not in reader.keys()
    convert(tmp_path / "m", tmp_path / "back", "hf")
    back = tensors(tmp_path / "back")
    assert_identical({k: v.to(torch.bfloat16) for k, v in tensors(src).items()}, back)
    assert json.loads((tmp_path / "back" / "config.json").read_text())["dtype"] == "bfloat16"
    convert(tmp_path / "m", tmp_path / "fp32", "hf", dtype="fp32")
    assert tensors(tmp_path / "fp32")["model.norm.weight"].dtype == torch.float32


@pytest.mark.parametrize("tp,pp", [(2, 1), (1, 2)])
def test_checkpoint_saved_by_megatron_with_any_layout_converts_back_bit_identical(hf_folder, tmp_path, tp, pp,
                                                                                  pai_zoo_workers):
    convert(hf_folder, tmp_path / "m", "mcore", tp=tp, pp=pp)
    # megatron-core's own dist_checkpointing.save from a tp x pp sharded model (2 gloo ranks), as training writes it
    pai_zoo_workers.run(layout_logits, str(tmp_path / "m"), [(tp, pp)], torch.tensor([[1, 2, 3]]),
                        save=str(tmp_path / "saved"))
    reader = mcore_dist.DistCheckpointReader(tmp_path / "saved" / "release")
    chunks = reader.metadata.state_dict_metadata["decoder.layers.self_attention.linear_qkv.weight"].chunks
    assert len(chunks) == 2 * tp  # one chunk per layer and tensor-parallel rank
    convert(tmp_path / "saved", tmp_path / "back", "hf")
    assert_identical(tensors(hf_folder), tensors(tmp_path / "back"))


def test_cli_convert_verify_and_force(hf_folder, tmp_path):
    dst = tmp_path / "m"
    proc = run_cli(["convert", str(hf_folder), str(dst), "--to", "mcore", "--verify"])
    assert proc.returncode == 0, proc.stderr
    assert "15 tensors" in proc.stdout and "next-token agreement = 100.0% (" in proc.stdout
    assert proc.stdout.rstrip().endswith(": OK")
    assert "\r" not in proc.stderr  # no progress bar in a pipe
    proc = run_cli(["convert", str(hf_folder), str(dst), "--to", "mcore"])
    assert proc.returncode == 1 and "exists; pass --force" in proc.stderr
    proc = run_cli(["convert", str(dst), str(tmp_path / "h"), "--to", "hf", "--verify"])
    assert proc.returncode == 0 and "OK" in proc.stdout, proc.stderr


def test_force_replaces_and_verify_fails_past_tolerance(hf_folder, tmp_path, monkeypatch):
    dst = tmp_path / "m"
    dst.mkdir()
    (dst / "stale.txt").write_text("old")
    with pytest.raises(PaiZooError, match="exists; pass --force"):
        convert(hf_folder, dst, "mcore")
    convert(hf_folder, dst, "mcore", force=True)
    assert not (dst / "stale.txt").exists() and (dst / "pai_zoo.json").is_file()
    report = convert(hf_folder, tmp_path / "m2", "mcore", verify=True, verify_tolerance="0")
    assert not report.ok and report.verification["max_abs_delta"] > 0.0


def test_progress_bar_shows_tensors_bytes_rate_and_eta():
    import io

    stream = io.StringIO()
    bar = Progress("hf -> mcore", 2000, totals={"tensors": 2}, enabled=True, stream=stream)
    bar.update(1000)
    bar.update(1000)
    bar.close()
    assert "2/2 tensors" in stream.getvalue() and "2.0 KB/2.0 KB" in stream.getvalue() and "/s" in stream.getvalue()
    assert "ETA 0s" in stream.getvalue()  # the time left, from the rate of the unit with a total
    quiet = io.StringIO()
    Progress("x", 1, stream=quiet).update(1)  # not a terminal: silent
    assert quiet.getvalue() == ""


# -- bad input: a clear error and nothing written ------------------------------------------------
def copy_of(src, dst) -> Path:
    shutil.copytree(src, dst)
    return Path(dst)


def assert_nothing_written(parent: Path, dst: Path):
    assert not dst.exists()
    assert not [p for p in parent.iterdir() if "pai-zoo-tmp" in p.name]


def test_missing_shard_named_in_the_index(hf_folder, tmp_path):
    src = copy_of(hf_folder, tmp_path / "src")
    shard = sorted(src.glob("model-*.safetensors"))[1]
    shard.unlink()
    with pytest.raises(PaiZooError, match=rf"shard files named in the index are missing: {shard.name}"):
        convert(src, tmp_path / "dst", "mcore")
    assert_nothing_written(tmp_path, tmp_path / "dst")


@pytest.mark.parametrize("damage", ["truncated", "header"])
def test_corrupt_safetensors(hf_folder, tmp_path, damage):
    src = copy_of(hf_folder, tmp_path / "src")
    shard = sorted(src.glob("model-*.safetensors"))[0]
    data = shard.read_bytes()
    shard.write_bytes(data[: len(data) // 2] if damage == "truncated" else data[:8] + b"{not json" + data[17:])
    with pytest.raises(PaiZooError, match=rf"{shard.name}: corrupt safetensors file"):
        convert(src, tmp_path / "dst", "mcore")
    assert_nothing_written(tmp_path, tmp_path / "dst")


def _rewrite_single(src: Path, dst: Path, edit) -> Path:
    dst.mkdir()
    state = tensors(src)
    edit(state)
    save_file(state, dst / "model.safetensors")
    shutil.copy2(src / "config.json", dst / "config.json")
    return dst


def test_tensor_of_the_wrong_shape(hf_folder, tmp_path):
    def edit(state):
        state["model.layers.1.mlp.down_proj.weight"] = torch.zeros(64, 100)

    src = _rewrite_single(hf_folder, tmp_path / "src", edit)
    with pytest.raises(
        MappingError,
        match=r"linear_fc2.weight: made from model.layers.1.mlp.down_proj.weight \(64, 100\).*needs \(64, 192\)",
    ):
        convert(src, tmp_path / "dst", "mcore")
    assert_nothing_written(tmp_path, tmp_path / "dst")


def test_unexpected_and_missing_names(hf_folder, tmp_path):
    def edit(state):
        state["model.layers.0.self_attn.rotary_emb.inv_freq"] = torch.zeros(8)
        del state["model.layers.0.self_attn.k_proj.weight"]

    src = _rewrite_single(hf_folder, tmp_path / "src", edit)
    with pytest.raises(MappingError) as err:
        convert(src, tmp_path / "dst", "mcore")
    assert "missing source tensors: model.layers.0.self_attn.k_proj.weight" in str(err.value)
    assert "source tensors no row consumes: model.layers.0.self_attn.rotary_emb.inv_freq" in str(err.value)
    assert_nothing_written(tmp_path, tmp_path / "dst")


def test_unknown_architecture_names_installed_families(tmp_path):
    (tmp_path / "src").mkdir()
    (tmp_path / "src" / "config.json").write_text(
        json.dumps({"architectures": ["MambaForCausalLM"], "model_type": "mamba"})
    )
    from pai_zoo.families.registry import get_registry

    installed = ", ".join(sorted(get_registry().families))
    with pytest.raises(UnknownModelError, match=r"MambaForCausalLM.*installed families: " + installed):
        convert(tmp_path / "src", tmp_path / "dst", "mcore")
    assert_nothing_written(tmp_path, tmp_path / "dst")


def test_pickle_checkpoints_load_weights_only(hf_folder, tmp_path):
    src = tmp_path / "bin"
    src.mkdir()
    shutil.copy2(hf_folder / "config.json", src / "config.json")
    torch.save(tensors(hf_folder), src / "pytorch_model.bin")
    convert(src, tmp_path / "m", "mcore")
    convert(tmp_path / "m", tmp_path / "back", "hf")
    assert_identical(tensors(hf_folder), tensors(tmp_path / "back"))

    class Payload:  # a pickle that would run code on load
        def __reduce__(self):
            return (os.system, ("echo pwned",))

    torch.save({"model.norm.weight": Payload()}, src / "pytorch_model.bin")
    with pytest.raises(PaiZooError, match=r"pytorch_model.bin: cannot be read as a weights-only pickle"):
        convert(src, tmp_path / "m2", "mcore")
    assert_nothing_written(tmp_path, tmp_path / "m2")


def test_interrupted_conversion_leaves_no_partial_output(hf_folder, tmp_path, monkeypatch):
    calls = []

    def failing_write(self, chunk, tensor):
        calls.append(chunk.key)
        if len(calls) == 5:
            raise KeyboardInterrupt

    monkeypatch.setattr(mcore_dist.DistCheckpointWriter, "write_chunk", failing_write)
    with pytest.raises(KeyboardInterrupt):
        convert(hf_folder, tmp_path / "dst", "mcore")
    assert len(calls) == 5  # the writes still queued on the background thread are skipped, not run
    assert_nothing_written(tmp_path, tmp_path / "dst")


def test_bad_megatron_checkpoints(hf_folder, tmp_path):
    with pytest.raises(PaiZooError, match="not a Megatron-Core checkpoint folder"):
        convert(hf_folder, tmp_path / "x", "hf")
    convert(hf_folder, tmp_path / "m", "mcore")
    (tmp_path / "m" / "pai_zoo.json").unlink()  # what is left is read as Megatron-LM reads it: from the args
    (tmp_path / "m" / "release" / "common.pt").unlink()
    with pytest.raises(PaiZooError, match=r"release: no common.pt and no common_state entry"):
        convert(tmp_path / "m", tmp_path / "x", "hf")
    convert(hf_folder, tmp_path / "m2", "mcore")
    (tmp_path / "m2" / "release" / "__0_0.distcp").write_bytes(b"")
    with pytest.raises(PaiZooError, match=r"__0_0.distcp: chunk .* is corrupt"):
        convert(tmp_path / "m2", tmp_path / "x", "hf")
    assert_nothing_written(tmp_path, tmp_path / "x")
    with pytest.raises(PaiZooError, match="does not divide the model's 2 layers"):
        convert(hf_folder, tmp_path / "x", "mcore", pp=3)


def test_background_writer_keeps_order_and_raises_errors():
    from pai_zoo.util.background import BackgroundWriter

    seen = []
    with BackgroundWriter(depth=1) as background:
        for i in range(20):
            background.submit(seen.append, i)
    assert seen == list(range(20))

    def boom(x):
        raise ValueError(f"cannot write {x}")

    background = BackgroundWriter()
    background.submit(boom, 1)
    with pytest.raises(ValueError, match="cannot write 1"):
        for i in range(100):
            background.submit(seen.append, i)
        background.close()


def test_an_rl_run_folder_converts_its_actor(hf_folder, tmp_path):
    """`convert runs/ppo --to hf` takes the run's actor/ (the trained policy), and says so."""
    convert(hf_folder, tmp_path / "m", "mcore")
    (tmp_path / "run").mkdir()
    shutil.copytree(tmp_path / "m", tmp_path / "run" / "actor")
    report = convert(tmp_path / "run", tmp_path / "hf", "hf")
    assert report.src == tmp_path / "run" / "actor" and "RL run folder" in report.notes[0]
    from pai_zoo.formats.hf_folder import HFCheckpoint

    assert sorted(HFCheckpoint(tmp_path / "hf").names()) == sorted(HFCheckpoint(hf_folder).names())


def test_convert_removes_a_killed_runs_staging_folder(hf_folder, tmp_path, capsys):
    import subprocess
    import sys

    from pai_zoo.cli import main

    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    stale = tmp_path / f".m.pai-zoo-tmp-{proc.pid}"  # what a SIGKILLed convert leaves
    (stale / "release").mkdir(parents=True)
    assert main(["convert", str(hf_folder), str(tmp_path / "m"), "--to", "mcore"]) == 0
    assert f"pai-zoo: removed {stale} left by an interrupted run (pid {proc.pid})" in capsys.readouterr().err
    assert sorted(os.listdir(tmp_path)) == ["m"]


def test_a_full_disk_during_convert_is_one_line_and_leaves_dst_as_it_was(hf_folder, tmp_path, capsys, monkeypatch):
    import errno

    from pai_zoo.cli import main

    dst = tmp_path / "m"
    dst.mkdir()
    (dst / "old.txt").write_text("old")
    real = mcore_dist.DistCheckpointWriter.write_chunk
    calls = []

    def full(self, chunk, tensor):
        calls.append(chunk)
        if len(calls) == 3:
            raise OSError(errno.ENOSPC, "No space left on device")
        real(self, chunk, tensor)

    monkeypatch.setattr(mcore_dist.DistCheckpointWriter, "write_chunk", full)
    assert main(["convert", str(hf_folder), str(dst), "--to", "mcore", "--force"]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert err.startswith("pai-zoo: error: no space left on device (mount point /")
    assert err.rstrip().endswith(f"free) writing {dst}; free space or choose another folder")
    assert sorted(os.listdir(tmp_path)) == ["m"] and os.listdir(dst) == ["old.txt"]


def test_convert_refuses_an_unwritable_dst_before_reading(hf_folder, tmp_path, capsys, monkeypatch):
    from pai_zoo.cli import main
    from pai_zoo.conversion import entry

    monkeypatch.setattr(entry, "hf_to_mcore", lambda *a, **k: pytest.fail("read before DST was checked"))
    monkeypatch.setattr("pai_zoo.util.outputs.shutil.disk_usage", lambda p: shutil._ntuple_diskusage(10, 10, 1000))
    assert main(["convert", str(hf_folder), str(tmp_path / "m"), "--to", "mcore"]) == 1
    err = capsys.readouterr().err
    assert err.startswith(f"pai-zoo: error: DST {tmp_path / 'm'}: not enough free space on "
                          f"{pai_zoo.util.outputs.mount_point(tmp_path)}: 1.0 kB free, about ")
    assert err.endswith(" kB needed; free space or choose another folder\n") and os.listdir(tmp_path) == []
