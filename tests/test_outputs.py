"""The one rule for outputs (pai_zoo.util.outputs): temporary names, --force, stale temporaries, nothing left on
failure, one line for a full disk or a read-only mount."""
from __future__ import annotations

import errno
import os
import subprocess
import sys

import pytest

from pai_zoo.plugin.errors import PaiZooError
from pai_zoo.util import outputs
from pai_zoo.util.outputs import (
    Output,
    check_output,
    clear_stale,
    disk_error,
    output_file,
    output_files,
    output_folder,
    stale_temporaries,
    temporary_name,
)
from pai_zoo_conformance.cli_runs import main_result as cli

pytestmark = pytest.mark.no_megatron


@pytest.fixture(scope="module")
def dead_pid() -> int:
    """The PID of a process that has exited."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_temporary_name(tmp_path):
    assert temporary_name(tmp_path / "out.jsonl") == tmp_path / f".out.jsonl.pai-zoo-tmp-{os.getpid()}"


def test_stale_temporaries_are_those_of_dead_processes(tmp_path, dead_pid, capsys):
    dest = tmp_path / "model"
    stale = tmp_path / f".model.pai-zoo-tmp-{dead_pid}"
    (stale / "sub").mkdir(parents=True)
    live = tmp_path / f".model.pai-zoo-tmp-{os.getppid()}"  # a live process's: left alone
    live.write_text("x")
    other = tmp_path / f".model2.pai-zoo-tmp-{dead_pid}"  # another destination's: left alone
    other.write_text("x")
    assert stale_temporaries(dest) == [stale]
    assert clear_stale(dest) == [stale]
    assert not stale.exists() and live.exists() and other.exists()
    assert capsys.readouterr().err == f"pai-zoo: removed {stale} left by an interrupted run (pid {dead_pid})\n"


def test_check_output_refuses_an_existing_destination(tmp_path):
    (tmp_path / "out.jsonl").write_text("old")
    with pytest.raises(PaiZooError, match=r"out.jsonl exists; pass --force to replace it$"):
        check_output(tmp_path / "out.jsonl")
    assert check_output(tmp_path / "out.jsonl", force=True) == tmp_path / "out.jsonl"
    (tmp_path / "folder").mkdir()
    with pytest.raises(PaiZooError, match="--output .*folder is a folder; give a file name"):
        check_output(tmp_path / "folder", force=True)
    assert sorted(os.listdir(tmp_path)) == ["folder", "out.jsonl"]


def test_check_output_clears_stale_and_leaves_no_probe(tmp_path, dead_pid, capsys):
    stale = tmp_path / f".out.pai-zoo-tmp-{dead_pid}"
    stale.write_text("half")
    check_output(tmp_path / "out", kind="folder", flag="DST")
    assert os.listdir(tmp_path) == []
    assert f"removed {stale} left by an interrupted run (pid {dead_pid})" in capsys.readouterr().err
    check_output(tmp_path / "new" / "deeper" / "out")  # missing folders: probed in the nearest existing one
    assert os.listdir(tmp_path) == []


def test_check_output_refuses_an_unwritable_folder(tmp_path, monkeypatch):
    real_open = os.open

    def read_only(path, flags, *args):
        if str(path).startswith(str(tmp_path)) and flags & os.O_CREAT:
            raise OSError(errno.EROFS, "Read-only file system", str(path))
        return real_open(path, flags, *args)

    monkeypatch.setattr(outputs.os, "open", read_only)
    with pytest.raises(PaiZooError, match=rf"--save {tmp_path}/run: cannot write in {tmp_path} "
                                          r"\(read-only file system, mount point /"):
        check_output(tmp_path / "run", kind="folder", flag="--save")


def test_check_output_free_space(tmp_path):
    check_output(tmp_path / "out", need_bytes=1)
    with pytest.raises(PaiZooError, match=r"--output .*/out: not enough free space on /.*: .* free, about "
                                          r"1000\.0 TB needed; free space or choose another folder"):
        check_output(tmp_path / "out", need_bytes=10**15)


def test_output_file_publishes_and_refuses(tmp_path):
    dest = tmp_path / "out.txt"
    with output_file(dest) as tmp:
        assert tmp == temporary_name(dest) and not dest.exists()
        tmp.write_text("one")
    assert dest.read_text() == "one"
    with pytest.raises(PaiZooError, match="exists; pass --force"):
        with output_file(dest):
            raise AssertionError("not reached")
    with output_file(dest, force=True) as tmp:
        tmp.write_text("two")
    assert dest.read_text() == "two" and os.listdir(tmp_path) == ["out.txt"]


@pytest.mark.parametrize("error", [RuntimeError("boom"), KeyboardInterrupt()])
def test_a_failure_leaves_nothing(tmp_path, error):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "f").write_text("old")
    with pytest.raises(type(error)):
        with output_folder(tmp_path / "old", force=True) as tmp:
            (tmp / "f").write_text("new")
            raise error
    with pytest.raises(type(error)):
        with output_file(tmp_path / "made" / "deep" / "x") as tmp:
            tmp.write_text("new")
            raise error
    assert os.listdir(tmp_path) == ["old"] and (tmp_path / "old" / "f").read_text() == "old"


def test_output_folder_replaces_only_when_complete(tmp_path):
    (tmp_path / "ckpt").mkdir()
    (tmp_path / "ckpt" / "stale.bin").write_text("x")
    with output_folder(tmp_path / "ckpt", force=True) as tmp:
        (tmp / "new.bin").write_text("y")
        assert (tmp_path / "ckpt" / "stale.bin").exists()
    assert os.listdir(tmp_path / "ckpt") == ["new.bin"] and os.listdir(tmp_path) == ["ckpt"]


def test_output_files_publishes_together(tmp_path):
    names = [tmp_path / "d.bin", tmp_path / "d.idx"]
    names[1].write_text("old")
    with pytest.raises(PaiZooError, match="d.idx exists"):
        with output_files(names):
            pass
    assert sorted(os.listdir(tmp_path)) == ["d.idx"]
    with output_files(names, force=True) as tmps:
        for tmp in tmps:
            tmp.write_text("new")
    assert [n.read_text() for n in names] == ["new", "new"] and len(os.listdir(tmp_path)) == 2


def test_disk_errors_become_one_line(tmp_path):
    dest = tmp_path / "out"
    tmp = temporary_name(dest) / "model.safetensors"
    error = disk_error(OSError(errno.ENOSPC, "No space left on device", str(tmp)), dest)
    text = str(error)
    assert text.startswith("no space left on device (mount point /") and "\n" not in text
    assert text.endswith(f"free) writing {dest}/model.safetensors; free space or choose another folder")
    assert disk_error(ValueError("other"), dest) is None
    # wrapped: safetensors' Rust text, a chained cause, torch.distributed.checkpoint's per-rank failures
    rust = disk_error(Exception("Error while serializing: IoError(Os { code: 28, kind: StorageFull, message: "
                                "\"No space left on device\" }) (os error 28)"), dest)
    assert str(rust).startswith("no space left on device") and f"writing {dest};" in str(rust)

    class CheckpointException(BaseException):
        def __init__(self, msg, failures):
            super().__init__(msg, failures)
            self.failures = failures

    wrapped = CheckpointException("CheckpointException ranks:dict_keys([0])",
                                  {0: (OSError(errno.EDQUOT, "Disk quota exceeded", "/q/f"), None)})
    assert str(disk_error(wrapped)).startswith("disk quota exceeded (mount point /")
    try:
        try:
            raise OSError(errno.EROFS, "Read-only file system")
        except OSError as exc:
            raise RuntimeError("save failed") from exc
    except RuntimeError as exc:
        assert str(disk_error(exc, dest)) == f"read-only file system (mount point {outputs.mount_point(dest)}) " \
                                             f"writing {dest}; choose another folder"


def test_enospc_inside_an_output_removes_it(tmp_path):
    dest = tmp_path / "ckpt"
    with pytest.raises(PaiZooError, match=rf"^no space left on device .* writing {dest}/w; free space"):
        with output_folder(dest) as tmp:
            (tmp / "w").write_text("partial")
            raise OSError(errno.ENOSPC, "No space left on device", str(tmp / "w"))
    assert os.listdir(tmp_path) == []


def test_output_class_for_a_writer_that_is_no_block(tmp_path, dead_pid, capsys):
    (tmp_path / f".w.pai-zoo-tmp-{dead_pid}").mkdir()
    out = Output(tmp_path / "w", folder=True)
    assert out.tmp.is_dir() and f"(pid {dead_pid})" in capsys.readouterr().err
    out.discard()
    assert os.listdir(tmp_path) == []


# -- the commands: an existing output refused (and replaced with --force), a killed run's temporary removed and
#    named, a read-only folder refused before anything loads, a full disk as one line leaving nothing ---------------


def one_error_line(err: str) -> str:
    lines = [line for line in err.splitlines() if line.startswith("pai-zoo: error:")]
    assert len(lines) == 1 and "Traceback" not in err, err
    return lines[0]


@pytest.fixture
def jsonl(tmp_path):
    path = tmp_path / "in" / "docs.jsonl"
    path.parent.mkdir()
    path.write_text("".join(f'{{"text": "document number {i}"}}\n' for i in range(5)))
    return path


@pytest.fixture
def no_loading(monkeypatch):
    """Fails a test that loads a tokenizer or a model (the output check comes first)."""
    from pai_zoo.tokenizers import names

    def refuse(*args, **kwargs):
        raise AssertionError("loaded before the output was checked")

    monkeypatch.setattr(names, "resolve_tokenizer", refuse)
    import pai_zoo.data.preprocess as preprocess_module

    monkeypatch.setattr(preprocess_module, "resolve_tokenizer", refuse)
    for module in ("pai_zoo.cli.generate", "pai_zoo.cli.eval"):
        monkeypatch.setattr(f"{module}.load", refuse)
    monkeypatch.setattr("pai_zoo.cli.eval.resolve", refuse)


def read_only(monkeypatch, folder):
    """Make ``folder`` behave as a read-only mount for creating files and folders (root ignores file modes)."""
    real_open, real_mkdir = os.open, os.mkdir

    def guard(path):
        if str(os.path.abspath(path)).startswith(str(folder)):
            raise OSError(errno.EROFS, "Read-only file system", str(path))

    monkeypatch.setattr(outputs.os, "open", lambda p, flags, *a: (guard(p) if flags & os.O_CREAT else None,
                                                                   real_open(p, flags, *a))[1])
    monkeypatch.setattr(os, "mkdir", lambda p, *a, **k: (guard(p), real_mkdir(p, *a, **k))[1])


@pytest.mark.usefixtures("fresh_registry")
def test_preprocess_refuses_an_existing_prefix_and_clears_a_killed_runs_temporaries(tmp_path, jsonl, capsys,
                                                                                   dead_pid):
    prefix = tmp_path / "out"
    argv = ["preprocess", "--input", jsonl, "--output-prefix", prefix, "--tokenizer", "llama3-tiny"]
    stale = tmp_path / f".out_text_document.bin.pai-zoo-tmp-{dead_pid}-0123abcd"
    legacy = tmp_path / f"out_text_document.idx.tmp-{dead_pid}-0123abcd"  # an earlier version's name
    stale.write_bytes(b"half")
    legacy.write_bytes(b"half")
    code, out, err = cli(argv, capsys)
    assert code == 0, err
    assert f"pai-zoo: removed {stale} left by an interrupted run (pid {dead_pid})" in err
    assert f"pai-zoo: removed {legacy} left by an interrupted run (pid {dead_pid})" in err
    names = sorted(os.listdir(tmp_path))
    assert names == ["in", "out_text_document.bin", "out_text_document.idx", "out_text_document.json"]
    before = (tmp_path / "out_text_document.bin").read_bytes()
    code, out, err = cli(argv, capsys)
    assert code == 1 and one_error_line(err) == \
        f"pai-zoo: error: {prefix}_text_document.bin exists; pass --force to replace it"
    code, out, err = cli([*argv, "--force"], capsys)
    assert code == 0 and sorted(os.listdir(tmp_path)) == names
    assert (tmp_path / "out_text_document.bin").read_bytes() == before


@pytest.mark.usefixtures("fresh_registry", "no_loading")
def test_existing_outputs_are_refused_before_anything_loads(tmp_path, jsonl, capsys):
    (tmp_path / "d_text_document.idx").write_bytes(b"old")
    (tmp_path / "merged.bin").write_bytes(b"old")
    (tmp_path / "out.jsonl").write_text("old")
    (tmp_path / "out.json").write_text("old")
    (tmp_path / "vision").mkdir()
    (tmp_path / "pai-zoo-myarch").mkdir()
    cases = {
        "preprocess": (["preprocess", "--input", jsonl, "--output-prefix", tmp_path / "d", "--tokenizer", "x"],
                       tmp_path / "d_text_document.idx"),
        "dataset merge": (["dataset", "merge", tmp_path / "a", tmp_path / "b", "--output-prefix", tmp_path / "merged"],
                          tmp_path / "merged.bin"),
        "dataset prepare": (["dataset", "prepare", jsonl, "--output", tmp_path / "vision"], tmp_path / "vision"),
        "generate": (["generate", "--model", "llama3-tiny", "--prompts", jsonl, "--output", tmp_path / "out.jsonl"],
                     tmp_path / "out.jsonl"),
        "eval": (["eval", "llama3-tiny", "--data", tmp_path / "d", "--output", tmp_path / "out.json"],
                 tmp_path / "out.json"),
        "plugin new": (["plugin", "new", "myarch", "--from-config", "x", "--output", tmp_path / "pai-zoo-myarch"],
                       tmp_path / "pai-zoo-myarch"),
    }
    before = sorted(os.listdir(tmp_path))
    for name, (argv, dest) in cases.items():
        code, out, err = cli(argv, capsys)
        assert code == 1 and one_error_line(err) == f"pai-zoo: error: {dest} exists; pass --force to replace it", \
            (name, err)
    assert sorted(os.listdir(tmp_path)) == before and (tmp_path / "out.json").read_text() == "old"


@pytest.mark.usefixtures("fresh_registry", "no_loading")
def test_a_read_only_output_is_refused_before_anything_loads(tmp_path, jsonl, capsys, monkeypatch):
    ro = tmp_path / "ro"
    ro.mkdir()
    read_only(monkeypatch, ro)
    cases = {
        "preprocess": (["preprocess", "--input", jsonl, "--output-prefix", ro / "d", "--tokenizer", "x"],
                       "--output-prefix", ro / "d_text_document.bin"),
        "preprocess --sft": (["preprocess", "--sft", "--input", jsonl, "--output-prefix", ro / "d", "--tokenizer",
                              "x"], "--output-prefix", ro / "d_text_document.bin"),
        "dataset merge": (["dataset", "merge", tmp_path / "a", "--output-prefix", ro / "m"], "--output-prefix",
                          ro / "m.bin"),
        "dataset prepare": (["dataset", "prepare", jsonl, "--output", ro / "v"], "--output", ro / "v"),
        "generate": (["generate", "--model", "llama3-tiny", "--prompts", jsonl, "--output", ro / "o.jsonl"],
                     "--output", ro / "o.jsonl"),
        "eval": (["eval", "llama3-tiny", "--data", tmp_path / "d", "--output", ro / "sub" / "o.json"], "--output",
                 ro / "sub" / "o.json"),
        "plugin new": (["plugin", "new", "myarch", "--from-config", "x", "--output", ro / "p"], "--output", ro / "p"),
    }
    for name, (argv, flag, dest) in cases.items():
        code, out, err = cli(argv, capsys)
        line = one_error_line(err)
        assert code == 1 and line.startswith(f"pai-zoo: error: {flag} {dest}: cannot write in {ro} (read-only "
                                             "file system, mount point /"), (name, err)
    monkeypatch.undo()
    assert os.listdir(ro) == []


@pytest.mark.usefixtures("fresh_registry")
def test_a_full_disk_during_preprocess_is_one_line_and_leaves_nothing(tmp_path, jsonl, capsys, monkeypatch):
    from pai_zoo.data.indexed import writer

    (tmp_path / "d_text_document.bin").write_bytes(b"old")
    (tmp_path / "d_text_document.idx").write_bytes(b"old")

    def full(self):
        raise OSError(errno.ENOSPC, "No space left on device", self._idx_tmp)

    monkeypatch.setattr(writer.IndexedDatasetWriter, "_write_sidecar", full)
    code, out, err = cli(["preprocess", "--input", jsonl, "--output-prefix", tmp_path / "d", "--tokenizer",
                          "llama3-tiny", "--force"], capsys)
    line = one_error_line(err)
    assert code == 1 and line.startswith("pai-zoo: error: no space left on device (mount point /")
    assert line.endswith(f"free) writing {tmp_path}/d_text_document.idx; free space or choose another folder")
    assert sorted(os.listdir(tmp_path)) == ["d_text_document.bin", "d_text_document.idx", "in"]
    assert (tmp_path / "d_text_document.bin").read_bytes() == b"old"


def test_main_turns_a_wrapped_full_disk_into_one_line(monkeypatch, capsys):
    class CheckpointException(BaseException):  # as torch.distributed.checkpoint's: a BaseException, per-rank failures
        def __init__(self, failures):
            super().__init__("CheckpointException ranks:dict_keys([0])\nTraceback ...\n" * 20)
            self.failures = failures

    def full(args):
        raise CheckpointException({0: (OSError(errno.ENOSPC, "No space left on device", "/ckpt/__0_0.distcp"), [])})

    monkeypatch.setattr("pai_zoo.cli.list.run", full)
    code, out, err = cli(["list"], capsys)
    assert code == 1 and err.startswith("pai-zoo: error: no space left on device (mount point /")
    assert err.endswith("free) writing /ckpt/__0_0.distcp; free space or choose another folder\n")

    def bug(args):
        raise CheckpointException({0: (ValueError("a bug"), [])})

    monkeypatch.setattr("pai_zoo.cli.list.run", bug)
    with pytest.raises(CheckpointException):  # anything else stays a traceback
        cli(["list"], capsys)


@pytest.mark.usefixtures("fresh_registry")
def test_dataset_merge_replaces_only_with_force(tmp_path, capsys):
    import numpy as np

    from pai_zoo.data.indexed import IndexedDatasetReader, IndexedDatasetWriter

    for name, tokens in (("a", [1, 2]), ("b", [3])):
        with IndexedDatasetWriter(tmp_path / name, np.int32) as writer:
            writer.add_document(tokens)
    argv = ["dataset", "merge", tmp_path / "a", tmp_path / "b", "--output-prefix", tmp_path / "m"]
    assert cli(argv, capsys)[0] == 0
    (tmp_path / "m.bin").write_bytes(b"changed")
    code, out, err = cli(argv, capsys)
    assert code == 1 and one_error_line(err) == f"pai-zoo: error: {tmp_path}/m.bin exists; pass --force to replace it"
    assert (tmp_path / "m.bin").read_bytes() == b"changed"
    assert cli([*argv, "--force"], capsys)[0] == 0
    with IndexedDatasetReader(tmp_path / "m") as reader:
        assert [list(reader[i]) for i in range(len(reader))] == [[1, 2], [3]]
    assert not [p for p in os.listdir(tmp_path) if "pai-zoo-tmp" in p]


def test_errors_name_the_destination_not_its_temporary(tmp_path):
    from pai_zoo.cli import describe

    tmp = temporary_name(tmp_path / "out.json")
    assert describe(PermissionError(errno.EACCES, "Permission denied", str(tmp))) == \
        (f"permission denied: {tmp_path}/out.json", None)


def test_a_killed_child_not_yet_reaped_counts_as_dead(tmp_path):
    import signal
    import time

    proc = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)"])
    try:
        (tmp_path / f".out.pai-zoo-tmp-{proc.pid}").write_text("half")
        assert stale_temporaries(tmp_path / "out") == []  # alive: its temporary is in use
        os.kill(proc.pid, signal.SIGKILL)
        deadline = time.monotonic() + 10  # a zombie until waited for
        while not stale_temporaries(tmp_path / "out") and time.monotonic() < deadline:
            time.sleep(0.05)
        assert stale_temporaries(tmp_path / "out") == [tmp_path / f".out.pai-zoo-tmp-{proc.pid}"]
    finally:
        proc.kill()
        proc.wait()


def test_mount_point_is_a_listed_mount_above_the_path(tmp_path):
    mount = outputs.mount_point(tmp_path / "not" / "yet")
    assert mount == tmp_path or mount in tmp_path.resolve().parents
    assert os.path.ismount(mount) or mount in outputs._mount_points()


def test_an_old_destination_moved_aside_by_a_killed_run_is_put_back(tmp_path, dead_pid, capsys):
    old = tmp_path / f".ckpt.pai-zoo-old-{dead_pid}"  # killed between its two renames
    old.mkdir()
    (old / "w").write_text("old")
    (tmp_path / f".ckpt.pai-zoo-tmp-{dead_pid}").mkdir()
    clear_stale(tmp_path / "ckpt")
    assert sorted(os.listdir(tmp_path)) == ["ckpt"] and (tmp_path / "ckpt" / "w").read_text() == "old"
    assert f"restored {tmp_path / 'ckpt'} from {old}" in capsys.readouterr().err


def test_check_output_puts_back_a_moved_aside_destination_before_checking_it(tmp_path, dead_pid, capsys):
    (tmp_path / f".out.pai-zoo-old-{dead_pid}").write_text("old")
    with pytest.raises(PaiZooError, match="out exists; pass --force"):
        check_output(tmp_path / "out")
    assert (tmp_path / "out").read_text() == "old"
