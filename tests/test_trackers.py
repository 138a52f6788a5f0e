"""TensorBoard and W&B (``--tensorboard-dir``, ``--wandb-project``: pai_zoo.util.trackers) for ``train``, ``rl`` and
``eval``, read back with TensorBoard's own reader (``EventAccumulator``, which applies a resumed writer's purge) and
W&B's own (``wandb.sdk.internal.datastore.DataStore`` over the offline run's ``.wandb`` log, its records parsed as
``wandb_internal_pb2.Record``). W&B runs offline (``WANDB_MODE=offline``): nothing touches the network.

The logged values are compared with metrics.jsonl's: W&B's exactly (its history holds JSON numbers, the same doubles);
TensorBoard's to float32 (a scalar event stores a 32-bit ``simple_value``): ``float32(jsonl) == event`` exactly.
"""
from __future__ import annotations

import json
import os
import sys
import time
from pathlib import Path

import numpy as np
import pytest

from pai_zoo.plugin.errors import SettingError
from pai_zoo.util.trackers import Trackers, TrackerSettings, scalar_names
from pai_zoo_conformance.cli_runs import run_cli, run_cli_on_ranks

pytestmark = pytest.mark.megatron_once  # pai-zoo's logging; the losses themselves are checked in every pass

REPO = Path(__file__).resolve().parents[1]
STEPS, GBS, SEQ = 6, 4, 32
EXTENDED = 8  # the resumed run, extended


