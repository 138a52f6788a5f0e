"""Launching on several machines: SLURM's ``srun`` read as torchrun's environment.

``srun pai-zoo train ...`` (one task per GPU, no torchrun) starts every process itself; torch's ``env://``
rendezvous reads torchrun's variables instead. :func:`apply_slurm_env` (called by the ``pai-zoo`` command line
before a command runs; a Python script calls it before :func:`pai_zoo.load`) maps one onto the other:

=====================  ==============================================================================================
``RANK``               ``SLURM_PROCID``
``WORLD_SIZE``         ``SLURM_STEP_NUM_TASKS`` (srun's task count; ``SLURM_NTASKS`` inside a job step)
``LOCAL_RANK``         ``SLURM_LOCALID``
``LOCAL_WORLD_SIZE``   this node's entry of ``SLURM_STEP_TASKS_PER_NODE`` / ``SLURM_TASKS_PER_NODE`` (``8(x4)``)
``GROUP_RANK``         ``SLURM_NODEID``; ``GROUP_WORLD_SIZE``: ``SLURM_STEP_NUM_NODES`` / ``SLURM_NNODES``
``MASTER_ADDR``        the first host of ``SLURM_STEP_NODELIST`` / ``SLURM_JOB_NODELIST`` / ``SLURM_NODELIST``
                       (SLURM's compressed syntax ``gpu[01-04,07]`` expanded by :func:`expand_hostlist`)
``MASTER_PORT``        :func:`slurm_port`: ``10000 + SLURM_JOB_ID % 20000`` (two jobs sharing a node differ)
=====================  ==============================================================================================

torchrun's own variables win: under ``srun torchrun ...`` (or any launcher that sets ``RANK`` and ``WORLD_SIZE``)
nothing is changed, and a ``MASTER_ADDR`` or ``MASTER_PORT`` already set (``export MASTER_PORT=...``) is kept. A
single task (``srun -n 1``, an ``salloc`` shell, the batch script itself) is left alone: it runs as one process.
Imports neither torch nor megatron-core.
"""
from __future__ import annotations

import os
import re

from ..plugin.errors import PaiZooError

__all__ = ["DEFAULT_PORT", "apply_slurm_env", "expand_hostlist", "slurm_env", "slurm_port", "tasks_per_node"]

#: the rendezvous port without a SLURM job id (torchrun's default)
DEFAULT_PORT = 29500
#: a job's port is ``PORT_BASE + job id % PORT_SPAN``: below Linux's ephemeral ports (32768 on)
PORT_BASE, PORT_SPAN = 10000, 20000


class LaunchError(PaiZooError):
    """A SLURM variable that cannot be read (named in the message)."""


def _split_top(text: str) -> list[str]:
    """``text`` split at the commas outside brackets."""
    parts, depth, start = [], 0, 0
    for i, c in enumerate(text):
        if c == "[":
            depth += 1
        elif c == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("']' without '['")
        elif c == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("'[' without ']'")
    parts.append(text[start:])
    return parts


def _range(item: str) -> list[str]:
    """``"01-04"`` -> ``["01", "02", "03", "04"]`` (zero padding kept); ``"7"`` -> ``["7"]``."""
    if "-" not in item:
        if not item.isdigit():
            raise ValueError(f"{item!r} is not a number")
        return [item]
    low, high = item.split("-", 1)
    if not (low.isdigit() and high.isdigit()) or int(low) > int(high):
        raise ValueError(f"{item!r} is not a range")
    width = len(low) if low.startswith("0") else 0
    return [str(n).zfill(width) for n in range(int(low), int(high) + 1)]


def _expand_one(name: str) -> list[str]:
    match = re.search(r"\[([^\[\]]*)\]", name)
    if match is None:
        if "[" in name or "]" in name:
            raise ValueError("unbalanced brackets")
        return [name]
    head, tail = name[:match.start()], name[match.end():]
    values = [v for item in match.group(1).split(",") for v in _range(item.strip())]
    return [f"{head}{v}{rest}" for v in values for rest in _expand_one(tail)]


def expand_hostlist(text: str, variable: str = "SLURM_JOB_NODELIST") -> list[str]:
    """SLURM's compressed host list as host names, in order: ``gpu[01-03,07],cpu1`` ->
    ``["gpu01", "gpu02", "gpu03", "gpu07", "cpu1"]`` (zero padding kept; several bracket groups in one name,
    ``rack[1-2]-n[1,3]``, expand as a product). A malformed list is a :class:`~pai_zoo.errors.PaiZooError` naming
    ``variable``."""
    text = text.strip()
    try:
        if not text:
            raise ValueError("empty")
        hosts = [h for part in _split_top(text) if part.strip() for h in _expand_one(part.strip())]
        if not hosts:
            raise ValueError("no host")
    except ValueError as e:
        raise LaunchError(f"{variable}={text!r}: not a SLURM host list ({e}); expected e.g. node[01-04,07]") from None
    return hosts


