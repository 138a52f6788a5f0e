"""``pai-zoo train --plan --nodes N --gpus-per-node M``: how to launch the planned run on several machines.

Two ways, both printed (no torch, nothing started):

* one ``torchrun`` per node, with c10d's rendezvous: ``torchrun --nnodes N --nproc-per-node M --node-rank R
  --rdzv-backend c10d --rdzv-endpoint HOST:PORT -m pai_zoo.cli train ...`` for R = 0 .. N-1 (run from the same
  folder on every node; ``HOST`` is node 0's address, ``$MASTER_ADDR`` unless ``--rdzv-endpoint`` names it);
* an ``sbatch`` script for SLURM: ``--nodes=N --ntasks-per-node=M --gpus-per-node=M`` and ``srun pai-zoo train ...``,
  one task per GPU, which pai-zoo maps onto torchrun's variables itself (:mod:`pai_zoo.util.launch`).

The train arguments are the user's own, as given, without the plan's flags.
"""
from __future__ import annotations

import re
import shlex

from ..plugin.errors import PaiZooError
from ..util.launch import DEFAULT_PORT

__all__ = ["DEFAULT_ENDPOINT", "check_endpoint", "check_nodes", "launch_lines", "sbatch_script", "torchrun_commands"]

#: ``--rdzv-endpoint``'s default in the printed commands: node 0's address from the shell of each node
DEFAULT_ENDPOINT = f"$MASTER_ADDR:{DEFAULT_PORT}"


def check_endpoint(endpoint: str) -> str:
    """``HOST:PORT`` (``HOST`` may be a shell variable such as ``$MASTER_ADDR``), else one line naming the flag."""
    host, _, port = endpoint.rpartition(":")
    if not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise PaiZooError(f"--rdzv-endpoint {endpoint}: expected HOST:PORT (node 0's address and a free port, e.g. "
                          f"node01:{DEFAULT_PORT} or {DEFAULT_ENDPOINT})")
    return endpoint


def check_nodes(nodes: int, gpus_per_node: int, tp: int, pp: int, cp: int = 1) -> int:
    """The world of ``nodes`` x ``gpus_per_node`` GPUs; refused in one line unless each node holds whole
    tensor-parallel groups (megatron-core places a TP group on consecutive ranks: one node, where its every-layer
    communication is fast) and the world holds whole TP x PP x CP model replicas."""
    world = nodes * gpus_per_node
    if gpus_per_node % tp:
        raise PaiZooError(f"--gpus-per-node {gpus_per_node} does not hold whole tensor-parallel groups of --tp {tp} "
                          f"(each TP group stays on one node); use a multiple of {tp}")
    if world % (tp * pp * cp):
        layout = f"TP {tp} x PP {pp}" + (f" x CP {cp}" if cp > 1 else "")
        raise PaiZooError(f"--nodes {nodes} x --gpus-per-node {gpus_per_node} = {world} GPUs does not hold whole "
                          f"model replicas of {layout} = {tp * pp * cp}; use a multiple of {tp * pp * cp} GPUs")
    return world


def _shell(arguments: list[str]) -> str:
    return shlex.join(arguments)


def _endpoint(endpoint: str) -> str:
    """The endpoint as a shell word: a ``$VARIABLE`` is left for the shell to expand."""
    return endpoint if re.fullmatch(r"[\w.\-:${}\[\]]+", endpoint) else shlex.quote(endpoint)


def torchrun_commands(nodes: int, gpus_per_node: int, arguments: list[str],
                      endpoint: str = DEFAULT_ENDPOINT) -> list[str]:
    """One ``torchrun ... -m pai_zoo.cli ARGUMENTS`` line per node, node rank 0 first."""
    return [f"torchrun --nnodes {nodes} --nproc-per-node {gpus_per_node} --node-rank {rank} --rdzv-backend c10d "
            f"--rdzv-endpoint {_endpoint(endpoint)} -m pai_zoo.cli {_shell(arguments)}" for rank in range(nodes)]


def sbatch_script(nodes: int, gpus_per_node: int, arguments: list[str], summary: str = "",
                  job_name: str = "pai-zoo-train") -> str:
    """An ``sbatch`` script that runs ``pai-zoo ARGUMENTS`` as one ``srun`` task per GPU."""
    lines = [
        "#!/bin/bash",
        f"#SBATCH --job-name={job_name}",
        f"#SBATCH --nodes={nodes}",
        f"#SBATCH --ntasks-per-node={gpus_per_node}",
        f"#SBATCH --gpus-per-node={gpus_per_node}",
        "#SBATCH --output=%x-%j.out",
        f"# written by pai-zoo train --plan{': ' + summary if summary else ''}",
        "# srun starts one pai-zoo per GPU; pai-zoo reads SLURM's variables as torchrun's: RANK = SLURM_PROCID,",
        "# LOCAL_RANK = SLURM_LOCALID, MASTER_ADDR = the job's first node, MASTER_PORT = 10000 + job id % 20000",
        "# (export MASTER_PORT to choose one). --save, the data and the model must be on a filesystem every node",
        "# mounts; PAI_ZOO_SHARED_TMPDIR (default: the working directory) holds the scratch every rank reads.",
        "set -euo pipefail",
        "export CUDA_DEVICE_MAX_CONNECTIONS=1  # Megatron-LM's setting for tensor/sequence-parallel overlap",
        f"srun pai-zoo {_shell(arguments)}",
    ]
    return "\n".join(lines) + "\n"


def launch_lines(nodes: int, gpus_per_node: int, arguments: list[str], endpoint: str = DEFAULT_ENDPOINT,
                 summary: str = "", sbatch_file: str | None = None) -> list[str]:
    """What ``--plan --nodes N --gpus-per-node M`` prints after the memory plan: each node's torchrun command and
    the sbatch script (or where it was written)."""
    lines = [f"launch on {nodes} nodes x {gpus_per_node} GPUs ({summary}), from the same folder on every node:"
             if summary else f"launch on {nodes} nodes x {gpus_per_node} GPUs, from the same folder on every node:"]
    for rank, command in enumerate(torchrun_commands(nodes, gpus_per_node, arguments, endpoint)):
        lines += [f"  node {rank}:", f"    {command}"]
    if endpoint == DEFAULT_ENDPOINT:
        lines.append("  (export MASTER_ADDR=<node 0's host> on every node first, or give --plan --rdzv-endpoint "
                     "HOST:PORT)")
    if sbatch_file is not None:
        lines.append(f"or with SLURM: sbatch {shlex.quote(sbatch_file)} (written)")
    else:
        lines.append("or with SLURM, this script (--sbatch FILE writes it) run by sbatch:")
        lines += ["    " + line for line in sbatch_script(nodes, gpus_per_node, arguments, summary).splitlines()]
    return lines
