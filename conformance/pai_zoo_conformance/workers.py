"""A group of parallel worker processes started once and reused: the ranks behind every multi-process check.

A check that needs 2 gloo processes (tensor, pipeline, expert or sequence parallelism, the distributed optimizer)
used to start its own ``torchrun``: two fresh Pythons importing torch, megatron-core and transformers, for a
forward that takes a second. :class:`WorkerGroup` starts ``torchrun --nproc-per-node N`` once; its ranks join one
gloo process group and then wait for work. :meth:`WorkerGroup.run` sends a function (by module and name) and its
arguments to every rank, each rank calls it, and the call returns every rank's result::

    from pai_zoo_conformance.workers import shared_workers

    logits = shared_workers().run(my_module.tp2_logits, checkpoint, ids)[0]   # rank 0's result

The function runs with the real process group and real collectives, as under ``torchrun``; after each call the
rank destroys megatron-core's model-parallel state (the process group stays), so the next call starts clean. The
function must be importable by the ranks: a module-level function of an installed package, or of a test file (the
ranks load that file by its path).

Failures are the caller's: an exception in a rank raises :class:`WorkerError` with that rank's traceback; a rank
that dies, or a call that outlasts its timeout, raises :class:`WorkerError` too, and the group is stopped and
started afresh by the next call. The pytest fixture ``pai_zoo_workers`` (:mod:`pai_zoo_conformance.plugin`) gives
a test the session's group, the same one :func:`shared_workers` returns.
"""
from __future__ import annotations

import atexit
import importlib
import importlib.util
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import traceback
from multiprocessing.connection import Connection, wait
from pathlib import Path

from pai_zoo.testing.torchrun import torchrun
from pai_zoo.util.dist import TORCHRUN_ENV

#: The environment variable that tells a rank where to connect (a Unix socket path).
ADDRESS_ENV = "PAI_ZOO_WORKERS_ADDRESS"
#: Seconds a call may take, by default, before its ranks are stopped and it fails.
CALL_TIMEOUT = 300.0
#: Seconds the ranks may take to start and connect.
START_TIMEOUT = 180.0
#: Seconds the other ranks get to finish once one rank has failed (it may have left them in a collective).
GRACE = 10.0
#: The environment variables a rank keeps from its own start, never taking the caller's.
_OWN_ENV = frozenset({*TORCHRUN_ENV, "OMP_NUM_THREADS", ADDRESS_ENV})


class WorkerError(AssertionError):
    """A call on the worker group failed: a rank raised (its traceback follows), died or timed out."""