def tensorboard(folder) -> dict[str, list[tuple[int, float]]]:
    """Every scalar tag of a TensorBoard folder as (step, value) pairs, as TensorBoard shows them."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    acc = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    acc.Reload()
    return {tag: [(e.step, e.value) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def wandb_runs(folder, finished: int = 0) -> list[dict]:
    """Each offline W&B run under ``folder`` (its ``.wandb`` log, in file-name order): its id, name, project and
    history rows ``{step: {key: value}}``. W&B's service writes the log in the background: the last ``finished`` runs
    are read again (for up to a minute) until their exit record is there."""
    paths = sorted(Path(folder).rglob("run-*.wandb"))
    runs = [_wandb_run(path) for path in paths]
    for i in range(len(runs) - finished, len(runs)):
        deadline = time.monotonic() + 60
        while not runs[i]["exited"] and time.monotonic() < deadline:
            time.sleep(0.2)
            runs[i] = _wandb_run(paths[i])
    return runs


def _wandb_run(path) -> dict:
    from wandb.proto import wandb_internal_pb2
    from wandb.sdk.internal.datastore import DataStore

    store = DataStore()
    store.open_for_scan(str(path))
    run: dict = {"history": {}, "exited": False}
    while (data := store.scan_data()) is not None:
        record = wandb_internal_pb2.Record()
        record.ParseFromString(data)
        kind = record.WhichOneof("record_type")
        if kind == "run":
            run.update(id=record.run.run_id, name=record.run.display_name, project=record.run.project)
        elif kind == "history":
            items = ((item.key or "/".join(item.nested_key), item.value_json) for item in record.history.item)
            row = {key: json.loads(value) for key, value in items if not key.startswith("_")}
            run["history"].setdefault(record.history.step.num, {}).update(row)
        elif kind == "exit":
            run["exited"] = True
    return run


def records(save) -> list[dict]:
    return [json.loads(line) for line in (Path(save) / "metrics.jsonl").read_text().splitlines()]


def f32(x: float) -> float:
    return float(np.float32(x))


@pytest.fixture(scope="module")
def offline(tmp_path_factory):
    """W&B offline and silent, its default folder in a temporary one (the worker ranks take this environment)."""
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("WANDB_MODE", "offline")
        mp.setenv("WANDB_SILENT", "true")
        mp.setenv("WANDB_DIR", str(tmp_path_factory.mktemp("wandb")))
        yield


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    from pai_zoo_conformance.toy_runs import write_toy_model_and_data

    return write_toy_model_and_data(tmp_path_factory.mktemp("trackers"), documents=150)


def train_args(setup, save, *extra):
    return ["--model", setup / "hf", "--data", setup / "toy_text_document", "--save", save, "--global-batch-size",
            GBS, "--batch-size", 1, "--seq-length", SEQ, "--train-iters", STEPS, "--lr-warmup-iters", 1, "--lr",
            3e-3, "--min-lr", 3e-4, "--save-interval", 2, "--eval-interval", 3, "--eval-iters", 1, "--no-progress",
            *extra]


@pytest.fixture(scope="module")
def resumed(setup, offline):
    """A run killed after logging step 4, before its step-4 checkpoint was published (so it resumes from step 2),
    resumed to step 6, then extended to step 8; TensorBoard into SAVE/tb, W&B into SAVE/wandb."""
    import subprocess

    save = setup / "resumed"
    args = [str(a) for a in train_args(setup, save, "--tensorboard-dir", save / "tb", "--wandb-project", "pai-zoo-test",
                                       "--wandb-exp-name", "resume")]
    killed = subprocess.run([sys.executable, str(REPO / "tests" / "train_interrupt.py"), "tracker", "4", "--", *args],
                            capture_output=True, text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert killed.returncode == -9, killed.stderr[-3000:]
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert [r["step"] for r in records(save)] == [1, 2, 3, 4]
    first = {"tb": tensorboard(save / "tb"), "wandb": wandb_runs(save / "wandb")}
    proc = run_cli(["train", *args])
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "resuming" in proc.stdout
    args[args.index("--train-iters") + 1] = str(EXTENDED)
    proc = run_cli(["train", *args, "--extend"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    return save, first


def test_a_resumed_run_logs_each_step_once_with_metrics_jsonls_values(resumed):
    save, first = resumed
    # the killed run had reached step 4 in TensorBoard (each log is flushed)
    assert [s for s, _ in first["tb"]["lm loss"]] == [1, 2, 3, 4]
    logged = records(save)
    train = [r for r in logged if "loss" in r]
    assert [r["step"] for r in train] == list(range(1, EXTENDED + 1))
    tb = tensorboard(save / "tb")
    for name, key in (("lm loss", "loss"), ("learning-rate", "lr"), ("grad-norm", "grad_norm")):
        assert tb[name] == [(r["step"], f32(r[key])) for r in train], name
    evals = [r for r in logged if "eval_loss" in r]
    assert [r["step"] for r in evals] == [3, 6]
    assert tb["lm loss validation"] == [(r["step"], f32(r["eval_loss"])) for r in evals]
    assert tb["lm loss validation ppl"] == [(r["step"], f32(r["eval_ppl"])) for r in evals]
    assert tb["batch-size"] == [(s, float(GBS)) for s in range(1, EXTENDED + 1)]
    assert tb["samples vs steps"] == [(s, float(s * GBS)) for s in range(1, EXTENDED + 1)]
    assert [s for s, _ in tb["iteration-time"]] == [s for s, _ in tb["throughput"]] == list(range(1, EXTENDED + 1))
    assert all(v > 0 for _, v in tb["throughput"])
    assert len(list((save / "tb").glob("events.out.tfevents.*"))) == 3  # the killed run's, the resumed, the extended


def test_wandb_resumes_the_same_run_and_continues_its_steps(resumed):
    """The resumed run continues the killed one's W&B run (its id kept in trackers.json) from the step after its
    checkpoint, as metrics.jsonl does, and the extended run after the last step: each of them logs each step once,
    metrics.jsonl's values exactly. (What the killed run had logged is whatever W&B's buffer held at SIGKILL: W&B
    keeps a run's first values of a repeated step, the same ones here.)"""
    save, _ = resumed
    *killed, again, extended = wandb_runs(save / "wandb", finished=2)
    run_id = json.loads((save / "trackers.json").read_text())["wandb_run_id"]
    assert again["id"] == extended["id"] == run_id and {r.get("id", run_id) for r in killed} == {run_id}
    assert (again["name"], again["project"]) == (extended["name"], extended["project"]) == ("resume", "pai-zoo-test")
    assert len(killed) <= 1 and all(set(r["history"]) <= {1, 2, 3, 4} for r in killed)
    assert sorted(again["history"]) == [3, 4, 5, 6] and sorted(extended["history"]) == [7, 8]
    history = {**again["history"], **extended["history"]}
    for r in records(save)[2:]:
        row = history[r["step"]]
        assert (row["lm loss"], row["learning-rate"], row["grad-norm"]) == (r["loss"], r["lr"], r["grad_norm"])
        if "eval_loss" in r:
            assert (row["lm loss validation"], row["lm loss validation ppl"]) == (r["eval_loss"], r["eval_ppl"])
        assert row["batch-size"] == GBS and row["samples vs steps"] == r["step"] * GBS


