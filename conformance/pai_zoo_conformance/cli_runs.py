"""``pai-zoo ARGV`` run inside the calling process, or on each rank of the worker group, with its output captured.

A test of what a command does (the files it writes, the lines it prints, its exit code) need not pay for a fresh
Python that imports torch, megatron-core and transformers again: :func:`run_cli` calls the CLI's ``main()`` here and
answers as ``subprocess.run(..., capture_output=True, text=True)`` would. Tests of the process itself (signals,
SIGKILL, torchrun, the console script) still start one. :func:`run_cli_on_ranks` is the multi-process form: the
command runs on every rank of the session's :class:`~pai_zoo_conformance.workers.WorkerGroup`, as under
``torchrun --nproc-per-node 2``.
"""
from __future__ import annotations

import contextlib
import io
import json
import subprocess

#: torch's intra-op threads for a run: what ``OMP_NUM_THREADS=1`` gives a subprocess, so that a run's floats do not
#: depend on the machine's cores, and a run here equals the same run in a subprocess bit for bit.
THREADS = 1


def run_cli(argv: list[str], threads: int = THREADS) -> subprocess.CompletedProcess:
    """``pai-zoo ARGV`` in this process on ``threads`` torch threads: its exit code (argparse's ``SystemExit``
    included) and what it wrote to ``sys.stdout`` and ``sys.stderr``."""
    import torch

    from pai_zoo.cli import main

    argv = [str(a) for a in argv]
    out, err = io.StringIO(), io.StringIO()
    before = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        with contextlib.redirect_stdout(out), contextlib.redirect_stderr(err):
            try:
                code = main(argv)
            except SystemExit as exc:
                code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    finally:
        torch.set_num_threads(before)
    return subprocess.CompletedProcess(["pai-zoo", *argv], code, out.getvalue(), err.getvalue())


def main_result(argv, capsys) -> tuple[int, str, str]:
    """``pai-zoo ARGV`` in this process, its output captured by pytest's ``capsys``: the exit code (argparse's
    ``SystemExit`` included), stdout, stderr. Unlike :func:`run_cli` it imports nothing but the CLI, so a test of a
    command that answers before loading anything can check that nothing heavy was imported."""
    from pai_zoo.cli import main

    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def run_cli_on_ranks(argv: list[str], workers=None, timeout: float | None = None) -> subprocess.CompletedProcess:
    """``pai-zoo ARGV`` on every rank of ``workers`` (default: the session's group): the first non-zero exit code
    (else 0) and the ranks' output one after the other, as ``torchrun`` would merge it."""
    from .workers import shared_workers

    ranks = (workers or shared_workers()).run(run_cli, argv, timeout=timeout, failed=lambda r: r.returncode != 0)
    code = next((r.returncode for r in ranks if r.returncode), 0)
    return subprocess.CompletedProcess(["torchrun", "pai-zoo", *map(str, argv)], code,
                                       "".join(r.stdout for r in ranks), "".join(r.stderr for r in ranks))


def assert_convert_round_trip(folder, tmp_path, tp: str, pp: str, tower_prefix: str) -> None:
    """HF -> Megatron-Core (written as ``tp`` x ``pp`` shards) -> HF through ``pai-zoo convert``: the same tensors,
    bit for bit (some named ``tower_prefix...`` among them), and the same config.json (a nested config's
    ``text_config`` and ``vision_config`` compared part by part first, for a readable failure)."""
    import torch
    from safetensors.torch import load_file

    proc = run_cli(["convert", folder, tmp_path / "mcore", "--to", "mcore", "--tp", tp, "--pp", pp])
    assert proc.returncode == 0, proc.stderr
    proc = run_cli(["convert", tmp_path / "mcore", tmp_path / "back", "--to", "hf"])
    assert proc.returncode == 0, proc.stderr
    want, got = load_file(folder / "model.safetensors"), load_file(tmp_path / "back" / "model.safetensors")
    assert sorted(want) == sorted(got) and any(k.startswith(tower_prefix) for k in want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    back, source = (json.loads(f.read_text()) for f in (tmp_path / "back" / "config.json", folder / "config.json"))
    for part in ("text_config", "vision_config"):
        a, b = back.pop(part, {}), source.pop(part, {})
        assert a == b, (set(a) ^ set(b), {k: (a.get(k), b.get(k)) for k in set(a) | set(b) if a.get(k) != b.get(k)})
    assert back == source
