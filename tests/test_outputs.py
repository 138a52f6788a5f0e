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
