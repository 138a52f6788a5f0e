"""Out-of-range and malformed flag values, command by command: one ``pai-zoo: error:`` line that names the flag as
the user spelled it (``--lr``, not ``--learning-rate``; ``--clip-grad`` or ``--max-grad-norm``), exit 1, no
traceback, and nothing loaded: the command's own ``run`` (a flag refused as argparse reads it,
:mod:`pai_zoo.cli._checks`) or every model loader (a setting refused by the command before it loads anything) is
replaced by one that fails the test if it is called.
"""
from __future__ import annotations

import argparse
import sys

import pytest

from pai_zoo.cli import build_parser, main
from pai_zoo.cli._checks import FREE, RULES, Checked

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]

M = "llama3-tiny"
RL_ARGS = {"reward": ["--model", M, "--data", "{t}/pairs.jsonl", "--save", "{t}/run"],
           "ppo": ["--actor", M, "--reward", "rule:contains=1", "--prompts", "{t}/p.jsonl", "--save", "{t}/run"],
           "dpo": ["--model", M, "--data", "{t}/pairs.jsonl", "--save", "{t}/run"],
           "grpo": ["--model", M, "--data", "{t}/p.jsonl", "--save", "{t}/run"]}
TRAIN = ["train", "--model", M, "--data", "{t}/data", "--save", "{t}/run"]

