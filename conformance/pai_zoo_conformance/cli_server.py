"""``pai-zoo`` commands for shell scripts, without a Python start each: a server that has imported pai-zoo, torch,
megatron-core and transformers once forks a child per command.

A test that runs a shell script as a user would (docs/tutorial.md's blocks) puts :attr:`CliServer.bin` first on
``PATH``. Its ``pai-zoo`` is a small stdlib-only client: it hands the server its arguments, environment, working
directory and its stdin, stdout and stderr, and the server forks a child that runs :func:`pai_zoo.cli.main` with
them, as the console script would, and exits as it would (``atexit`` handlers included). The client waits for that
child, passes on SIGINT, SIGTERM, SIGHUP and SIGQUIT sent to it (``kill -INT $!`` in the script reaches the
command), and exits with the child's exit code, or dies of the child's signal. SIGINT starts ignored in the child
when it was ignored in the client (a background job of a non-interactive shell), as in a process started there.

What differs from a fresh process: the modules are imported before the environment arrives, so a variable read at
import time (none in pai-zoo: its registry and cache are read when used) has the server's value; and signals sent to
the client's process group reach only the command through the client. Tests of the console script itself or of
signals to a process group start the real ``pai-zoo``.
"""
from __future__ import annotations

import argparse
import os
import pickle
import selectors
import signal
import socket
import struct
import subprocess
import sys
import tempfile
import time
from pathlib import Path

#: What the server imports before it forks: everything a ``pai-zoo`` command spends its start on (transformers'
#: lazy ``models`` package and a Llama config's module take ~2 s at their first use).
PRELOAD = ("torch", "transformers", "transformers.models", "transformers.models.llama.configuration_llama",
           "megatron.core", "megatron.core.models.gpt", "pai_zoo.cli",
           "pai_zoo.conversion.entry", "pai_zoo.training.trainer", "pai_zoo.generation", "pai_zoo.rl",
           "pai_zoo.data.preprocess", "pai_zoo.models.inspection", "pai_zoo.models.verification")
#: Seconds the server may take to import :data:`PRELOAD` and listen.
START_TIMEOUT = 300.0
_FORWARDED = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT)

#: The client, run by the server's own Python with ``-S`` (no site: it imports only the standard library).
_CLIENT = r'''
import os, pickle, signal, socket, struct, sys

def main():
    sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    sock.connect({address!r})
    ignored = signal.getsignal(signal.SIGINT) == signal.SIG_IGN
    request = pickle.dumps({{"argv": sys.argv[1:], "env": dict(os.environ), "cwd": os.getcwd(),
                            "sigint_ignored": ignored}})
    socket.send_fds(sock, [struct.pack("!I", len(request)) + request], [0, 1, 2])
    reader = sock.makefile("rb")
    child = int(reader.readline())
    def forward(signum, frame):
        try:
            os.kill(child, signum)
        except ProcessLookupError:
            pass
    for sig in {forwarded!r}:
        signal.signal(sig, forward)
    line = reader.readline()
    if not line:  # the server went away: the child's status is unknown
        sys.stderr.write("pai-zoo (test client): the command server closed the connection\n")
        return 70
    status = int(line)
    if status < 0:  # killed by a signal: die of it too, as the shell expects
        if -status not in (signal.SIGKILL, signal.SIGSTOP):  # those two keep their default and cannot be set
            signal.signal(-status, signal.SIG_DFL)
        os.kill(os.getpid(), -status)
    return status

sys.exit(main())
'''


class CliServer:
    """The server process and the folder holding its client as ``pai-zoo`` (:attr:`bin`); a context manager."""

    def __init__(self, preload: tuple[str, ...] = PRELOAD, env: dict | None = None, main: str = "pai_zoo.cli:main",
                 wrapper: tuple[str, ...] = ()):
        """``main`` (``module:function``) is what each child runs; ``wrapper`` is a command line the server is
        started under (``unshare ... sh -c '...; exec "$@"' sh``, say), followed by the server's own."""
        self.preload, self.main, self.wrapper = preload, main, tuple(wrapper)
        self.env = dict(os.environ if env is None else env)
        self.folder = Path(tempfile.mkdtemp(prefix="pai-zoo-cli-server-"))
        self.bin = self.folder / "bin"
        self.address = str(self.folder / "socket")
        self._proc: subprocess.Popen | None = None

    def start(self) -> CliServer:
        self.bin.mkdir()
        client = self.bin / "pai-zoo"
        client.write_text(f"#!{sys.executable} -S\n"
                          + _CLIENT.format(address=self.address, forwarded=tuple(int(s) for s in _FORWARDED)))
        client.chmod(0o755)
        log = open(self.folder / "log", "wb")
        self._proc = subprocess.Popen([*self.wrapper, sys.executable, "-m", __name__, "--main", self.main, self.address,
                                       *self.preload], env=self.env,
                                      stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT)
        log.close()
        deadline = time.monotonic() + START_TIMEOUT
        while not os.path.exists(self.address):
            if self._proc.poll() is not None or time.monotonic() > deadline:
                raise RuntimeError(f"the pai-zoo command server did not start:\n{self.log()}")
            time.sleep(0.05)
        return self

    @property
    def pid(self) -> int | None:
        """The server's process id (its children are the commands running now)."""
        return None if self._proc is None else self._proc.pid

    def log(self) -> str:
        """What the server itself printed (its children print to their clients' streams)."""
        try:
            return (self.folder / "log").read_text(errors="replace")
        except OSError:
            return ""

    def close(self) -> None:
        if self._proc is not None and self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()
        self._proc = None
        import shutil

        shutil.rmtree(self.folder, ignore_errors=True)

    def __enter__(self) -> CliServer:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.close()