def test_eval_logs_the_held_out_loss_at_the_checkpoints_iteration(resumed, setup, tmp_path):
    save, _ = resumed
    out = tmp_path / "loss.json"
    proc = run_cli(["eval", save, "--data", setup / "toy_text_document", "--seq-length", SEQ, "--max-tokens", 256,
                    "--no-progress", "--output", out, "--tensorboard-dir", tmp_path / "tb", "--wandb-project",
                    "pai-zoo-eval", "--wandb-save-dir", tmp_path / "wb"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    blend = json.loads(out.read_text())["blend"]
    tb = tensorboard(tmp_path / "tb")
    assert tb["lm loss validation"] == [(EXTENDED, f32(blend["loss"]))]  # at the run's latest iteration
    assert tb["lm loss validation ppl"] == [(EXTENDED, f32(blend["perplexity"]))]
    (run,) = wandb_runs(tmp_path / "wb", finished=1)
    assert run["project"] == "pai-zoo-eval"
    want = {"lm loss validation": blend["loss"], "lm loss validation ppl": blend["perplexity"]}
    assert run["history"] == {EXTENDED: want}


def worker_pid() -> int:
    return os.getpid()


def test_pipeline_parallel_run_writes_one_event_file_from_the_last_stage(setup, offline, tmp_path, pai_zoo_workers):
    """PP=2 on the 2 worker ranks: rank 1 (the last stage) writes the TensorBoard events, rank 0 metrics.jsonl; the
    loss TensorBoard shows is metrics.jsonl's."""
    save = tmp_path / "pp2"
    argv = ["train", *train_args(setup, save, "--pp", 2, "--tensorboard-dir", tmp_path / "tb")]
    argv[argv.index("--train-iters") + 1] = 2
    proc = run_cli_on_ranks([str(a) for a in argv], timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (events,) = (tmp_path / "tb").glob("events.out.tfevents.*")
    pids = pai_zoo_workers.run(worker_pid)
    assert int(events.name.split(".")[-2]) == pids[1] != pids[0]
    assert tensorboard(tmp_path / "tb")["lm loss"] == [(r["step"], f32(r["loss"])) for r in records(save)]


def test_rl_logs_its_records_from_a_yaml_config(offline, tmp_path):
    """``pai-zoo rl ppo`` with the trackers as --config keys: PPO's records under their names, the shared ones
    under Megatron-LM's."""
    import random

    rng = random.Random(0)
    prompts = tmp_path / "prompts.jsonl"
    prompts.write_text("".join(json.dumps({"prompt": [rng.randrange(100, 1000) for _ in range(3)]}) + "\n"
                               for _ in range(8)))
    config = tmp_path / "ppo.yaml"
    config.write_text(f"tensorboard_dir: {tmp_path / 'tb'}\ntensorboard-log-interval: 1\nwandb_project: pai-zoo-rl\n")
    save = tmp_path / "ppo"
    proc = run_cli(["rl", "ppo", "--config", config, "--actor", "llama3-tiny", "--reward", "rule:fraction=10-209",
                    "--prompts", prompts, "--save", save, "--steps", 2, "--rollout-batch-size", 4,
                    "--mini-batch-size", 2, "--ppo-epochs", 1, "--max-new-tokens", 4])
    assert proc.returncode == 0, proc.stderr[-3000:]
    logged = records(save)
    tb = tensorboard(tmp_path / "tb")
    for name, key in (("reward", "reward"), ("kl", "kl"), ("policy_loss", "policy_loss"), ("learning-rate", "lr"),
                      ("grad-norm", "grad_norm"), ("tokens-per-second", "tokens_per_s")):
        assert tb[name] == [(r["step"], f32(r[key])) for r in logged], name
    (run,) = wandb_runs(save / "wandb", finished=1)
    assert run["project"] == "pai-zoo-rl"
    assert {step: row["reward"] for step, row in run["history"].items()} == {r["step"]: r["reward"] for r in logged}


# -- without a training run --------------------------------------------------------------------
def test_scalar_names_are_megatron_lms():
    record = {"step": 7, "loss": 2.5, "lr": 1e-4, "grad_norm": 0.5, "tokens_per_s": 900.0, "step_time": 0.25,
              "mtp_1_loss": 3.0, "eval_loss": 2.0, "eval_ppl": 7.4, "reward": 0.3, "seconds": 12.0, "note": "x"}
    assert scalar_names(record) == {"lm loss": 2.5, "learning-rate": 1e-4, "grad-norm": 0.5,
                                    "tokens-per-second": 900.0, "iteration-time": 0.25, "mtp_1 loss": 3.0,
                                    "lm loss validation": 2.0, "lm loss validation ppl": 7.4, "reward": 0.3}
    assert scalar_names({"step": 1, "loss": 0.7, "eval_loss": 0.6, "eval_rewards/chosen": 0.1}, "dpo loss") == {
        "dpo loss": 0.7, "dpo loss validation": 0.6, "rewards/chosen validation": 0.1}


def test_the_log_interval_keeps_validation_steps(offline, tmp_path):
    trackers = Trackers(TrackerSettings(tensorboard_dir=str(tmp_path), tensorboard_log_interval=2), writes=True)
    for step in range(1, 6):
        trackers.log({"step": step, "loss": float(step), **({"eval_loss": 9.0} if step == 3 else {})})
    trackers.close()
    tb = tensorboard(tmp_path)
    assert tb["lm loss"] == [(2, 2.0), (3, 3.0), (4, 4.0)]
    assert tb["lm loss validation"] == [(3, 9.0)]


def test_nothing_is_written_off_the_writing_rank(tmp_path):
    trackers = Trackers(TrackerSettings(tensorboard_dir=str(tmp_path / "tb")), writes=False)
    trackers.log({"step": 1, "loss": 1.0})
    trackers.close()
    assert not (tmp_path / "tb").exists()


@pytest.mark.parametrize("flag, package", [("tensorboard_dir", "tensorboard"), ("wandb_project", "wandb")])
def test_a_missing_package_is_one_line(monkeypatch, flag, package):
    import importlib.util

    find = importlib.util.find_spec
    monkeypatch.setattr(importlib.util, "find_spec", lambda name, *a: None if name == package else find(name, *a))
    with pytest.raises(SettingError) as e:
        TrackerSettings(**{flag: "x"}).check()
    assert str(e.value) == (f"--{flag.replace('_', '-')} needs the {package} package, which is not installed: pip "
                            f"install {package} (or pip install 'pai-zoo[trackers]')")
    with pytest.raises(SettingError, match="--tensorboard-log-interval 0: must be at least 1"):
        TrackerSettings(tensorboard_log_interval=0).check()


def test_train_takes_the_flags_and_yaml_keys(tmp_path):
    from pai_zoo.training.config import TrainConfig

    file = tmp_path / "run.yaml"
    file.write_text("model: m\ntensorboard_dir: tb\ntensorboard-log-interval: 5\nwandb_project: p\n")
    cfg = TrainConfig.load(file, {"--wandb-exp-name": "e", "--wandb-save-dir": "w", "--wandb-entity": "team"})
    assert cfg.trackers() == TrackerSettings(tensorboard_dir="tb", tensorboard_log_interval=5, wandb_project="p",
                                             wandb_exp_name="e", wandb_save_dir="w", wandb_entity="team")