# command line, the text the one error line starts with after "pai-zoo: error: "
PARSED = {  # refused as argparse reads the flag: the command never starts
    "generate-temperature": (["generate", "--model", M, "--prompt", "hi", "--temperature", "-1"],
                             "--temperature -1: must be 0 or more (0 = greedy)"),
    "generate-top-p-zero": (["generate", "--model", M, "--prompt", "hi", "--top-p", "0"], "--top-p 0:"),
    "generate-top-p-above-one": (["generate", "--model", M, "--prompt", "hi", "--top-p", "1.5"], "--top-p 1.5:"),
    "generate-top-k": (["generate", "--model", M, "--prompt", "hi", "--top-k", "-1"], "--top-k -1:"),
    "generate-max-new-tokens": (["generate", "--model", M, "--prompt", "hi", "--max-new-tokens", "0"],
                                "--max-new-tokens 0:"),
    "generate-batch-size": (["generate", "--model", M, "--prompt", "hi", "--batch-size", "0"], "--batch-size 0:"),
    "generate-tp": (["generate", "--model", M, "--prompt", "hi", "--tp", "0"], "--tp 0:"),
    "generate-seed": (["generate", "--model", M, "--prompt", "hi", "--seed", "-1"], "--seed -1:"),
    "generate-nan-temperature": (["generate", "--model", M, "--prompt", "hi", "--temperature", "nan"],
                                 "--temperature nan:"),
    "generate-iteration": (["generate", "--model", M, "--prompt", "hi", "--iteration", "-3"], "--iteration -3:"),
    "eval-seq-length": (["eval", M, "--data", "{t}/data", "--seq-length", "0"], "--seq-length 0:"),
    "eval-micro-batch-size": (["eval", M, "--data", "{t}/data", "--micro-batch-size", "-2"],
                              "--micro-batch-size -2:"),
    "eval-max-tokens": (["eval", M, "--data", "{t}/data", "--max-tokens", "0"], "--max-tokens 0:"),
    "eval-num-fewshot": (["eval", M, "--tasks", "x", "--num-fewshot", "-1"], "--num-fewshot -1:"),
    "eval-limit": (["eval", M, "--tasks", "x", "--limit", "0"], "--limit 0:"),
    "eval-pp": (["eval", M, "--data", "{t}/data", "--pp", "0"], "--pp 0:"),
    "convert-shard-size": (["convert", "{t}", "{t}/out", "--to", "mcore", "--max-shard-size", "-5"],
                           "--max-shard-size -5:"),
    "convert-shard-size-word": (["convert", "{t}", "{t}/out", "--to", "hf", "--max-shard-size", "big"],
                                "--max-shard-size big:"),
    "convert-tp": (["convert", "{t}", "{t}/out", "--to", "mcore", "--tp", "0"], "--tp 0:"),
    "convert-ep": (["convert", "{t}", "{t}/out", "--to", "mcore", "--ep", "-1"], "--ep -1:"),
    "convert-tolerance": (["convert", "{t}", "{t}/out", "--to", "mcore", "--verify-tolerance", "-1"],
                          "--verify-tolerance '-1':"),
    "convert-iteration": (["convert", "{t}", "{t}/out", "--to", "hf", "--iteration", "latest"],
                          "--iteration latest:"),
    "preprocess-workers": (["preprocess", "--input", "{t}/x.jsonl", "--output-prefix", "{t}/o", "--tokenizer", M,
                            "--workers", "0"], "--workers 0:"),
    "preprocess-seq-length": (["preprocess", "--sft", "--input", "{t}/x.jsonl", "--output-prefix", "{t}/o",
                               "--tokenizer", M, "--seq-length", "-8"], "--seq-length -8:"),
    "dataset-inspect-document": (["dataset", "inspect", "{t}/data", "--document", "-1"], "--document -1:"),
    "dataset-prepare-shard": (["dataset", "prepare", "{t}/x.jsonl", "--output", "{t}/o", "--samples-per-shard", "0"],
                              "--samples-per-shard 0:"),
    "inspect-iteration": (["inspect", "{t}", "--iteration", "-3"], "--iteration -3:"),
    "info-iteration": (["info", "{t}", "--iteration", "x"], "--iteration x:"),
    "train-gpus": ([*TRAIN, "--plan", "--gpus", "0"], "--gpus 0:"),
    "rl-reward-seed": (["rl", "reward", *RL_ARGS["reward"], "--seed", "-1"], "--seed -1:"),
    "rl-reward-lr": (["rl", "reward", *RL_ARGS["reward"], "--lr", "0"], "--lr 0:"),
    "rl-ppo-top-p": (["rl", "ppo", *RL_ARGS["ppo"], "--top-p", "2"], "--top-p 2:"),
    "rl-dpo-clip-grad": (["rl", "dpo", *RL_ARGS["dpo"], "--clip-grad", "-1"], "--clip-grad -1:"),
    "rl-grpo-max-grad-norm": (["rl", "grpo", *RL_ARGS["grpo"], "--max-grad-norm", "-1"], "--max-grad-norm -1:"),
    "rl-run-epochs": (["rl", "run", "reward", *RL_ARGS["reward"], "--epochs", "0"], "--epochs 0:"),
}
CHECKED = {  # refused by the command before anything loads
    "train-lr": ([*TRAIN, "--lr", "-1"], "--lr -1.0: the learning rate must not be negative"),
    "train-learning-rate": ([*TRAIN, "--learning-rate", "-0.5"],
                            "--learning-rate -0.5: the learning rate must not be negative"),
    # 0 is a run that must not move the weights: then the default minimum learning rate is what does not fit
    "train-learning-rate-zero": ([*TRAIN, "--learning-rate", "0"],
                                 "min_learning_rate 5e-06 (the default) must be between 0 and --learning-rate 0.0"),
    "train-min-lr": ([*TRAIN, "--lr", "1e-4", "--min-lr", "1e-3"], "--min-lr 0.001 must be between 0 and --lr 0.0001"),
    "train-micro-batch-size": ([*TRAIN, "--micro-batch-size", "0"], "batch_size must be positive, not 0 "
                                                                     "(--micro-batch-size 0)"),
    "train-seed": ([*TRAIN, "--seed", "-1"], "--seed -1: must be a seed"),
    "train-adam-beta": ([*TRAIN, "--adam-beta1", "1.5"], "--adam-beta1 1.5: must be at least 0 and below 1"),
    "train-yaml-lr": (["train", "{t}/run.yaml"], "lr: -2.0 ({t}/run.yaml): the learning rate must not be negative"),
    "train-missing-data": ([*TRAIN[:4], "{t}/nowhere", *TRAIN[5:]], "no such file or folder: {t}/nowhere.bin"),
    "train-missing-model": (["train", "--model", "{t}/nowhere", *TRAIN[3:]], "--model {t}/nowhere: no such file"),
    "rl-config-seed": (["rl", "reward", *RL_ARGS["reward"], "--config", "{t}/rl.yaml"],
                       "{t}/rl.yaml: seed -5: must be a seed"),
    "rl-config-string-number": (["rl", "reward", *RL_ARGS["reward"], "--config", "{t}/rl2.yaml"],
                                "{t}/rl2.yaml: lr fast: not a valid float"),
    "generate-stop": (["generate", "--model", M, "--prompt", "hi", "--stop", ""], "--stop: give non-empty strings"),
    "generate-missing-model": (["generate", "--model", "{t}/nowhere", "--prompt", "hi"],
                               "no such file or folder: {t}/nowhere"),
    "generate-missing-tokenizer": (["generate", "--model", M, "--prompt", "hi", "--tokenizer", "{t}/nowhere"],
                                   "no such file or folder: {t}/nowhere (--tokenizer)"),
    "eval-missing-data": (["eval", M, "--data", "{t}/nowhere"], "no such file or folder: {t}/nowhere.bin"),
    "eval-missing-jsonl": (["eval", M, "--data", "{t}/nowhere.jsonl"], "--data {t}/nowhere.jsonl: no such file"),
    "rl-ppo-missing-prompts": (["rl", "ppo", *RL_ARGS["ppo"]], "no such file or folder: {t}/p.jsonl (--prompts)"),
    "rl-dpo-missing-data": (["rl", "dpo", *RL_ARGS["dpo"]], "no such file or folder: {t}/pairs.jsonl (--data)"),
    "rl-reward-unknown-model": (["rl", "reward", "--model", "nosuch", *RL_ARGS["reward"][2:]],
                                "--model nosuch: unknown model 'nosuch'"),
    "rl-grpo-missing-ref-model": (["rl", "grpo", *RL_ARGS["grpo"], "--ref-model", "{t}/nowhere"],
                                  "--ref-model {t}/nowhere: no such file or folder"),
    "dataset-prepare-missing": (["dataset", "prepare", "{t}/x.jsonl", "--output", "{t}/o"],
                                "no such file or folder: {t}/x.jsonl (the vision SFT data)"),
    "plugin-new-name": (["plugin", "new", "My Arch!", "--from-config", "helium", "--output", "{t}/o"],
                        "plugin name 'My Arch!': use lower-case letters"),
    "plugin-new-like": (["plugin", "new", "myarch", "--from-config", "helium", "--like", "nosuch", "--output",
                         "{t}/o"], "--like nosuch: no installed family"),
    "preprocess-missing-input": (["preprocess", "--input", "{t}/nowhere.jsonl", "--output-prefix", "{t}/o",
                                  "--tokenizer", "{t}"], "no such file or folder: {t}/nowhere.jsonl (--input)"),
    "eval-missing-adapter": (["eval", M, "--data", "{t}/data", "--adapter", "{t}/nowhere"],
                             "no such file or folder: {t}/nowhere (--adapter)"),
}


