"""One process of tests/test_multinode.py's launches: ``pai-zoo`` commands one after the other, as
``python multinode_worker.py COMMANDS.json`` under torchrun (each command's argv a list in the JSON file), in one
process so that torch and megatron-core are imported once. megatron-core's parallel state goes between commands (the
process group stays, as the next command finds it under torchrun). Exits with the first failing command's code."""
import json
import sys
from pathlib import Path


def main(commands_file: str) -> int:
    import torch

    from pai_zoo.cli import main as cli

    torch.set_num_threads(1)
    for argv in json.loads(Path(commands_file).read_text()):
        code = cli(argv)
        if code:
            return code
        from megatron.core import parallel_state

        if parallel_state.model_parallel_is_initialized():
            parallel_state.destroy_model_parallel()
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
