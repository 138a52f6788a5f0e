"""The command line that starts ``nproc`` local processes under torchrun, as the tests and the suite launch them."""
from __future__ import annotations

import sys


def torchrun(nproc: int) -> list[str]:
    """``python -m torch.distributed.run --standalone --nproc-per-node N``: append ``-m module ...`` or a script.

    ``--standalone`` lets torchrun's own rendezvous bind a free port, so launches running at the same time (two test
    passes on one machine) cannot race for a port chosen beforehand."""
    return [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", str(nproc)]