def _refuse(*_, **__):
    raise AssertionError("the command went on to load a model")


@pytest.fixture
def no_loading(monkeypatch):
    """Every way the commands load a model (or read a plugin's source config, or import megatron-energon), replaced
    by one that fails the test; the checks that come after the early ones (train's and rl's --save) too."""
    import pai_zoo.cli.eval
    import pai_zoo.cli.generate
    import pai_zoo.cli.preprocess
    import pai_zoo.cli.rl
    import pai_zoo.cli.train
    import pai_zoo.models.handle
    import pai_zoo.scaffold

    for module, names in ((pai_zoo.models.handle, ("load", "resolve")), (pai_zoo.cli.generate, ("load",)),
                          (pai_zoo.cli.eval, ("load", "resolve")), (pai_zoo.cli.train, ("resolve", "check_save_dir")),
                          (pai_zoo.cli.rl, ("resolve", "check_save_dir")), (pai_zoo.scaffold, ("read_source",)),
                          (pai_zoo.cli.preprocess, ("check_dataset_outputs",))):  # before the tokenizer
        for name in names:
            if hasattr(module, name):
                monkeypatch.setattr(module, name, _refuse)
    monkeypatch.setitem(sys.modules, "pai_zoo.data.vision_shards", None)  # importing it fails the test


