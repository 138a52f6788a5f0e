"""The command server behind the tutorial's shell blocks: its ``pai-zoo`` prints, exits and reads files as the
console script does, through the shell's redirections and in the shell's directory, and passes on a signal sent
to it."""
from __future__ import annotations

import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from pai_zoo_conformance.cli_server import CliServer

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

CONSOLE_SCRIPT = Path(sys.executable).parent / "pai-zoo"


@pytest.fixture(scope="module")
def server():
    with CliServer(preload=("pai_zoo.cli",)) as running:
        yield running


def shell(script: str, path: Path, cwd: Path, **env) -> subprocess.CompletedProcess:
    return subprocess.run(["bash", "-euo", "pipefail", "-c", script], cwd=cwd, capture_output=True, text=True,
                          env={**os.environ, "PATH": f"{path}{os.pathsep}{os.environ['PATH']}", **env}, timeout=120)


@pytest.mark.parametrize("command", ["pai-zoo list", "pai-zoo frobnicate", "pai-zoo dataset inspect data/corpus",
                                     "pai-zoo --help"])
def test_a_command_prints_and_exits_as_the_console_script_does(server, command, tmp_path):
    (tmp_path / "data").mkdir()
    served = shell(f"{command} > out.txt 2> err.txt || echo $? > rc.txt", server.bin, tmp_path)
    assert served.returncode == 0, served.stderr
    got = {name: (tmp_path / name).read_text() if (tmp_path / name).exists() else "" for name in
           ("out.txt", "err.txt", "rc.txt")}
    real = subprocess.run([str(CONSOLE_SCRIPT), *command.split()[1:]], cwd=tmp_path, capture_output=True, text=True,
                          timeout=120)
    assert (got["out.txt"], got["err.txt"], got["rc.txt"].strip()) == \
        (real.stdout, real.stderr, str(real.returncode) if real.returncode else "")
    assert got["out.txt"] or got["err.txt"]  # the command printed something to compare


def test_a_command_runs_in_the_shells_directory_with_its_environment(server, tmp_path):
    (tmp_path / "sub").mkdir()
    served = shell("cd sub && pai-zoo dataset inspect corpus", server.bin, tmp_path)
    assert served.returncode == 1
    assert "hint: there is no folder" not in served.stderr and "corpus.idx" in served.stderr  # sub/ is there
    served = shell("pai-zoo list", server.bin, tmp_path, PAI_ZOO_PLUGINS="llama")
    assert "llama" in served.stdout and "qwen" not in served.stdout  # the variable the command was given


def running_children(pid: int) -> list[int]:
    """The live (not zombie) child processes of ``pid``, from /proc."""
    found = []
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            fields = stat.read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[1]) == pid and fields[0] != "Z":
            found.append(int(stat.parent.name))
    return found


@pytest.fixture(scope="module")
def waiting_server():
    """A server whose command is ``input``: it prints its arguments and waits for a line on stdin."""
    with CliServer(preload=(), main="builtins:input") as running:
        yield running


def test_the_command_reads_the_clients_stdin(waiting_server):
    proc = subprocess.run([str(waiting_server.bin / "pai-zoo"), "say:"], input="hello\n", capture_output=True,
                          text=True, timeout=60)
    assert (proc.returncode, proc.stdout, proc.stderr) == (1, "['say:']", "hello\n")  # sys.exit("hello")


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGHUP])
def test_a_signal_to_the_client_reaches_the_command(waiting_server, sig):
    """``kill`` of the client ends the command it runs; the client dies of the command's signal, as the shell's
    ``$?`` (128 + signal) expects."""
    proc = subprocess.Popen([str(waiting_server.bin / "pai-zoo"), "waiting"], stdin=subprocess.PIPE,
                            stdout=subprocess.PIPE)
    assert proc.stdout.read(len("['waiting']")) == b"['waiting']"  # the command runs and waits for stdin
    assert len(running_children(waiting_server.pid)) == 1
    proc.send_signal(sig)
    assert proc.wait(timeout=60) == -sig
    assert running_children(waiting_server.pid) == []  # the command got the signal, not only its client
    proc.stdin.close()
    proc.stdout.close()
