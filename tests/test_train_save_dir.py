"""``train --save DIR`` and ``rl NAME --save DIR`` under the output rule (issue 44): a folder of unrelated files is
refused unless ``--force``, an existing run is resumed, a run of another model is refused, an unwritable place is
refused before anything loads, and a failed run leaves no --save folder that it created. In-process ``main()``
calls: every case fails before a model is built."""
from __future__ import annotations

import errno
import json
import os
import signal
import time
from pathlib import Path

import numpy as np
import pytest

from pai_zoo.cli import main
from pai_zoo.data.indexed import IndexedDatasetWriter

pytestmark = pytest.mark.usefixtures("fresh_registry")  # tests/conftest.py


@pytest.fixture
def data(tmp_path) -> Path:
    """A dataset whose files exist but whose token 5000 is past llama3-tiny's vocabulary (1000): a run that gets past
    the --save checks stops at it, before any model is built."""
    with IndexedDatasetWriter(tmp_path / "data", np.int32) as writer:
        writer.add_document([1, 2, 5000])
    return tmp_path / "data"


def train(capsys, data, save, *extra) -> tuple[int, str]:
    code = main(["train", "--model", "llama3-tiny", "--data", str(data), "--save", str(save), "--train-iters", "2",
                 "--global-batch-size", "1", "--seq-length", "8", "--no-progress", *extra])
    err = capsys.readouterr().err
    return code, err


def fake_run(folder: Path, model: str = "llama3-tiny", family: str = "llama") -> Path:
    """The files of a run folder (no iteration yet): what the checks read."""
    folder.mkdir(parents=True)
    (folder / "train_config.json").write_text(json.dumps({"model": model}))
    (folder / "pai_zoo.json").write_text(json.dumps({"mcore_config": {"family": family, "arch": {}}}))
    (folder / "metrics.jsonl").write_text("")
    return folder


def one_error_line(err: str) -> str:
    lines = err.strip().splitlines()
    assert lines[0].startswith("pai-zoo: error: ") and "Traceback" not in err, err
    assert len(lines) == 1 or (len(lines) == 2 and lines[1].startswith("hint: ")), err
    return lines[0]


@pytest.mark.no_megatron
def test_unrelated_files_are_refused_in_one_line_before_anything_loads(tmp_path, data, capsys):
    save = tmp_path / "save"
    save.mkdir()
    (save / "notes.txt").write_text("mine\n")
    (save / "results").mkdir()
    start = time.perf_counter()
    code, err = train(capsys, data, save)
    assert time.perf_counter() - start < 2.0
    assert code == 1
    assert one_error_line(err) == (f"pai-zoo: error: {save} holds files that are not a pai-zoo training run "
                                   "(notes.txt, results); choose another --save or pass --force to train into it")
    assert sorted(os.listdir(save)) == ["notes.txt", "results"] and (save / "notes.txt").read_text() == "mine\n"
    model = tmp_path / "model"  # names a run also writes (hf/, pai_zoo.json) do not make a folder a run
    (model / "hf").mkdir(parents=True)
    (model / "pai_zoo.json").write_text("{}")
    code, err = train(capsys, data, model)
    assert code == 1 and "holds files that are not a pai-zoo training run (hf, pai_zoo.json)" in one_error_line(err)


@pytest.mark.no_megatron
def test_a_run_of_another_model_is_refused(tmp_path, data, capsys):
    save = fake_run(tmp_path / "save", model="smollm3-tiny", family="smollm3")
    code, err = train(capsys, data, save)
    assert code == 1
    line = one_error_line(err)
    assert f"{save} holds a training run of smollm3-tiny (smollm3), not of --model llama3-tiny" in line
    assert "family smollm3 -> llama" in line and "choose another --save" in line
    code, err = train(capsys, data, save, "--force")  # --force cannot make another model's run continue
    assert code == 1 and "cannot be resumed with another model" in err