def _run(argv, capsys) -> tuple[int, str, str]:
    try:
        code = main(argv)
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out, err


def _check(case, argv, expected, tmp_path, capsys):
    (tmp_path / "run.yaml").write_text(f"model: {M}\ndata: {tmp_path}/data\nsave: {tmp_path}/run\nlr: -2\n")
    (tmp_path / "rl.yaml").write_text("seed: -5\n")
    (tmp_path / "rl2.yaml").write_text("lr: fast\n")
    fill = lambda s: s.replace("{t}", str(tmp_path))  # noqa: E731
    code, out, err = _run([fill(a) for a in argv], capsys)
    assert code == 1, (case, out + err)
    assert "Traceback" not in out + err
    assert err.splitlines()[0].startswith("pai-zoo: error: " + fill(expected)), err
    assert len(err.splitlines()) == 1 or err.splitlines()[1].startswith("hint: "), err
    assert not (tmp_path / "run").exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize("case", list(PARSED))
def test_a_flag_out_of_range_is_refused_as_it_is_read(case, tmp_path, capsys, monkeypatch, no_loading):
    argv, expected = PARSED[case]
    command = argv[0] if argv[0] != "dataset" else "dataset"
    module = __import__(f"pai_zoo.cli.{command}", fromlist=["x"])
    for name in ("run", "run_inspect", "run_prepare", "run_trainer"):  # the command never starts
        if hasattr(module, name):
            monkeypatch.setattr(module, name, _refuse)
    _check(case, argv, expected, tmp_path, capsys)


@pytest.mark.parametrize("case", list(CHECKED))
def test_a_setting_is_refused_before_anything_loads(case, tmp_path, capsys, no_loading):
    argv, expected = CHECKED[case]
    _check(case, argv, expected, tmp_path, capsys)


def test_every_number_flag_has_a_rule():
    """Each int or float flag of every command (an RL plugin's included) is checked as it is read, or is in
    :data:`~pai_zoo.cli._checks.FREE` with the reason it takes any value."""

    unchecked, checked = [], 0

    def walk(parser, path):
        nonlocal checked
        for action in parser._actions:
            if isinstance(action, argparse._SubParsersAction):
                for name, sub in action.choices.items():
                    walk(sub, [*path, name])
            elif isinstance(action, Checked):
                checked += 1
                assert action.dest in RULES
            elif action.option_strings and action.type in (int, float) and action.dest not in FREE:
                unchecked.append(f"{' '.join(path)} {action.option_strings[0]}")

    walk(build_parser(), [])
    assert not unchecked, unchecked
    assert checked > 60


def test_an_rl_config_number_written_as_yaml_reads_it_is_converted(tmp_path, capsys):
    """YAML reads ``lr: 1e-5`` as a string; the trainer gets the number, as from the flag."""
    import pai_zoo.cli.rl as rl

    got = {}
    (tmp_path / "rl.yaml").write_text("lr: 1e-5\nseed: 7\n")
    args = build_parser().parse_args(["rl", "reward", "--model", M, "--data", "d", "--save", "s", "--config",
                                      str(tmp_path / "rl.yaml")])
    args.rl_class = lambda **settings: got.update(settings) or type("T", (), {"run": lambda self: {}})()
    assert rl.run_trainer(args) == 0
    assert (got["lr"], got["seed"]) == (1e-5, 7)


def test_a_good_value_still_parses():
    args = build_parser().parse_args(["generate", "--model", M, "--prompt", "hi", "--temperature", "0",
                                      "--top-p", "1", "--top-k", "0", "--seed", "0", "--iteration", "release"])
    assert (args.temperature, args.top_p, args.top_k, args.seed, args.iteration) == (0.0, 1.0, 0, 0, "release")
    args = build_parser().parse_args(["convert", "a", "b", "--to", "hf", "--max-shard-size", "500MB",
                                      "--verify-tolerance", "1e-4,1e-5"])
    assert (args.max_shard_size, args.verify_tolerance) == ("500MB", "1e-4,1e-5")
