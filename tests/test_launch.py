"""Launching on several machines without starting anything: SLURM's compressed host lists and tasks per node, the
mapping of ``srun``'s variables onto torchrun's (torchrun's own win), the CLI applying it, and ``train --plan --nodes
N --gpus-per-node M``: each node's torchrun command (read back by torchrun's own argument parser and pai-zoo's), the
sbatch script, and bad input in one line. tests/test_multinode.py runs the launches themselves."""
from __future__ import annotations

import shlex

import pytest

from pai_zoo.plugin.errors import PaiZooError
from pai_zoo.util.dist import TORCHRUN_ENV
from pai_zoo.util.launch import apply_slurm_env, expand_hostlist, slurm_env, slurm_port, tasks_per_node
from pai_zoo_conformance.cli_runs import main_result

pytestmark = pytest.mark.no_megatron


@pytest.mark.parametrize("text, hosts", [
    ("node01", ["node01"]),
    ("node[01-04,07]", ["node01", "node02", "node03", "node04", "node07"]),
    ("gpu[1-3],cpu5", ["gpu1", "gpu2", "gpu3", "cpu5"]),
    ("a[9-11]", ["a9", "a10", "a11"]),
    ("n[098-101]", ["n098", "n099", "n100", "n101"]),
    ("rack[1-2]-n[08,10]", ["rack1-n08", "rack1-n10", "rack2-n08", "rack2-n10"]),
    ("x[1],y[2-3],z", ["x1", "y2", "y3", "z"]),
    ("10.0.0.[5-6]", ["10.0.0.5", "10.0.0.6"]),
])
def test_slurm_host_lists_expand(text, hosts):
    assert expand_hostlist(text) == hosts


@pytest.mark.parametrize("text", ["node[01-", "node[a-b]", "", "node]1[", "node[3-1]", "n[1,,2]"])
def test_a_malformed_host_list_is_one_line_naming_the_variable(text):
    with pytest.raises(PaiZooError) as e:
        expand_hostlist(text, "SLURM_JOB_NODELIST")
    assert str(e.value).startswith(f"SLURM_JOB_NODELIST={text!r}: not a SLURM host list") and "\n" not in str(e.value)


def test_tasks_per_node():
    assert tasks_per_node("8(x4)") == [8, 8, 8, 8]
    assert tasks_per_node("2(x2),1") == [2, 2, 1]
    assert tasks_per_node("4") == [4]
    with pytest.raises(PaiZooError, match="SLURM_TASKS_PER_NODE='eight': not SLURM's tasks per node"):
        tasks_per_node("eight")


#: task 11 of ``srun --nodes 4 --ntasks-per-node 8`` in job 123456: node 1, its 4th task
SRUN = {"SLURM_JOB_ID": "123456", "SLURM_STEP_ID": "0", "SLURM_PROCID": "11", "SLURM_LOCALID": "3",
        "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "32", "SLURM_NTASKS": "32", "SLURM_STEP_NUM_NODES": "4",
        "SLURM_NNODES": "4", "SLURM_JOB_NODELIST": "gpu[07-09,12]", "SLURM_STEP_NODELIST": "gpu[07-09,12]",
        "SLURM_STEP_TASKS_PER_NODE": "8(x4)", "SLURM_TASKS_PER_NODE": "8(x4)", "SLURM_NTASKS_PER_NODE": "8"}


def test_srun_variables_become_torchruns():
    assert slurm_env(SRUN) == {"RANK": "11", "WORLD_SIZE": "32", "LOCAL_RANK": "3", "LOCAL_WORLD_SIZE": "8",
                               "GROUP_RANK": "1", "GROUP_WORLD_SIZE": "4", "MASTER_ADDR": "gpu07",
                               "MASTER_PORT": "13456"}  # 10000 + 123456 % 20000
    assert slurm_port({}) == 29500
    # an uneven step (2 tasks on the first node, 1 on the second): the second node's own count
    uneven = {**SRUN, "SLURM_PROCID": "2", "SLURM_LOCALID": "0", "SLURM_NODEID": "1", "SLURM_STEP_NUM_TASKS": "3",
              "SLURM_STEP_NUM_NODES": "2", "SLURM_STEP_NODELIST": "gpu[07-08]", "SLURM_STEP_TASKS_PER_NODE": "2,1"}
    assert slurm_env(uneven)["LOCAL_WORLD_SIZE"] == "1" and slurm_env(uneven)["WORLD_SIZE"] == "3"


