"""``pai-zoo train``'s reporting and run control: the start-up summary, the save lines and the ETA; SIGINT, SIGTERM
and SIGUSR1 saving the step in progress and stopping (or at once on the second signal) with exit 130/143/138 and no
traceback; ``extend``; checkpoint retention (``keep_last``) and weights-only checkpoints (``save_optim=False``)."""
from __future__ import annotations

import importlib.util
import json
import re
import shutil
from pathlib import Path

import pytest

from pai_zoo.training.config import TrainConfig, TrainConfigError

_spec = importlib.util.spec_from_file_location("_train_helpers", Path(__file__).with_name("test_train.py"))
_tt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(_tt)
setup = _tt.setup  # the tiny Llama HF folder and toy corpus (a module fixture)
train_args, run, losses = _tt.train_args, _tt.run, _tt.losses
STEPS, GBS, SEQ = _tt.STEPS, _tt.GBS, _tt.SEQ


def records(save) -> list[dict]:
    return [json.loads(line) for line in (Path(save) / "metrics.jsonl").read_text().splitlines()]


def iterations(save) -> list[int]:
    return sorted(int(p.name[5:]) for p in Path(save).glob("iter_*") if p.name[5:].isdigit())


@pytest.fixture(scope="module")
def reported(setup):
    """A plain run (8 steps, a checkpoint every 2) and what it printed."""
    save = setup / "reported"
    proc = run(train_args(setup, save))
    return save, proc.stdout


def test_startup_summary_comes_once_before_step_one(setup, reported):
    save, out = reported
    lines = out.splitlines()
    first_step = next(i for i, line in enumerate(lines) if line.startswith("step 1/8 "))
    head = "\n".join(lines[:first_step])
    assert not re.search(r"^(step \d|saved checkpoint)", head, re.M), head
    assert re.search(rf"^model: {re.escape(str(setup / 'hf'))} \(llama\), [\d,]+ parameters", head, re.M), head
    assert "layout: 1 process = TP 1 x PP 1 x DP 1; 4 micro-batches of 1 per step (global batch 4)" in head
    assert f"steps: 8 x {GBS * SEQ} tokens per step ({GBS} x {SEQ}) = {8 * GBS * SEQ:,} tokens; warm-up 1 step," in head
    assert f"data: {setup / 'toy_text_document'}" in head
    assert f"logs: {save / 'metrics.jsonl'}; checkpoints: {save}/iter_* every 2 steps" in head
    assert out.count("model: ") == 1 and out.count("layout: ") == 1


def test_parameter_count_is_the_models(setup, reported):
    import pai_zoo

    _, out = reported
    count = int(re.search(r"\), ([\d,]+) parameters", out).group(1).replace(",", ""))
    hf = pai_zoo.load(setup / "hf", backend="hf").model  # Megatron pads the vocabulary (300 -> 384 rows): not counted
    assert count == sum(p.numel() for p in hf.parameters())


def test_summary_under_tensor_parallelism_counts_each_parameter_once(setup, reported):
    _, out = reported
    save = setup / "summary-tp2"
    proc = run(train_args(setup, save, "--tp", "2", "--train-tokens", str(2 * GBS * SEQ)), nproc=2)
    assert proc.stdout.count("layout: ") == 1  # rank 0 only
    assert "layout: 2 processes = TP 2 x PP 1 x DP 1; 4 micro-batches of 1 per step" in proc.stdout
    count = re.compile(r"\), ([\d,]+) parameters")
    # the same count, although TP 2 pads the vocabulary to 512 rows where one process pads it to 384
    assert count.search(proc.stdout).group(1) == count.search(out).group(1)


def test_each_save_is_reported_and_steps_show_an_eta(reported):
    save, out = reported
    for step in (2, 4, 6, 8):
        assert re.search(rf"^saved checkpoint iter_{step:07d} \(step {step}\) in \d+\.\d s$", out, re.M), out
    step_lines = [line for line in out.splitlines() if line.startswith("step ")]
    assert len(step_lines) == STEPS
    assert all(re.search(r" \| ETA (\d+s|\d+m\d\ds)$", line) for line in step_lines), step_lines
    assert step_lines[-1].endswith("| ETA 0s")


def test_eta_and_duration_format():
    from pai_zoo.util.progress import ETA, format_duration

    assert [format_duration(s) for s in (0.4, 45, 185, 7620, 3 * 86400 + 4 * 3600)] == \
        ["0s", "45s", "3m05s", "2h07m", "3d04h"]
    eta = ETA(start_step=4, total=10)
    assert eta.seconds(4) is None
    eta.start -= 2.0  # two seconds for the first step of this process: six more to go
    assert eta.seconds(5) == pytest.approx(10.0, rel=0.05)


