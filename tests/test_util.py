"""pai_zoo.util: atomic writes, the distributed environment, the cache folder."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from pai_zoo.util import dist
from pai_zoo.util.cache import cache_dir
from pai_zoo.util.files import AtomicFiles, atomic_folder, atomic_path, publish, write_text_atomic

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)


def test_write_text_atomic_replaces_the_file_and_leaves_no_temporary(tmp_path):
    target = tmp_path / "out.json"
    target.write_text("old")
    assert write_text_atomic(target, "new\n") == target
    assert target.read_text() == "new\n" and sorted(p.name for p in tmp_path.iterdir()) == ["out.json"]


def test_a_failed_write_keeps_the_old_file_and_removes_the_temporary(tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("old")
    with pytest.raises(RuntimeError, match="half-written"):
        with atomic_path(target) as tmp:
            tmp.write_text("partial")
            raise RuntimeError("half-written")
    assert target.read_text() == "old" and sorted(p.name for p in tmp_path.iterdir()) == ["out.txt"]


def test_a_folder_appears_complete_or_not_at_all(tmp_path):
    target = tmp_path / "folder"
    with pytest.raises(OSError):
        with atomic_path(target) as tmp:
            tmp.mkdir()
            (tmp / "a").write_text("1")
            raise OSError("disk full")
    assert list(tmp_path.iterdir()) == []
    with atomic_path(target) as tmp:
        tmp.mkdir()
        (tmp / "a").write_text("1")
    assert (target / "a").read_text() == "1" and [p.name for p in tmp_path.iterdir()] == ["folder"]


def test_atomic_folder_publishes_or_keeps_the_one_published_first(tmp_path):
    target = tmp_path / "tok"
    with pytest.raises(OSError, match="disk full"):
        with atomic_folder(target) as tmp:
            (tmp / "a").write_text("1")
            raise OSError("disk full")
    assert list(tmp_path.iterdir()) == []
    with atomic_folder(target, durable=True) as tmp:
        (tmp / "a").write_text("1")
    assert (target / "a").read_text() == "1"
    with atomic_folder(target, exist_ok=True) as tmp:  # another process was first: theirs is kept
        (tmp / "a").write_text("2")
    assert (target / "a").read_text() == "1" and [p.name for p in tmp_path.iterdir()] == ["tok"]
    with pytest.raises(OSError):
        with atomic_folder(target) as tmp:
            (tmp / "a").write_text("3")
    assert (target / "a").read_text() == "1" and [p.name for p in tmp_path.iterdir()] == ["tok"]


def test_publish_replaces_a_folder_only_when_asked(tmp_path):
    (tmp_path / "old").mkdir()
    (tmp_path / "old" / "x").write_text("old")
    new = tmp_path / "new"
    new.mkdir()
    (new / "y").write_text("new")
    with pytest.raises(OSError):
        publish(new, tmp_path / "old")
    assert publish(new, tmp_path / "old", replace=True, durable=True) == tmp_path / "old"
    assert [p.name for p in (tmp_path / "old").iterdir()] == ["y"] and not new.exists()


def test_atomic_files_commit_in_order_and_abort_removes_the_rest(tmp_path, monkeypatch):
    files = AtomicFiles()
    names = [tmp_path / "d.bin", tmp_path / "d.idx"]
    for name in names:
        Path(files.temporary(name)).write_text(name.suffix)
    assert sorted(p.name for p in tmp_path.iterdir()) == [f".d.{suffix}.pai-zoo-tmp-{os.getpid()}-{files.tag}"
                                                          for suffix in ("bin", "idx")]  # util.outputs' names
    real = Path.replace
    monkeypatch.setattr(Path, "replace", lambda a, b: real(a, b) if str(b).endswith(".bin") else 1 / 0)
    with pytest.raises(ZeroDivisionError):
        files.commit()
    files.abort()
    assert [p.name for p in tmp_path.iterdir()] == ["d.bin"] and names[0].read_text() == ".bin"


def test_rank_and_world_come_from_torchruns_environment_before_init(monkeypatch):
    monkeypatch.setattr(dist, "_initialized", lambda: None)  # torch.distributed not (yet) initialized
    for name in dist.TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    assert (dist.rank(), dist.world_size(), dist.local_rank(), dist.is_rank0()) == (0, 1, 0, True)
    assert not dist.launched_by_torchrun()
    monkeypatch.setenv("RANK", "3")
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setenv("TORCHELASTIC_RUN_ID", "x")
    assert (dist.rank(), dist.world_size(), dist.local_rank(), dist.is_rank0()) == (3, 4, 1, False)
    assert dist.launched_by_torchrun()
    initialized = type("Group", (), {"get_rank": staticmethod(lambda: 5), "get_world_size": staticmethod(lambda: 8)})
    monkeypatch.setattr(dist, "_initialized", lambda: initialized)  # once initialized, torch.distributed answers
    assert (dist.rank(), dist.world_size(), dist.is_rank0()) == (5, 8, False)
    child = dist.single_process_env()
    assert not {"RANK", "WORLD_SIZE", "LOCAL_RANK", "TORCHELASTIC_RUN_ID"} & set(child) and "PATH" in child


def test_cache_dir_follows_pai_zoo_cache_then_xdg_then_home(monkeypatch, tmp_path):
    monkeypatch.setenv("PAI_ZOO_CACHE", str(tmp_path / "c"))
    assert cache_dir() == tmp_path / "c"
    monkeypatch.delenv("PAI_ZOO_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "x"))
    assert cache_dir() == tmp_path / "x" / "pai-zoo"
    monkeypatch.delenv("XDG_CACHE_HOME")
    monkeypatch.setenv("HOME", str(tmp_path / "h"))
    assert cache_dir() == Path(os.path.expanduser("~")) / ".cache" / "pai-zoo" == tmp_path / "h" / ".cache" / "pai-zoo"