def test_torchruns_variables_and_a_chosen_master_win():
    assert slurm_env({**SRUN, "RANK": "0", "WORLD_SIZE": "8"}) == {}  # srun torchrun ...: torchrun's
    chosen = slurm_env({**SRUN, "MASTER_ADDR": "head", "MASTER_PORT": "6000"})
    assert "MASTER_ADDR" not in chosen and "MASTER_PORT" not in chosen and chosen["RANK"] == "11"


@pytest.mark.parametrize("drop, extra", [
    (("SLURM_STEP_ID", "SLURM_STEP_NUM_TASKS"), {}),  # the batch script itself (no job step): one process
    ((), {"SLURM_STEP_NUM_TASKS": "1"}),  # srun -n 1
    (("SLURM_PROCID",), {}),  # an salloc shell
])
def test_no_srun_step_of_several_tasks_is_left_alone(drop, extra):
    env = {**{k: v for k, v in SRUN.items() if k not in drop}, **extra}
    assert slurm_env(env) == {}


def test_a_bad_slurm_variable_is_one_line():
    with pytest.raises(PaiZooError, match="^SLURM_PROCID='x': not a number$"):
        slurm_env({**SRUN, "SLURM_PROCID": "x"})
    with pytest.raises(PaiZooError, match="SLURM_PROCID=40 is outside the step's 32 tasks"):
        slurm_env({**SRUN, "SLURM_PROCID": "40"})


def test_apply_sets_the_environment_and_the_cli_applies_it(monkeypatch, capsys):
    env = dict(SRUN)
    assert apply_slurm_env(env)["RANK"] == "11" and env["RANK"] == "11" and env["MASTER_ADDR"] == "gpu07"
    for name in TORCHRUN_ENV:  # absent now, and absent again after the test
        monkeypatch.setenv(name, "0")
        monkeypatch.delenv(name)
    for name, value in SRUN.items():
        monkeypatch.setenv(name, value)
    import os

    code, _, err = main_result(["list"], capsys)
    assert code == 0, err
    assert (os.environ["RANK"], os.environ["WORLD_SIZE"], os.environ["LOCAL_RANK"]) == ("11", "32", "3")
    monkeypatch.setenv("SLURM_JOB_NODELIST", "gpu[07")
    monkeypatch.setenv("SLURM_STEP_NODELIST", "gpu[07")
    for name in TORCHRUN_ENV:
        monkeypatch.delenv(name, raising=False)
    code, _, err = main_result(["list"], capsys)
    assert code == 1 and err == "pai-zoo: error: SLURM_STEP_NODELIST='gpu[07': not a SLURM host list ('[' without " \
                                "']'); expected e.g. node[01-04,07]\n"


# ---------------------------------------------------------------------------------------------
# train --plan --nodes N --gpus-per-node M
# ---------------------------------------------------------------------------------------------
TRAIN = ["train", "--model", "qwen2-72b", "--tp", "8", "--pipeline-model-parallel-size", "4", "--bf16",
         "--seq-length", "4096", "--global-batch-size", "32", "--sequence-parallel", "--recompute-granularity",
         "selective", "--data", "0.7", "/data/a b", "0.3", "/data/c", "--save", "/shared/run"]


def _train_config(arguments: list[str]):
    """pai-zoo's own reading of ``pai-zoo ARGUMENTS``: its settings, and whether --plan's flags are among them."""
    from pai_zoo.cli import build_parser, parse
    from pai_zoo.cli.train import GIVEN
    from pai_zoo.training.config import TrainConfig

    args = parse(build_parser(), arguments)
    assert not args.plan and args.nodes is None and args.sbatch is None
    return TrainConfig.load(args.config, getattr(args, GIVEN))