class WorkerGroup:
    """``nproc`` ranks under one ``torchrun``, started on the first :meth:`run` and kept for the next ones."""

    def __init__(self, nproc: int = 2, timeout: float = CALL_TIMEOUT, grace: float = GRACE):
        self.nproc = nproc
        self.timeout = timeout
        self.grace = grace  # seconds the other ranks get once one has failed (:data:`GRACE` by default)
        self.starts = 0  # how many times the ranks were started (a restart after a failure counts)
        self._proc: subprocess.Popen | None = None
        self._conns: list[Connection] = []
        self._pids: dict[int, int] = {}
        self._folder: Path | None = None

    # -- the caller's side ------------------------------------------------------------------------------------
    def run(self, fn, *args, timeout: float | None = None, failed=None, **kwargs) -> list:
        """Call ``fn(*args, **kwargs)`` on every rank, with this process's environment and working directory;
        returns the results by rank. Raises :class:`WorkerError` when a rank raises, dies or takes longer than
        ``timeout`` seconds (default :attr:`timeout`). ``failed(result)``, when given, says that a rank's result
        is a failure (a non-zero exit code): the other ranks then get :attr:`grace` seconds, as after a raise.
        A rank that does not answer has its Python stack written to the error before the group is stopped."""
        task = {"module": fn.__module__, "name": fn.__qualname__, "file": _file_of(fn), "args": args,
                "kwargs": kwargs, "env": dict(os.environ), "cwd": os.getcwd()}
        self._ensure_started()
        what = f"{fn.__module__}.{fn.__qualname__}"
        try:
            for conn in self._conns:
                _send(conn, task)
        except (OSError, EOFError) as exc:
            self._stop()
            raise WorkerError(f"{what}: the worker ranks could not be reached ({exc}):\n{self._log_tail()}") from None
        return self._collect(what, time.monotonic() + (self.timeout if timeout is None else timeout), failed)

    def _collect(self, what: str, deadline: float, failed=None) -> list:
        results: dict[int, object] = {}
        errors: dict[int, str] = {}
        failures: list[int] = []  # ranks whose result ``failed`` calls a failure
        pending = dict(enumerate(self._conns))
        died = False
        while pending:
            ready = wait(list(pending.values()), timeout=max(0.0, deadline - time.monotonic()))
            if not ready:
                break
            for rank, conn in list(pending.items()):
                if conn not in ready:
                    continue
                del pending[rank]
                try:
                    status, value = _recv(conn)
                except (EOFError, OSError):
                    errors[rank], died = f"rank {rank} died (exit status {self._proc.poll()})", True
                    continue
                if status != "ok":
                    errors[rank] = f"rank {rank} raised:\n{value}"
                    continue
                results[rank] = value
                if failed is not None and failed(value):
                    failures.append(rank)
            if errors or failures:  # the others may wait in a collective the failed rank never reached
                deadline = min(deadline, time.monotonic() + self.grace)
        if pending or died:
            if pending:
                late = ", ".join(map(str, pending))
                first = min([*errors, *failures], default=None)
                errors[min(pending)] = (f"rank(s) {late} did not finish after rank {first} failed" if first is not None
                                        else f"rank(s) {late} did not answer within the timeout")
                for rank in sorted(set(results) - set(errors)):
                    errors[rank] = f"rank {rank} returned:\n{_summary(results[rank])}"
                self._dump_stacks(pending)
            tail = self._log_tail()
            self._stop()  # the next call starts fresh ranks
            raise WorkerError(f"{what}: " + "\n".join(errors[r] for r in sorted(errors)) + f"\n{tail}")
        if errors:
            raise WorkerError(f"{what}: " + "\n".join(errors[r] for r in sorted(errors)))
        return [results[rank] for rank in range(self.nproc)]

    def close(self) -> None:
        """Stop the ranks (a later :meth:`run` starts them again)."""
        for conn in self._conns:
            try:
                _send(conn, None)
            except OSError:
                pass
        if self._proc is not None:
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        self._stop()

    @property
    def alive(self) -> bool:
        """Whether the ranks are running."""
        return self._proc is not None and self._proc.poll() is None

    # -- starting and stopping --------------------------------------------------------------------------------
    def _ensure_started(self) -> None:
        if self.alive and len(self._conns) == self.nproc:
            return
        self._stop()
        self._folder = Path(tempfile.mkdtemp(prefix="pai-zoo-workers-"))
        address = str(self._folder / "socket")
        server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        server.bind(address)
        server.listen(self.nproc)
        env = {**os.environ, ADDRESS_ENV: address, "OMP_NUM_THREADS": "1"}
        log = open(self._folder / "log", "wb")
        self._proc = subprocess.Popen([*torchrun(self.nproc), "-m", "pai_zoo_conformance.workers"], env=env,
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                      start_new_session=True)
        log.close()
        self.starts += 1
        conns: dict[int, Connection] = {}
        deadline = time.monotonic() + START_TIMEOUT
        try:
            while len(conns) < self.nproc:
                if self._proc.poll() is not None or time.monotonic() > deadline:
                    raise WorkerError(f"the {self.nproc} worker ranks did not start:\n{self._log_tail()}")
                server.settimeout(1.0)
                try:
                    sock, _ = server.accept()
                except socket.timeout:
                    continue
                sock.settimeout(None)
                conn = Connection(sock.detach())
                rank, pid = _recv(conn)
                conns[rank], self._pids[rank] = conn, pid
        except BaseException:
            for conn in conns.values():
                conn.close()
            self._stop()
            raise
        finally:
            server.close()
        self._conns = [conns[rank] for rank in range(self.nproc)]

    def _stop(self) -> None:
        for conn in self._conns:
            conn.close()
        self._conns = []
        if self._proc is not None and self._proc.poll() is None:
            try:
                os.killpg(self._proc.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
            self._proc.wait()
        self._proc = None
        if self._folder is not None:
            shutil.rmtree(self._folder, ignore_errors=True)
            self._folder = None

    def _dump_stacks(self, ranks) -> None:
        """Each of ``ranks`` writes every thread's Python stack to the log (its ``faulthandler`` on SIGUSR1)."""
        for rank in ranks:
            try:
                os.kill(self._pids[rank], signal.SIGUSR1)
            except (KeyError, ProcessLookupError):
                pass
        time.sleep(2.0)

    def _log_tail(self, chars: int = 6000) -> str:
        try:
            text = (self._folder / "log").read_text(errors="replace")
        except (OSError, TypeError):
            return ""
        return f"worker log (last {chars} characters):\n{text[-chars:]}" if text else ""


def _send(conn: Connection, obj) -> None:
    """Plain pickle (a tensor travels as its bytes), not multiprocessing's, whose tensor reduction passes shared
    memory handles that only processes of one multiprocessing family can open."""
    conn.send_bytes(pickle.dumps(obj))


def _recv(conn: Connection):
    return pickle.loads(conn.recv_bytes())


def _summary(value, chars: int = 3000) -> str:
    """A rank's result for an error message: a completed process as its exit code and output's ends."""
    if all(hasattr(value, a) for a in ("returncode", "stdout", "stderr")):
        return (f"exit code {value.returncode}\nstdout (end): {value.stdout[-chars:]}\n"
                f"stderr (end): {value.stderr[-chars:]}")
    text = repr(value)
    return text if len(text) <= chars else text[:chars] + " ..."


def _file_of(fn) -> str | None:
    module = sys.modules.get(fn.__module__)
    code = getattr(fn, "__code__", None)
    return getattr(module, "__file__", None) or (code.co_filename if code is not None else None)


_SHARED: WorkerGroup | None = None


def shared_workers() -> WorkerGroup:
    """This process's group of 2 ranks, started on its first call and stopped when the process exits."""
    global _SHARED
    if _SHARED is None:
        _SHARED = WorkerGroup(2)
        atexit.register(_SHARED.close)
    return _SHARED


# -- the ranks' side ----------------------------------------------------------------------------------------------
def _resolve(task: dict):
    name, file = task["module"], task["file"]
    try:
        module = importlib.import_module(name)
    except ImportError:
        if not file:
            raise
        module = sys.modules.get(name)
        if module is None or getattr(module, "__file__", None) != file:
            spec = importlib.util.spec_from_file_location(name, file)
            module = importlib.util.module_from_spec(spec)
            sys.modules[name] = module
            spec.loader.exec_module(module)
    target = module
    for part in task["name"].split("."):
        target = getattr(target, part)
    return target


def _take_environment(env: dict, cwd: str) -> None:
    """The caller's environment and working directory, as a child process of the caller would have them; a
    changed ``$PAI_ZOO_*`` variable (the plugins, the cache) rebuilds pai-zoo's registry."""
    before = {k: v for k, v in os.environ.items() if k.startswith("PAI_ZOO")}
    for key in [k for k in os.environ if k not in _OWN_ENV and not k.startswith("TORCHELASTIC_")]:
        del os.environ[key]
    os.environ.update({k: v for k, v in env.items() if k not in _OWN_ENV and not k.startswith("TORCHELASTIC_")})
    after = {k: v for k, v in os.environ.items() if k.startswith("PAI_ZOO")}
    if before != after and "pai_zoo.registry" in sys.modules:
        sys.modules["pai_zoo.registry"].reset_registry(None)
    os.chdir(cwd)


def _clean_up() -> None:
    """Megatron-core's model-parallel state goes after each call, and with it every process group but the world
    (each group's gloo threads would otherwise live on, call after call); the world group stays."""
    import gc

    import torch
    from torch.distributed.distributed_c10d import GroupMember, _world

    parallel_state = sys.modules.get("megatron.core.parallel_state")
    if parallel_state is not None and parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    gc.collect()
    for group in list(_world.pg_map):
        if group is not GroupMember.WORLD:
            torch.distributed.destroy_process_group(group)
    gc.collect()


def serve() -> None:
    """A rank's loop: join the gloo group, connect to the caller, run each task sent until told to stop."""
    import faulthandler

    import torch

    faulthandler.register(signal.SIGUSR1, all_threads=True)  # the caller's way to see where a late rank is
    torch.set_num_threads(1)
    torch.distributed.init_process_group("gloo")
    rank = torch.distributed.get_rank()
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect(os.environ[ADDRESS_ENV])
    conn = Connection(sock.detach())
    _send(conn, (rank, os.getpid()))
    while True:
        try:
            task = _recv(conn)
        except EOFError:
            break
        if task is None:
            break
        try:
            _take_environment(task["env"], task["cwd"])
            reply = ("ok", _resolve(task)(*task["args"], **task["kwargs"]))
        except BaseException:  # noqa: BLE001 - every failure goes back to the caller, with its traceback
            reply = ("error", traceback.format_exc())
        finally:
            try:
                _clean_up()
            except Exception:  # noqa: BLE001
                reply = ("error", traceback.format_exc())
        try:
            data = pickle.dumps(reply)
        except Exception:  # noqa: BLE001 - a result that does not pickle
            data = pickle.dumps(("error", traceback.format_exc()))
        conn.send_bytes(data)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    serve()