# -- the server's side --------------------------------------------------------------------------------------------
def _read_request(conn: socket.socket) -> tuple[dict, list[int]]:
    data, fds, _, _ = socket.recv_fds(conn, 1 << 16, 3)
    while len(data) < 4 or len(data) < 4 + struct.unpack("!I", data[:4])[0]:
        more = conn.recv(1 << 16)
        if not more:
            raise EOFError("the client closed the connection mid-request")
        data += more
    return pickle.loads(data[4:4 + struct.unpack("!I", data[:4])[0]]), list(fds)


def _become_the_command(request: dict, fds: list[int], main) -> int:
    """In the forked child: take the client's streams, environment and directory, run ``pai-zoo ARGV``."""
    for target, fd in enumerate(fds):
        os.dup2(fd, target)
        os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    signal.signal(signal.SIGINT, signal.SIG_IGN if request["sigint_ignored"] else signal.default_int_handler)
    for sig in (signal.SIGTERM, signal.SIGHUP, signal.SIGQUIT):
        signal.signal(sig, signal.SIG_DFL)
    sys.argv = ["pai-zoo", *request["argv"]]
    try:
        return main(request["argv"])
    except SystemExit as exc:  # argparse's usage errors and --help
        return exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)


def _exit(run, *args) -> None:
    """Run the command in the forked child and end the child as the console script's process ends (``atexit``
    handlers, flushed streams, the exit code; a traceback and 1 for an exception that escapes), but without tearing
    down the server's imported modules one by one, which takes seconds and is nothing the command does."""
    import atexit
    import threading
    import traceback

    try:
        code = run(*args)
    except BaseException:  # noqa: BLE001 - as the interpreter would: the traceback, then exit 1
        traceback.print_exc()
        code = 1
    if code is None:  # sys.exit's meaning of what main returns: None is 0, a number the code, anything else printed
        code = 0
    elif not isinstance(code, int):
        print(code, file=sys.stderr)
        code = 1
    try:
        threading._shutdown()  # what the interpreter's exit does first: wait for the command's non-daemon threads
        atexit._run_exitfuncs()
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                pass
        os._exit(code)


def _status(wait_status: int) -> int:
    return -os.WTERMSIG(wait_status) if os.WIFSIGNALED(wait_status) else os.WEXITSTATUS(wait_status)


def serve(address: str, preload: list[str], main: str = "pai_zoo.cli:main") -> int:
    """Import ``preload``, listen on ``address`` and fork a child per request until SIGTERM; each child calls
    ``main`` (``module:function``) with the request's arguments and returns its exit code (the caller exits with
    it)."""
    import importlib

    for name in preload:
        importlib.import_module(name)
    module, _, function = main.partition(":")
    command = getattr(importlib.import_module(module), function)
    sys.stdout.flush()
    sys.stderr.flush()
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(address + ".tmp")
    listener.listen(16)
    os.rename(address + ".tmp", address)  # the client connects only once the server listens
    stopping = []
    signal.signal(signal.SIGTERM, lambda *_: stopping.append(True))
    children: dict[int, socket.socket] = {}  # pid -> its client's connection
    selector = selectors.DefaultSelector()
    selector.register(listener, selectors.EVENT_READ)
    while not stopping:
        for _ in selector.select(timeout=0.05):
            conn, _ = listener.accept()
            try:
                request, fds = _read_request(conn)
            except (EOFError, OSError, pickle.UnpicklingError):
                conn.close()
                continue
            pid = os.fork()
            if pid == 0:
                selector.close()
                listener.close()
                conn.close()
                for other in children.values():
                    other.close()
                _exit(_become_the_command, request, fds, command)
            for fd in fds:
                os.close(fd)
            conn.sendall(f"{pid}\n".encode())
            children[pid] = conn
        for pid in list(children):
            done, wait_status = os.waitpid(pid, os.WNOHANG)
            if done:
                conn = children.pop(pid)
                try:
                    conn.sendall(f"{_status(wait_status)}\n".encode())
                except OSError:  # the client is gone (killed): nobody to tell
                    pass
                conn.close()
    return 0


if __name__ == "__main__":
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--main", default="pai_zoo.cli:main")
    parser.add_argument("address")
    parser.add_argument("preload", nargs="*")
    options = parser.parse_args()
    sys.exit(serve(options.address, options.preload, options.main))