# -- signals -------------------------------------------------------------------------------------
@pytest.mark.megatron_once  # pai-zoo's signal handling (the saves themselves: tests/test_train.py, both passes)
@pytest.mark.parametrize("moment, code", [("sigint", 130), ("sigterm", 143), ("sigusr1", 138)])
def test_a_signal_saves_the_step_in_progress_and_the_same_command_resumes_from_it(setup, reported, moment, code):
    """Ctrl-C, SIGTERM and SLURM's SIGUSR1 before the first save (the save interval is longer than the run): the
    step in progress finishes and is saved, one line says where and how to resume, and the same command resumes
    from that step (Ctrl-C's), repeating the uninterrupted run's losses bit for bit."""
    baseline, _ = reported
    save = setup / moment
    args = train_args(setup, save, "--save-interval", "100")
    proc = run(args, wrapper=(moment, "3"), check=False)
    assert proc.returncode == code, proc.stderr[-3000:]
    assert proc.stderr.strip().splitlines()[-1] == \
        f"pai-zoo: interrupted at step 3: saved {save}/iter_0000003; rerun the same command to resume from step 3"
    assert "Traceback" not in proc.stderr and "Traceback" not in proc.stdout and "KeyboardInterrupt" not in proc.stderr
    assert [r["step"] for r in records(save)] == [1, 2, 3]  # step 3 finished, step 4 never started
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "3" and iterations(save) == [3]
    assert not list(save.glob("*.tmp"))
    if moment != "sigint":
        return  # the same checkpoint as Ctrl-C's: resumed once, below
    resumed = run(args)
    assert f"resuming {save} at step 3 of {STEPS}" in resumed.stdout
    assert losses(save) == losses(baseline)  # bit for bit


@pytest.mark.megatron_once(first=True)  # pai-zoo's signal handling
def test_ctrl_c_to_the_process_group_still_saves_the_step_in_progress(setup):
    """Ctrl-C reaches every process of the terminal's group (megatron's checkpoint-writer helper too): the run still
    finishes the step's save, and no process prints a traceback. The step was a save step: it is saved once."""
    save = setup / "sigint-group"
    proc = run(train_args(setup, save), wrapper=("sigint-group", "4"), check=False)
    assert proc.returncode == 130, proc.stderr[-3000:]
    assert f"pai-zoo: interrupted at step 4: saved {save}/iter_0000004; rerun the same command to resume from " \
        "step 4" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert proc.stdout.count("saved checkpoint iter_0000004 ") == 1
    assert iterations(save) == [2, 4] and (save / "latest_checkpointed_iteration.txt").read_text() == "4"


@pytest.mark.megatron_once(first=True)  # pai-zoo's signal handling
def test_a_second_sigint_stops_at_once(setup):
    save = setup / "sigint2"
    proc = run(train_args(setup, save), wrapper=("sigint2", "4"), check=False)
    assert proc.returncode == 130, proc.stderr[-3000:]
    # the step's save did not happen: the last checkpoint, intact, is step 2's
    assert f"pai-zoo: interrupted at step 4; last checkpoint {save}/iter_0000002; rerun the same command to resume " \
        "from step 2" in proc.stderr
    assert "Traceback" not in proc.stderr
    assert iterations(save) == [2] and (save / "latest_checkpointed_iteration.txt").read_text() == "2"
    assert not list(save.glob("*.tmp"))


def test_cli_maps_interrupted_to_its_exit_code_and_line(monkeypatch, capsys):
    import signal

    import pai_zoo.cli.list
    from pai_zoo import cli
    from pai_zoo.util.interrupt import Interrupted

    def command_raising(exc):
        def run(args):
            raise exc

        monkeypatch.setattr(pai_zoo.cli.list, "run", run)

    line = "interrupted at step 1; no checkpoint yet; rerun the same command to start"
    command_raising(Interrupted(signal.SIGTERM, line))
    assert cli.main(["list"]) == 143 and capsys.readouterr().err == f"pai-zoo: {line}\n"
    command_raising(Interrupted(signal.SIGUSR1, line))
    assert cli.main(["list"]) == 138 and capsys.readouterr().err == f"pai-zoo: {line}\n"
    command_raising(Interrupted(signal.SIGINT, ""))
    assert cli.main(["list"]) == 130 and capsys.readouterr().err == ""  # ranks other than 0 print nothing
    command_raising(KeyboardInterrupt())
    assert cli.main(["list"]) == 130 and capsys.readouterr().err == "pai-zoo: interrupted\n"


# -- in-process runs: extend, keep_last, save_optim ----------------------------------------------
def config(setup, save, steps=STEPS, **settings) -> TrainConfig:
    return TrainConfig(model=str(setup / "hf"), data=[str(setup / "toy_text_document")], save=str(save),
                       global_batch_size=GBS, batch_size=1, sequence_length=SEQ, train_tokens=steps * GBS * SEQ,
                       warmup_tokens=GBS * SEQ, learning_rate=3e-3, min_learning_rate=3e-4, save_interval=2,
                       progress=False, **settings)


def train_here(cfg) -> list[str]:
    from pai_zoo.training.trainer import train

    lines: list[str] = []
    train(cfg, echo=lines.append)
    return lines


