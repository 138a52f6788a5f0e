"""``pai-zoo rl dpo`` and ``pai-zoo rl grpo`` end to end on a tiny Llama: learning on toy tasks, TP=2 and PP=2
equal to one process, exact resume after SIGKILL, a third party's reward function, and bad input refused in one
line with nothing written."""
from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

import pai_zoo
from pai_zoo.registry import get_registry
from pai_zoo_conformance.cli_runs import run_cli, run_cli_on_ranks

pytestmark = pytest.mark.megatron
# what does not depend on megatron-core's version runs in one pass; the parallel layouts (its schedules) in both
once = pytest.mark.megatron_once
INTERRUPT = Path(__file__).resolve().parents[3] / "tests" / "train_interrupt.py"
WORDS = "the cat sat on a mat with some red hats and blue dogs".split()
TARGET = r"^[a-m].*"  # the toy task: answer with a word that starts with a to m (1 in 8 tokens at random)


def _ok(proc):
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc


def _log(folder: Path) -> list[dict]:
    return [json.loads(line) for line in (folder / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def data(tmp_path_factory):
    root = tmp_path_factory.mktemp("rl")
    rng = random.Random(0)
    pairs = []
    for _ in range(48):  # chosen answers are ids 10-29, rejected ones 300-319: a preference a model can learn
        prompt = [rng.randrange(300, 1000) for _ in range(rng.randint(2, 5))]
        pairs.append({"prompt": prompt, "chosen": [rng.randrange(10, 30) for _ in range(rng.randint(1, 3))],
                      "rejected": [rng.randrange(300, 320) for _ in range(rng.randint(1, 3))]})
    (root / "pairs.jsonl").write_text("".join(json.dumps(p) + "\n" for p in pairs))
    prompts = [{"prompt": " ".join(rng.choice(WORDS) for _ in range(rng.randint(2, 5))), "pattern": TARGET}
               for _ in range(16)]
    (root / "prompts.jsonl").write_text("".join(json.dumps(p) + "\n" for p in prompts))
    # the model as a checkpoint: a preset's random weights depend on the layout that draws them (a pipeline stage
    # draws its own layers), a checkpoint's do not
    pai_zoo.load("llama3-tiny", backend="hf").model.save_pretrained(root / "model")
    get_registry().family("llama").test_tokenizer(root / "model")
    return root


def _dpo(data, save, *extra):
    return ["rl", "dpo", "--model", data / "model", "--data", data / "pairs.jsonl", "--save", save, "--batch-size",
            "8", "--lr", "3e-3", "--eval-fraction", "0.25", "--quiet", *extra]


def _grpo(data, save, *extra):
    return ["rl", "grpo", "--model", data / "model", "--data", data / "prompts.jsonl", "--save", save,
            "--reward-funcs", "format", "--num-generations", "8", "--batch-size", "4", "--max-completion-length", "2",
            "--lr", "1e-2", "--quiet", *extra]


@once
def test_dpo_raises_the_held_out_preference_accuracy(data, tmp_path):
    """12 held-out pairs, 36 trained on for 4 epochs: the reward accuracy on the held-out pairs starts at or below
    a half and ends at 0.75 or more."""
    _ok(run_cli(_dpo(data, tmp_path / "dpo", "--epochs", "4")))
    log = _log(tmp_path / "dpo")
    before, after = log[0], log[-1]
    assert before["step"] == 0 and after["step"] == 16
    assert before["eval_rewards/accuracies"] <= 0.5 and after["eval_rewards/accuracies"] >= 0.75, (before, after)
    assert after["eval_rewards/margins"] > before["eval_rewards/margins"] + 0.1
    steps = [r for r in log if "loss" in r]
    assert {"loss", "rewards/margins", "rewards/accuracies", "rewards/chosen", "rewards/rejected"} <= set(steps[0])
    assert steps[-1]["loss"] < steps[0]["loss"] - 0.1


@once
@pytest.mark.parametrize("seed", [0, 1])
def test_grpo_raises_the_mean_reward(data, tmp_path, seed):
    """On two seeds: the mean reward of the last 5 of 25 steps exceeds the first 5 steps' by 0.25 or more."""
    _ok(run_cli(_grpo(data, tmp_path / "grpo", "--steps", "25", "--seed", str(seed), "--beta", "0.04")))
    rewards = [r["reward"] for r in _log(tmp_path / "grpo")]
    assert len(rewards) == 25
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    assert last >= first + 0.25, rewards
    record = _log(tmp_path / "grpo")[-1]
    for key in ("reward", "kl", "reward_std", "rewards/format/mean", "clip_ratio/region_mean", "entropy",
                "completions/mean_length", "rollout_tokens_per_s", "train_tokens_per_s", "loss", "grad_norm"):
        assert key in record, key


def _same(a: list[dict], b: list[dict], keys: tuple[str, ...]) -> None:
    assert len(a) == len(b)
    for x, y in zip(a, b):
        for key in keys:
            if key in x:
                assert abs(x[key] - y[key]) <= 1e-5 * max(1.0, abs(x[key])), (key, x, y)


#: 2 steps each: the second (DPO) and the second rollout (GRPO) follow an optimizer update, so equal losses there
#: prove the layout's gradients and optimizer step too
PARALLEL_DPO = ("--epochs", "1", "--max-steps", "2", "--loss-type", "robust", "--label-smoothing", "0.1",
                "--no-precompute-ref")
PARALLEL_GRPO = ("--steps", "2", "--num-iterations", "2", "--beta", "0.1")


@pytest.fixture(scope="module")
def one_process(data, tmp_path_factory):
    """The one-process runs the parallel layouts are compared with (DPO, then GRPO), run once."""
    root = tmp_path_factory.mktemp("one")
    _ok(run_cli(_dpo(data, root / "dpo", *PARALLEL_DPO)))
    _ok(run_cli(_grpo(data, root / "grpo", *PARALLEL_GRPO)))
    return _log(root / "dpo"), _log(root / "grpo")


@pytest.mark.parametrize("layout", [pytest.param(("--tp", "2"), marks=once, id="layout0"),
                                    pytest.param(("--pp", "2"), marks=once, id="layout1"),
                                    pytest.param((), marks=once, id="dp")])
def test_parallel_layouts_equal_one_process(data, one_process, tmp_path, layout):
    """DPO (live reference, robust loss) and GRPO (two optimisation steps per rollout) at TP=2, PP=2 and DP=2 on
    the session's 2 worker ranks: the same losses, gradient norms, rewards and metrics as one process, step for
    step. The GRPO rollouts sample the same tokens (under PP a full forward per token through the stages): the
    rewards and completion lengths agree. (Under DP the per-token means a rank reports -- entropy, KL, clip
    fraction -- are averaged over the ranks as TRL averages them, not over the batch's tokens: not compared.)"""
    _ok(run_cli_on_ranks(_dpo(data, tmp_path / "dpo", *PARALLEL_DPO, *layout), timeout=600))
    _ok(run_cli_on_ranks(_grpo(data, tmp_path / "grpo", *PARALLEL_GRPO, *layout), timeout=600))
    dpo, grpo = one_process
    _same(dpo, _log(tmp_path / "dpo"),
          ("loss", "rewards/margins", "rewards/accuracies", "eval_loss", "eval_rewards/margins", "grad_norm"))
    per_token = ("kl", "clip_ratio/region_mean", "entropy") if layout else ()
    _same(grpo, _log(tmp_path / "grpo"),
          ("loss", "reward", "reward_std", "completions/mean_length", "grad_norm", *per_token))


@once
@pytest.mark.parametrize("trainer", ["dpo", "grpo"])
def test_a_killed_run_resumes_exactly(data, tmp_path, trainer):
    """DPO killed (SIGKILL) while publishing its step-4 checkpoint resumes from step 2; GRPO sent SIGTERM at step 3
    saves step 3 and stops with one line (pai_zoo.rl.stopping), and resumes from there. Either logs what an
    uninterrupted run logs."""
    build, extra = (_dpo, ("--epochs", "2", "--max-steps", "6")) if trainer == "dpo" else (_grpo, ("--steps", "6"))
    _ok(run_cli(build(data, tmp_path / "whole", *extra)))
    argv = [str(a) for a in build(data, tmp_path / "killed", *extra, "--save-every", "2")]
    moment, step = ("publish", "4") if trainer == "dpo" else ("sigterm", "3")
    killed = subprocess.run([sys.executable, str(INTERRUPT), moment, step, "--", *argv], capture_output=True,
                            text=True, timeout=600, env={**os.environ, "OMP_NUM_THREADS": "1"})
    assert killed.returncode == (-9 if trainer == "dpo" else 143), killed.stderr[-3000:]
    saved = (tmp_path / "killed" / "latest_checkpointed_iteration.txt").read_text().strip()
    if trainer == "grpo":
        assert saved == "3" and killed.stderr.strip().splitlines()[-1] == (
            f"pai-zoo: interrupted at step 3: saved {tmp_path / 'killed'}/iter_0000003; rerun the same command to "
            "resume from step 3")
    else:
        assert saved == "2"
    resumed = _ok(run_cli(build(data, tmp_path / "killed", *extra, "--save-every", "2")))
    assert f"resuming {tmp_path / 'killed'} at step {saved} of 6" in resumed.stderr
    whole, resumed = _log(tmp_path / "whole"), _log(tmp_path / "killed")
    assert [r["step"] for r in resumed] == [r["step"] for r in whole]
    _same(whole, resumed, ("loss", "reward", "rewards/margins", "eval_loss", "grad_norm"))


@once
def test_a_third_party_reward_function_is_found_and_used(data, tmp_path):
    """A package installed only as a distribution on the path (its entry point in a ``.dist-info``) registers a
    reward function through ``pai_zoo_reward_funcs``; ``rl grpo --help`` lists it and a run scores with it."""
    site = tmp_path / "site"
    (site / "pai_zoo_shortest").mkdir(parents=True)
    (site / "pai_zoo_shortest" / "__init__.py").write_text(
        "from pai_zoo import hookimpl\n\n\n"
        "def shortest(prompts, completions, **fields):\n"
        "    return [10.0 - len(c) for c in completions]\n\n\n"
        "@hookimpl\ndef pai_zoo_reward_funcs():\n    return {'shortest': shortest}\n")
    meta = site / "pai_zoo_shortest-0.1.dist-info"
    meta.mkdir()
    (meta / "METADATA").write_text("Metadata-Version: 2.1\nName: pai-zoo-shortest\nVersion: 0.1\n")
    (meta / "entry_points.txt").write_text("[pai_zoo]\nshortest = pai_zoo_shortest\n")
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")]),
           "OMP_NUM_THREADS": "1"}
    env.pop("PAI_ZOO_PLUGINS", None)
    script = ("import sys\nfrom pai_zoo.cli import main\nfrom pai_zoo.rl.reward_funcs import list_reward_funcs\n"
              "print(sorted(list_reward_funcs()))\nsys.exit(main(sys.argv[1:]))\n")
    argv = [str(a) for a in _grpo(data, tmp_path / "run", "--steps", "2")]
    argv[argv.index("format")] = "shortest,format"
    proc = subprocess.run([sys.executable, "-c", script, *argv], capture_output=True, text=True, env=env,
                          timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "['exact_match', 'format', 'shortest']" in proc.stdout
    record = _log(tmp_path / "run")[0]
    shortest, fmt = record["rewards/shortest/mean"], record["rewards/format/mean"]
    assert 0.0 < shortest < 10.0 and abs(record["reward"] - (shortest + fmt)) <= 1e-5  # the weighted sum, weights 1
    helped = subprocess.run([sys.executable, "-c", script, "rl", "grpo", "--help"], capture_output=True, text=True,
                            env=env, timeout=600)
    assert "registered: exact_match, format, shortest" in " ".join(helped.stdout.split()), helped.stdout


def _refused(argv, message: str, save: Path) -> None:
    proc = run_cli(argv)
    lines = proc.stderr.strip().splitlines()
    assert proc.returncode != 0 and len(lines) == 1 and message in lines[0], proc.stderr[-2000:]
    assert "Traceback" not in proc.stderr and not save.exists(), save


@once
def test_bad_input_is_refused_in_one_line_with_nothing_written(data, tmp_path):
    bad = tmp_path / "bad.jsonl"
    bad.write_text(json.dumps({"prompt": [400, 401], "chosen": [20]}) + "\n")
    _refused(_dpo(data, tmp_path / "a", "--data", bad), f"{bad}:1: preference record lacks 'rejected'",
             tmp_path / "a")
    _refused(_grpo(data, tmp_path / "b", "--num-generations", "1"), "--num-generations 1: GRPO needs at least 2",
             tmp_path / "b")
    raising = tmp_path / "raising.jsonl"  # exact_match needs an answer field: the function raises on every sample
    raising.write_text(json.dumps({"prompt": "the cat", "answr": "a"}) + "\n" + json.dumps({"prompt": "a mat"}) + "\n")
    _refused(_grpo(data, tmp_path / "c", "--data", raising, "--reward-funcs", "exact_match", "--batch-size", "1"),
             "fields", tmp_path / "c")
    raising.write_text("".join(json.dumps({"prompt": p, "answer": None}) + "\n" for p in ("the cat", "a mat")))
    _refused(_grpo(data, tmp_path / "d", "--data", raising, "--reward-funcs", "exact_match", "--batch-size", "1"),
             f"reward function 'exact_match' raised KeyError on {raising}:", tmp_path / "d")


@once
def test_a_nan_reward_is_refused_naming_the_function_and_sample(data, tmp_path, monkeypatch):
    import pai_zoo_rl.rewards as rewards

    monkeypatch.setitem(rewards.BUILTIN, "format", lambda prompts, completions, **f: [float("nan")] * len(completions))
    _refused(_grpo(data, tmp_path / "e", "--steps", "1"), "reward function 'format' returned nan for ",
             tmp_path / "e")


@once
def test_settings_from_yaml_with_the_command_line_winning(data, tmp_path):
    config = tmp_path / "dpo.yaml"
    config.write_text(f"model: {data / 'model'}\ndata: {data / 'pairs.jsonl'}\nbatch_size: 8\nmax-steps: 1\n"
                      "beta: 0.5\nlr: 0.5\nquiet: true\n")
    _ok(run_cli(["rl", "dpo", "--config", config, "--save", tmp_path / "run", "--lr", "1e-4"]))
    [before, step, after] = _log(tmp_path / "run")
    assert step["step"] == 1 and step["lr"] == 1e-4  # the flag beat the YAML's 0.5
    config.write_text("model: x\nnum_generations: 3\n")
    _refused(["rl", "dpo", "--config", config, "--save", tmp_path / "bad"],
             f"{config}: 'num_generations' is no setting of `pai-zoo rl dpo`", tmp_path / "bad")


@once
def test_a_reward_model_is_a_reward_function(data, tmp_path):
    """``--reward-funcs model:RM`` scores with a reward model trained by ``pai-zoo rl reward`` (the existing RM),
    beside a built-in; the log names it by its folder, as TRL names a reward model."""
    _ok(run_cli(["rl", "reward", "--model", data / "model", "--data", data / "pairs.jsonl", "--save", tmp_path / "rm",
                 "--epochs", "1"]))
    _ok(run_cli(_grpo(data, tmp_path / "run", "--steps", "1", "--reward-funcs", f"model:{tmp_path / 'rm'},format")))
    record = _log(tmp_path / "run")[0]
    assert abs(record["reward"] - record["rewards/rm/mean"] - record["rewards/format/mean"]) <= 1e-5
    assert record["rewards/rm/std"] > 0  # scores that differ between completions


@once
def test_lora_runs_are_peft_adapters_of_the_base(data, tmp_path):
    """``--peft lora``: DPO trains adapters on the frozen base, whose own log-probabilities are the reference (no
    second model); the run folder is a LoRA run that converts to a PEFT adapter, which PEFT applies as pai-zoo
    applies the run (the HF backend applies it with PEFT itself); GRPO takes the same flags."""
    import torch

    _ok(run_cli(_dpo(data, tmp_path / "dpo", "--epochs", "1", "--max-steps", "3", "--peft", "lora", "--lora-rank",
                     "4", "--lora-target-modules", "q_proj,v_proj,down_proj")))
    steps = [r for r in _log(tmp_path / "dpo") if "loss" in r]
    assert steps[0]["loss"] == pytest.approx(0.6931472, abs=1e-6) and steps[-1]["rewards/margins"] != 0.0
    ids = torch.tensor([[5, 17, 33, 250, 9, 100, 44]])
    base = pai_zoo.load(data / "model", backend="hf").logits(ids)
    _ok(run_cli(["convert", tmp_path / "dpo", tmp_path / "peft", "--to", "hf-peft"]))
    assert (tmp_path / "peft" / "adapter_config.json").is_file()
    peft = pai_zoo.load(data / "model", backend="hf", adapter=tmp_path / "peft").logits(ids)
    mcore = pai_zoo.load(data / "model", backend="mcore", adapter=tmp_path / "dpo").logits(ids)[..., :peft.shape[-1]]
    assert float((peft - mcore).abs().max()) <= 1e-5 and float((peft - base).abs().max()) > 1e-4
    _ok(run_cli(_grpo(data, tmp_path / "grpo", "--steps", "1", "--peft", "lora")))
    assert (tmp_path / "grpo" / "lora.json").is_file()
    _refused(_dpo(data, tmp_path / "preset", "--model", "llama3-tiny", "--peft", "lora"),
             "--peft lora adapts a base checkpoint folder", tmp_path / "preset")