@pytest.mark.no_megatron
def test_a_megatron_checkpoint_is_no_run_to_resume_and_temporaries_are_pai_zoos(tmp_path, data, capsys):
    converted = tmp_path / "converted"  # what convert --to mcore writes: a model to start from
    (converted / "iter_0000001").mkdir(parents=True)
    (converted / "latest_checkpointed_iteration.txt").write_text("1")
    (converted / "pai_zoo.json").write_text("{}")
    code, err = train(capsys, data, converted, "--force")
    assert code == 1 and one_error_line(err) == (
        f"pai-zoo: error: --save {converted}: a Megatron checkpoint (a model to start from, --model), not a pai-zoo "
        "training run to resume; choose another --save")
    from pai_zoo.training.save_dir import check_save_dir

    leftover = tmp_path / "leftover"  # only a temporary a killed pai-zoo process left: nothing of the user's
    leftover.mkdir()
    (leftover / ".metrics.jsonl.pai-zoo-tmp-999999").write_text("")
    assert check_save_dir(leftover) is False


@pytest.mark.no_megatron
@pytest.mark.parametrize("where", ["read-only parent", "a file"])
def test_an_unwritable_or_file_save_is_refused_at_once(tmp_path, data, capsys, monkeypatch, where):
    parent = tmp_path / "parent"
    parent.mkdir()
    if where == "a file":
        save = parent / "run"
        save.write_text("x")
        want = f"pai-zoo: error: --save {save}: a file, not a folder; choose another --save"
    else:
        from pai_zoo.util import outputs

        save = parent / "deeper" / "run"
        real = os.open

        def read_only(path, flags, *args):  # a read-only mount (file modes do not stop root)
            if Path(path).parent == parent and flags & os.O_CREAT:
                raise OSError(errno.EROFS, "Read-only file system", str(path))
            return real(path, flags, *args)

        monkeypatch.setattr(outputs.os, "open", read_only)
        want = f"pai-zoo: error: --save {save}: cannot write in {parent} (read-only file system, mount point " \
               f"{outputs.mount_point(parent)})"
    start = time.perf_counter()
    code, err = train(capsys, data, save)
    assert time.perf_counter() - start < 2.0
    assert code == 1 and one_error_line(err) == want
    assert not (parent / "deeper").exists()


def test_force_empty_folders_and_resumes_pass_the_check(tmp_path, data, capsys):
    """The check lets these through: the run goes on to the next check (the token past the vocabulary), and a folder
    that existed before is left as it was."""
    forced = tmp_path / "forced"
    forced.mkdir()
    (forced / "notes.txt").write_text("mine\n")
    empty = tmp_path / "empty"
    empty.mkdir()
    resumed = fake_run(tmp_path / "resumed")
    for save, extra in ((forced, ["--force"]), (empty, []), (resumed, [])):
        before = sorted(os.listdir(save))
        code, err = train(capsys, data, save, *extra)
        assert code == 1 and "5000" in one_error_line(err) and "--save" not in err, err
        assert sorted(os.listdir(save)) == before


def test_a_failed_run_leaves_no_save_folder_it_created(tmp_path, data, capsys, monkeypatch):
    save = tmp_path / "new" / "run"
    code, err = train(capsys, data, save)  # the bad token: refused before the folder is made
    assert code == 1 and "5000" in err and not save.exists()

    from pai_zoo.plugin.errors import PaiZooError
    from pai_zoo.training import trainer

    def broken(self, source):  # as a truncated checkpoint fails: after the folder was made
        assert save.is_dir()
        raise PaiZooError("model.distcp: truncated")

    monkeypatch.setattr(trainer, "check_data", lambda cfg, vocab: None)
    monkeypatch.setattr(trainer.Trainer, "_build_model", broken)
    code, err = train(capsys, data, save)
    assert code == 1 and one_error_line(err) == "pai-zoo: error: model.distcp: truncated"
    assert not save.exists()

    def terminated(self, source):  # SIGTERM (or SLURM's SIGUSR1) while the model loads: nothing to save, stop now
        assert save.is_dir()
        os.kill(os.getpid(), signal.SIGTERM)

    monkeypatch.setattr(trainer.Trainer, "_build_model", terminated)
    code, err = train(capsys, data, save)
    assert code == 143 and err == ("pai-zoo: interrupted while setting up, before step 1; nothing was saved; rerun "
                                   "the same command to start\n")
    assert not save.exists()
    # a folder that was there before is kept, with what it held
    save.mkdir()
    (save / "keep.txt").write_text("x")
    code, err = train(capsys, data, save, "--force")
    assert code == 143 and os.listdir(save) == ["keep.txt"]


