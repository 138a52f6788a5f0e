"""Multi-node launches on one machine (gloo, one rank per "node"): ``pai-zoo train`` under two torchrun agents that
meet through c10d's rendezvous on localhost (``--nnodes 2 --nproc-per-node 1 --node-rank 0|1``), and under an
emulated ``srun`` (two plain processes with SLURM's variables, no torchrun: pai-zoo maps them onto torchrun's),
repeat the losses of one node with two ranks (the session's worker group, as ``torchrun --nproc-per-node 2``) step
for step, bit for bit: data parallelism over two nodes is the same all-reduce as over two local ranks. ``pai-zoo
eval`` of the trained checkpoint under the 2-node launch equals the same eval on one node.

Each launch runs with ``LOCAL_WORLD_SIZE=1`` beside ``WORLD_SIZE=2``, so pai-zoo takes it for two machines: the
scratch folders every rank reads go to ``$PAI_ZOO_SHARED_TMPDIR`` and every rank checks that it sees ``--save``."""
from __future__ import annotations

import json
import os
import random
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from pai_zoo.util.dist import TORCHRUN_ENV
from pai_zoo_conformance.cli_runs import run_cli_on_ranks

pytestmark = pytest.mark.megatron_once(first=True)  # launching does not depend on megatron-core's version

REPO = Path(__file__).resolve().parents[1]
SMALL = dict(vocab_size=300, num_hidden_layers=2, hidden_size=48, num_attention_heads=4, num_key_value_heads=2,
             head_dim=12, intermediate_size=96)
STEPS = 3


def _port(low: int = 10000, high: int = 30000) -> int:
    """A free TCP port in [low, high) (SLURM's derived ports are in 10000-29999)."""
    for _ in range(200):
        port = random.randrange(low, high)
        with socket.socket() as s:
            try:
                s.bind(("127.0.0.1", port))
            except OSError:
                continue
            return port
    raise RuntimeError("no free port")


def _env(extra: dict, tmp: Path) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in TORCHRUN_ENV and not k.startswith(("TORCHELASTIC_", "SLURM_"))}
    return {**env, "OMP_NUM_THREADS": "1", "PAI_ZOO_SHARED_TMPDIR": str(tmp / "shared-tmp"), **extra}


def _train_args(setup: Path, save: Path) -> list[str]:
    return ["train", "--model", str(setup / "hf"), "--data", str(setup / "toy_text_document"), "--save", str(save),
            "--global-batch-size", "4", "--micro-batch-size", "1", "--seq-length", "32", "--train-iters",
            str(STEPS), "--lr-warmup-iters", "1", "--lr", "3e-3", "--min-lr", "3e-4", "--save-interval", str(STEPS),
            "--no-progress"]


def _eval_args(setup: Path, save: Path, out: Path) -> list[str]:
    return ["eval", str(save), "--data", str(setup / "toy_text_document"), "--seq-length", "32", "--max-tokens",
            "256", "--no-progress", "--output", str(out)]


def _losses(save: Path) -> list[float]:
    return [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()]


def _eval_loss(out: Path) -> tuple[float, int]:
    blend = json.loads(out.read_text())["blend"]
    return blend["loss"], blend["tokens"]


def _start(argv: list[str], log: Path, **kwargs) -> subprocess.Popen:
    with log.open("w") as out:  # a file, not a pipe that nobody reads while the worker ranks train
        return subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, **kwargs)


def _wait(procs: list[subprocess.Popen], logs: list[Path], timeout=600) -> list[str]:
    """Each process's output, once all have ended with 0."""
    for proc in procs:
        proc.wait(timeout=timeout)
    outs = [log.read_text() for log in logs]
    for proc, out in zip(procs, outs):
        assert proc.returncode == 0, out[-6000:]
    return outs


@pytest.fixture(scope="module")
def runs(tmp_path_factory, pai_zoo_workers):
    """The three launches: the 2-node torchrun and the emulated srun start first, then one node's two worker ranks
    train while they import torch (the subprocesses run at the same time: the wall time of the slowest)."""
    from pai_zoo_conformance.toy_runs import write_toy_model_and_data

    root = write_toy_model_and_data(tmp_path_factory.mktemp("multinode"), documents=80, seed=5, **SMALL)

    # two torchrun agents, one "node" each, c10d rendezvous on localhost; train, then eval its checkpoint
    commands = root / "commands.json"
    commands.write_text(json.dumps([_train_args(root, root / "two_nodes"),
                                    _eval_args(root, root / "two_nodes", root / "eval_two_nodes.json")]))
    endpoint = f"localhost:{_port()}"
    node_logs = [root / f"node{node}.log" for node in range(2)]
    procs = [_start([sys.executable, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                     "--node-rank", str(node), "--rdzv-backend", "c10d", "--rdzv-endpoint", endpoint, "--rdzv-id",
                     f"pai-zoo-{endpoint}", str(REPO / "tests" / "multinode_worker.py"), str(commands)],
                    node_logs[node], cwd=root, env=_env({}, root)) for node in range(2)]
    try:
        # srun without torchrun: 2 tasks on 2 nodes; the first host of the compressed node list and the job's port
        port = _port()
        slurm = {"SLURM_JOB_ID": str(port - 10000 + 20000 * 7), "SLURM_STEP_ID": "0", "SLURM_STEP_NUM_TASKS": "2",
                 "SLURM_NTASKS": "2", "SLURM_STEP_NUM_NODES": "2", "SLURM_NNODES": "2",
                 "SLURM_JOB_NODELIST": "127.0.0.[1-2]", "SLURM_STEP_TASKS_PER_NODE": "1(x2)", "SLURM_LOCALID": "0"}
        task_logs = [root / f"task{r}.log" for r in range(2)]
        procs += [_start([sys.executable, "-m", "pai_zoo.cli", *_train_args(root, root / "srun")], task_logs[r],
                         cwd=root, env=_env({**slurm, "SLURM_PROCID": str(r), "SLURM_NODEID": str(r)}, root))
                  for r in range(2)]

        # one node, two ranks: the session's worker group (as torchrun --nproc-per-node 2)
        proc = run_cli_on_ranks(_train_args(root, root / "one_node"), timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        proc = run_cli_on_ranks(_eval_args(root, root / "one_node", root / "eval_one_node.json"), timeout=600)
        assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
        return root, _wait(procs[:2], node_logs), _wait(procs[2:], task_logs)
    finally:
        for p in procs:
            if p.poll() is None:
                p.kill()
                p.wait()


def test_two_torchrun_nodes_repeat_one_node_with_two_ranks(runs):
    root, out, _ = runs
    want = _losses(root / "one_node")
    assert len(want) == STEPS and all(loss > 0 for loss in want)
    assert _losses(root / "two_nodes") == want  # exact: the same all-reduce over gloo
    assert f"trained {root / 'hf'} -> {root / 'two_nodes'}: step {STEPS}" in out[0]  # rank 0 (node 0) reports
    assert "trained" not in out[1]
    assert not list((root / "shared-tmp").iterdir())  # eval's scratch was made there and removed


def test_eval_under_two_nodes_equals_one_node(runs):
    root, _, _ = runs
    got, want = _eval_loss(root / "eval_two_nodes.json"), _eval_loss(root / "eval_one_node.json")
    assert got == want and want[1] == 256, (got, want)  # the same tokens, the same loss (the weights are equal)


def test_srun_without_torchrun_repeats_one_node(runs):
    root, _, out = runs
    assert _losses(root / "srun") == _losses(root / "one_node")
    assert f"trained {root / 'hf'} -> {root / 'srun'}: step {STEPS}" in out[0] and "trained" not in out[1]