def tasks_per_node(text: str, variable: str = "SLURM_TASKS_PER_NODE") -> list[int]:
    """SLURM's tasks per node, one entry per node: ``8(x4)`` -> ``[8, 8, 8, 8]``, ``2(x2),1`` -> ``[2, 2, 1]``."""
    out = []
    for part in text.strip().split(","):
        match = re.fullmatch(r"\s*(\d+)\s*(?:\(x(\d+)\))?\s*", part)
        if match is None:
            raise LaunchError(f"{variable}={text!r}: not SLURM's tasks per node; expected e.g. 8(x4) or 2(x3),1")
        out += [int(match.group(1))] * int(match.group(2) or 1)
    return out


def slurm_port(env=None) -> int:
    """The rendezvous port of a SLURM job: ``10000 + SLURM_JOB_ID % 20000`` (29500 without a job id)."""
    env = os.environ if env is None else env
    job = env.get("SLURM_JOB_ID") or env.get("SLURM_JOBID")
    return PORT_BASE + int(job) % PORT_SPAN if job and job.isdigit() else DEFAULT_PORT


def _int(env, *names: str) -> int | None:
    for name in names:
        value = env.get(name)
        if value not in (None, ""):
            try:
                return int(value)
            except ValueError:
                raise LaunchError(f"{name}={value!r}: not a number") from None
    return None


def slurm_env(env=None) -> dict[str, str]:
    """torchrun's variables for a process that ``srun`` started (see the module docstring); ``{}`` when it runs
    under torchrun already (``RANK`` and ``WORLD_SIZE`` set), outside an ``srun`` step, or as a single task."""
    env = os.environ if env is None else env
    if ("RANK" in env and "WORLD_SIZE" in env) or "SLURM_PROCID" not in env:
        return {}
    world = _int(env, "SLURM_STEP_NUM_TASKS") if "SLURM_STEP_NUM_TASKS" in env else (
        _int(env, "SLURM_NTASKS", "SLURM_NPROCS") if "SLURM_STEP_ID" in env or "SLURM_STEPID" in env else None)
    if world is None or world <= 1:
        return {}
    rank = _int(env, "SLURM_PROCID")
    if not 0 <= rank < world:
        raise LaunchError(f"SLURM_PROCID={rank} is outside the step's {world} tasks (SLURM_STEP_NUM_TASKS)")
    nodes = _int(env, "SLURM_STEP_NUM_NODES", "SLURM_NNODES") or 1
    node = _int(env, "SLURM_NODEID") or 0
    local = _int(env, "SLURM_LOCALID")
    out = {"RANK": str(rank), "WORLD_SIZE": str(world), "GROUP_RANK": str(node), "GROUP_WORLD_SIZE": str(nodes)}
    per_node = next(((name, env[name]) for name in ("SLURM_STEP_TASKS_PER_NODE", "SLURM_TASKS_PER_NODE",
                                                    "SLURM_NTASKS_PER_NODE") if env.get(name)), None)
    counts = tasks_per_node(per_node[1], per_node[0]) if per_node else [world // nodes] * nodes
    local_world = counts[node] if node < len(counts) else counts[-1]
    out["LOCAL_WORLD_SIZE"] = str(local_world)
    out["LOCAL_RANK"] = str(local if local is not None else rank % max(local_world, 1))
    if not env.get("MASTER_ADDR"):
        name, hosts = next(((n, env[n]) for n in ("SLURM_STEP_NODELIST", "SLURM_JOB_NODELIST", "SLURM_NODELIST")
                            if env.get(n)), (None, None))
        if hosts is None:
            if nodes > 1:
                raise LaunchError("srun: no SLURM_JOB_NODELIST to find the first node in; export MASTER_ADDR=HOST "
                                  "(the host of task 0)")
            out["MASTER_ADDR"] = "127.0.0.1"
        else:
            out["MASTER_ADDR"] = expand_hostlist(hosts, name)[0]
    if not env.get("MASTER_PORT"):
        out["MASTER_PORT"] = str(slurm_port(env))
    return out


def apply_slurm_env(environ=None) -> dict[str, str]:
    """Set torchrun's variables from SLURM's in ``environ`` (default ``os.environ``) when ``srun`` started this
    process without torchrun (:func:`slurm_env`); returns what was set (``{}``: nothing to do)."""
    environ = os.environ if environ is None else environ
    values = slurm_env(environ)
    environ.update(values)
    return values
