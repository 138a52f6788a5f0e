"""Run ``pai-zoo train`` and SIGKILL the process at a chosen moment of a checkpoint save.

    python tests/train_interrupt.py MOMENT ITERATION -- <pai-zoo train arguments>

MOMENT ``publish``: just before ``iter_N.tmp`` is renamed to ``iter_N`` (the save is complete
but not published); ``tracker``: after the rename, before the tracker names it.
"""
import os
import signal
import sys
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
    else:
        raise SystemExit(f"unknown moment {moment}")
    sys.exit(main(["train", *sys.argv[sys.argv.index("--") + 1:]]))