@pytest.mark.no_megatron
@pytest.mark.parametrize("trainer", ["ppo", "reward"])
def test_rl_save_follows_the_same_rule(tmp_path, capsys, trainer):
    save = tmp_path / "save"
    save.mkdir()
    (save / "notes.txt").write_text("mine\n")
    record = {"prompt": "hi"} if trainer == "ppo" else {"prompt": "a", "chosen": "b", "rejected": "c"}
    (tmp_path / "in.jsonl").write_text(json.dumps(record) + "\n")
    flags = (["--actor", "llama3-tiny", "--reward", "rule:fraction=1-9", "--prompts"] if trainer == "ppo" else
             ["--model", "llama3-tiny", "--data"])
    start = time.perf_counter()
    code = main(["rl", trainer, *flags, str(tmp_path / "in.jsonl"), "--save", str(save)])
    err = capsys.readouterr().err
    assert time.perf_counter() - start < 2.0
    assert code == 1 and one_error_line(err) == (
        f"pai-zoo: error: {save} holds files that are not a pai-zoo training run (notes.txt); choose another --save "
        "or pass --force to train into it")
    assert os.listdir(save) == ["notes.txt"]


@pytest.mark.no_megatron
def test_rl_loops_save_the_step_in_progress_on_a_signal(tmp_path):
    """pai_zoo.rl.stopping, as the RL trainers' loops call it: nothing before a signal; after SIGUSR1 the step is
    saved (unless it just was) and the run stops with exit 138 and the line; a second signal stops at once, unless it
    comes within the repeat window (torchrun forwarding the terminal's Ctrl-C to workers that got it already)."""
    from pai_zoo.rl.stopping import stop_here, stop_request
    from pai_zoo.util.interrupt import Interrupted

    saves = []
    folders = [tmp_path / "actor", tmp_path / "critic"]
    with stop_request(folders, lambda: 3) as stop:
        stop_here(stop, 3, 10, lambda: saves.append(3), False, folders)
        assert saves == []
        stop.repeat_window = 0.2
        os.kill(os.getpid(), signal.SIGUSR1)
        os.kill(os.getpid(), signal.SIGINT)  # at once: the same request delivered twice (torchrun forwards it)
        stop_here(stop, 10, 10, lambda: saves.append(10), False, folders)  # the last step: the run ends as usual
        with pytest.raises(Interrupted) as stopped:
            stop_here(stop, 3, 10, lambda: saves.append(3), False, folders)
        assert saves == [3] and stopped.value.exit_code == 138
        assert stopped.value.message == (f"interrupted at step 3: saved {tmp_path}/actor/iter_0000003 and "
                                         f"{tmp_path}/critic/iter_0000003; rerun the same command to resume from "
                                         "step 3")
        with pytest.raises(Interrupted):  # already saved at that step: not again
            stop_here(stop, 4, 10, lambda: saves.append(4), True, folders)
        assert saves == [3]
        time.sleep(0.3)
        with pytest.raises(Interrupted) as at_once:
            os.kill(os.getpid(), signal.SIGINT)
        assert at_once.value.exit_code == 130
        assert at_once.value.message == "interrupted at step 3; no checkpoint yet; rerun the same command to start"
    with pytest.raises(Interrupted) as reward:
        with stop_request([tmp_path], lambda: 5, resumes=False) as stop:
            os.kill(os.getpid(), signal.SIGTERM)
            stop_here(stop, 5, 9, lambda: None, False, [tmp_path], resumes=False)
    assert reward.value.exit_code == 143 and "this trainer does not resume" in reward.value.message
