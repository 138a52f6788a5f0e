"""Run ``pai-zoo train`` (or ``pai-zoo rl NAME``, when the arguments start with ``rl``) and SIGKILL the process
at a chosen moment of a checkpoint save, or signal it at a step.

    python tests/train_interrupt.py MOMENT ITERATION -- <pai-zoo train arguments>

MOMENT ``publish``: just before ``iter_N.tmp`` is renamed to ``iter_N`` (the save is complete
but not published); ``tracker``: after the rename, before the tracker names it. ``sigint``, ``sigterm``: the
process sends itself that signal when it logs step ITERATION (before that step's checkpoint save); ``sigusr1``
likewise (SLURM's pre-emption warning); ``sigint2``:
two SIGINTs there (stop at once); ``sigint-group``: the process starts a session of its own and sends SIGINT to
its whole process group there, as Ctrl-C on a terminal does (megatron's checkpoint-writer helper process included).
The exit code is ``pai-zoo train``'s.
"""
import os
import signal
import sys
import time
from pathlib import Path

from pai_zoo.cli import main


def _kill_on(method_name: str, match) -> None:
    original = getattr(Path, method_name)

    def patched(self, target):
        if match(self, Path(target)):
            os.kill(os.getpid(), signal.SIGKILL)
        return original(self, target)

    setattr(Path, method_name, patched)


if __name__ == "__main__":
    moment, iteration = sys.argv[1], int(sys.argv[2])
    name = f"iter_{iteration:07d}"
    if moment == "publish":
        _kill_on("replace", lambda src, dst: dst.name == name)  # pai_zoo.util.files.publish renames with replace
    elif moment == "tracker":
        def match(src, dst):
            if dst.name == "latest_checkpointed_iteration.txt" and (src.parent / (name)).is_dir():
                return src.read_text().strip() == str(iteration)
            return False

        _kill_on("replace", match)
    elif moment in ("sigint", "sigterm", "sigusr1", "sigint2", "sigint-group"):
        from pai_zoo.util.metrics import MetricsLog

        sig = {"sigterm": signal.SIGTERM, "sigusr1": signal.SIGUSR1}.get(moment, signal.SIGINT)
        write = MetricsLog.write
        if moment == "sigint-group":
            os.setsid()  # a process group of its own: the signal must not reach the test runner

        def signalling_write(self, record):
            write(self, record)
            if record.get("step") == iteration:
                for i in range(2 if moment == "sigint2" else 1):
                    if i:
                        time.sleep(1.2)  # a second Ctrl-C, not the first delivered twice (StopRequest.REPEAT_WINDOW)
                    if moment == "sigint-group":
                        os.killpg(0, sig)
                    else:
                        os.kill(os.getpid(), sig)

        MetricsLog.write = signalling_write
    else:
        raise SystemExit(f"unknown moment {moment}")
    argv = sys.argv[sys.argv.index("--") + 1:]
    sys.exit(main(argv if argv[:1] == ["rl"] else ["train", *argv]))  # pai-zoo train, or an RL trainer's command