def test_extend_continues_a_finished_run_with_the_schedule_recomputed(setup, reported):
    baseline, _ = reported
    save = setup / "extended"
    shutil.copytree(baseline, save)
    with pytest.raises(TrainConfigError) as e:
        train_here(config(setup, save, steps=12))
    assert "holds a run of 8 steps" in str(e.value) and "--extend" in e.value.hint
    with pytest.raises(TrainConfigError, match="would shorten it"):
        train_here(config(setup, save, steps=6, extend=True))
    lines = train_here(config(setup, save, steps=12, extend=True, keep_last=1))
    said = "\n".join(lines)
    assert "extending the run from step 8 (8 planned) to step 12: the learning-rate schedule is recomputed for 12 " \
           "steps (warm-up 1, cosine decay to 0.0003 at step 12) and continues from step 8 at" in said, said
    log = records(save)
    assert [r["step"] for r in log] == list(range(1, 13)) and losses(save)[:8] == losses(baseline)
    assert log[8]["lr"] > 2 * log[7]["lr"]  # the new schedule's value at step 9, above the old floor
    assert all(a["lr"] > b["lr"] for a, b in zip(log[8:], log[9:]))
    assert log[-1]["lr"] == pytest.approx(3e-4)
    # keep_last 1: the newest and the one resumed from
    assert iterations(save) == [8, 12]
    assert "saved checkpoint iter_0000012 (step 12) in" in said and "removed iter_0000010 (keep last 1)" in said
    assert not list(save.glob("*.deleting"))
    assert "already trained for 12 steps" in "\n".join(train_here(config(setup, save, steps=12, extend=True)))


def test_keep_last_keeps_the_newest(setup, tmp_path):
    from pai_zoo.training.run_checkpoint import prune_checkpoints

    for n in (2, 4, 6, 8, 10):
        (tmp_path / f"iter_{n:07d}").mkdir()
    (tmp_path / "iter_0000012.tmp").mkdir()
    (tmp_path / "iter_0000001.deleting").mkdir()  # a leftover of a killed prune
    removed = prune_checkpoints(tmp_path, 2, protect=(4, None))
    assert [p.name for p in removed] == ["iter_0000002", "iter_0000006"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["iter_0000004", "iter_0000008", "iter_0000010",
                                                          "iter_0000012.tmp"]
    assert prune_checkpoints(tmp_path, 0) == []


def test_weights_only_checkpoints_are_smaller_and_resume_with_a_warning(setup, reported):
    import pai_zoo

    baseline, _ = reported
    save = setup / "weights-only"
    lines = train_here(config(setup, save, steps=4, save_optim=False))
    assert "saved checkpoint iter_0000004 (step 4, weights only) in" in "\n".join(lines)
    assert any(line.endswith("; weights only (no optimizer state)") for line in lines)

    def size(path):
        return sum(f.stat().st_size for f in Path(path).rglob("*") if f.is_file())

    assert size(save / "iter_0000004") < 0.6 * size(baseline / "iter_0000004")
    assert len(losses(save)) == 4
    assert pai_zoo.load(save, backend="mcore").model is not None  # the weights read back
    lines = train_here(config(setup, save, steps=6, save_optim=False, extend=True))
    assert any(line.startswith("warning: iter_0000004 holds no optimizer state") for line in lines), lines
    assert [r["step"] for r in records(save)] == list(range(1, 7))


def test_cli_flags_extend_keep_last_and_no_save_optim(setup, reported):
    baseline, _ = reported
    save = setup / "cli-extended"
    shutil.copytree(baseline, save)
    ten = ["--train-tokens", str(10 * GBS * SEQ)]
    refused = run(train_args(setup, save, *ten), check=False)
    assert refused.returncode == 1 and "hint: add --extend" in refused.stderr
    proc = run(train_args(setup, save, *ten, "--extend", "--keep-last", "1", "--no-save-optim"))
    assert "extending the run from step 8 (8 planned) to step 10:" in proc.stdout
    assert "saved checkpoint iter_0000010 (step 10, weights only) in" in proc.stdout
    assert iterations(save) == [8, 10]  # the newest, and the one resumed from
    assert [r["step"] for r in records(save)] == list(range(1, 11))


def test_progress_bar_ends_its_line_before_other_output():
    import io

    from pai_zoo.training.display import StepDisplay

    stream = io.StringIO()
    bar = StepDisplay(8, enabled=True)
    bar.stream = stream
    bar.break_line()
    assert stream.getvalue() == ""  # nothing shown yet: nothing to end
    bar.show({"step": 2, "loss": 1.0, "lr": 1e-3, "grad_norm": 0.5, "tokens_per_s": 100.0}, eta=30)
    assert stream.getvalue().startswith("\r[#####---------------] step 2/8 |") and "| ETA 30s" in stream.getvalue()
    bar.break_line()
    bar.close()  # the line is already ended: no blank line
    assert stream.getvalue().endswith("ETA 30s\x1b[K\n")