def test_plan_prints_each_nodes_torchrun_command_and_an_sbatch_script(tmp_path, capsys):
    from torch.distributed.run import get_args_parser

    script = tmp_path / "job.sbatch"
    code, out, err = main_result([*TRAIN, "--plan", "--nodes", "4", "--gpus-per-node", "8", "--rdzv-endpoint",
                                  "gpu07:29400", "--sbatch", script], capsys)
    assert code == 0, err
    layout = next(line for line in out.splitlines() if line.startswith("layout: "))
    assert layout == "layout: 32 GPUs = TP 8 x PP 4 x DP 1"
    want = _train_config(TRAIN)
    commands = [shlex.split(line) for line in out.splitlines() if line.strip().startswith("torchrun ")]
    assert len(commands) == 4
    for rank, command in enumerate(commands):
        torchrun = get_args_parser().parse_args(command[1:])  # torchrun's own reading
        assert (torchrun.nnodes, torchrun.nproc_per_node, torchrun.node_rank) == ("4", "8", rank)
        assert (torchrun.rdzv_backend, torchrun.rdzv_endpoint, torchrun.module) == ("c10d", "gpu07:29400", True)
        assert torchrun.training_script == "pai_zoo.cli" and torchrun.training_script_args == TRAIN
        got = _train_config(torchrun.training_script_args)
        assert got.to_dict() == want.to_dict()
        assert int(torchrun.nnodes) * int(torchrun.nproc_per_node) == \
            got.tensor_parallel_size * got.pipeline_parallel_size * got.data_parallel_size(32)
    text = script.read_text()
    assert f"sbatch {script}" in out and text.startswith("#!/bin/bash\n")
    options = dict(line.removeprefix("#SBATCH --").split("=", 1) for line in text.splitlines()
                   if line.startswith("#SBATCH"))
    assert (options["nodes"], options["ntasks-per-node"], options["gpus-per-node"]) == ("4", "8", "8")
    srun = shlex.split(text.splitlines()[-1])
    assert srun[:2] == ["srun", "pai-zoo"] and srun[2:] == TRAIN
    # the script is never overwritten
    code, _, err = main_result([*TRAIN, "--plan", "--nodes", "4", "--gpus-per-node", "8", "--sbatch", script],
                               capsys)
    assert code == 1 and err == f"pai-zoo: error: --sbatch {script}: the file exists; remove it or choose another " \
                                "name\n" and script.read_text() == text


def test_plan_without_an_endpoint_leaves_master_addr_to_the_shell(capsys):
    code, out, err = main_result(["train", "--plan", "--model", "qwen2-72b", "--tp", "8", "--pp", "2", "--nodes", "2",
                                  "--gpus-per-node", "8"], capsys)
    assert code == 0, err
    assert "layout: 16 GPUs = TP 8 x PP 2 x DP 1" in out
    commands = [line.strip() for line in out.splitlines() if line.strip().startswith("torchrun ")]
    assert len(commands) == 2 and all("--rdzv-endpoint $MASTER_ADDR:29500 -m pai_zoo.cli" in c for c in commands)
    assert "export MASTER_ADDR=<node 0's host> on every node" in out
    assert "    srun pai-zoo train --model qwen2-72b --tp 8 --pp 2" in out.splitlines()


@pytest.mark.parametrize("extra, message", [
    (["--nodes", "0", "--gpus-per-node", "8"], "--nodes 0: must be 1 or more"),
    (["--nodes", "4", "--gpus-per-node", "6"], "--gpus-per-node 6 does not hold whole tensor-parallel groups of --tp 8 "
                                               "(each TP group stays on one node); use a multiple of 8"),
    (["--nodes", "3", "--gpus-per-node", "8"], "--nodes 3 x --gpus-per-node 8 = 24 GPUs does not hold whole model "
                                               "replicas of TP 8 x PP 4 = 32; use a multiple of 32 GPUs"),
    (["--nodes", "4"], "--nodes 4 needs --gpus-per-node M: the GPUs of each machine"),
    (["--gpus-per-node", "8"], "--gpus-per-node, --rdzv-endpoint and --sbatch need --nodes N"),
    (["--nodes", "4", "--gpus-per-node", "8", "--gpus", "16"], "--gpus 16 disagrees with --nodes 4 x --gpus-per-node "
                                                                "8 = 32; leave --gpus out"),
    (["--nodes", "4", "--gpus-per-node", "8", "--rdzv-endpoint", "gpu07"], "--rdzv-endpoint gpu07: expected HOST:PORT"),
])
def test_bad_launch_flags_are_one_line(extra, message, capsys):
    code, out, err = main_result(["train", "--plan", "--model", "qwen2-72b", "--tp", "8", "--pp", "4", *extra], capsys)
    assert code == 1 and err.startswith(f"pai-zoo: error: {message}") and err.count("\n") == 1, err
    assert "torchrun" not in out


def test_launch_flags_without_plan_are_refused(tmp_path, capsys):
    code, _, err = main_result(["train", "--model", "llama3-tiny", "--data", tmp_path / "d", "--save", tmp_path / "o",
                                "--nodes", "2"], capsys)
    assert code == 1 and "go with --plan" in err and err.count("\n") == 1, err
    assert not (tmp_path / "o").exists()
