"""``pai-zoo train``: settings, data order, SFT samples, end-to-end runs, exact resume after SIGKILL,
interrupted saves, and TP=2 / PP=2 / DP=2 loss curves against one process."""
from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
import torch

from pai_zoo.training.config import TrainConfig, TrainConfigError
from pai_zoo_conformance.cli_runs import run_cli, run_cli_on_ranks

REPO = Path(__file__).resolve().parents[1]
#: Loss-curve tolerance of a TP/PP/DP run against one process (float32, 8 Adam steps).
PARALLEL_LOSS_ATOL = 1e-4


# ---------------------------------------------------------------------------------------------
# settings
# ---------------------------------------------------------------------------------------------
def test_defaults_are_the_recipe_table():
    c = TrainConfig()
    assert (c.batch_size, c.global_batch_size, c.learning_rate, c.min_learning_rate, c.sequence_length,
            c.pad_length, c.save_interval, c.train_tokens, c.warmup_fraction, c.lr_decay_style) == \
        (1, 32, 5e-5, 5e-6, 1024, 128, 1000, 1638400, 0.1, "cosine")
    # steps = tokens / (global batch x sequence length): 1638400 / (32 * 1024) = 50; the default warm-up is a
    # tenth of the run: 5 steps, the recipe's 163840 tokens
    assert (c.train_steps, c.warmup_steps, c.to_dict()["warmup_tokens"]) == (50, 5, 163840)


def test_yaml_file_with_flag_overrides(tmp_path):
    file = tmp_path / "run.yaml"
    file.write_text(
        "model: llama3-tiny\ndata: [0.3, a, 0.7, b]\nsave: out\nglobal-batch-size: 8\nlearning_rate: 1e-4\n"
    )
    c = TrainConfig.load(file, {"global_batch_size": 16, "seed": None})
    assert c.global_batch_size == 16 and c.learning_rate == 1e-4 and c.seed == 1234
    assert c.data_blend() == (["a", "b"], [0.3, 0.7])
    assert c.microbatches(world_size=2) == 8  # 16 / (batch 1 x 2 data-parallel ranks)


@pytest.mark.parametrize("text, message", [
    ("model: x\nbogus: 1\n", "unknown setting(s) bogus"),
    ("model: [unclosed\n", ":2: not valid YAML"),
    ("batch_size: two\n", "batch_size = 'two' is not a valid int"),
])
def test_bad_yaml_names_the_file(tmp_path, text, message):
    file = tmp_path / "bad.yaml"
    file.write_text(text)
    with pytest.raises(TrainConfigError) as e:
        TrainConfig.load(file)
    assert str(file) in str(e.value) and message in str(e.value)


@pytest.mark.parametrize(
    "settings, world, message",
    [
        (dict(global_batch_size=6, batch_size=4), 1, "not divisible by batch_size 4"),
        (dict(tensor_parallel_size=2), 3, "3 processes cannot hold"),
        (
            dict(global_batch_size=6, batch_size=2, tensor_parallel_size=1),
            2,
            "not divisible by batch_size 2 x data-parallel size 2",
        ),
        (dict(train_tokens=100), 1, "zero training steps"),
        (dict(sequence_length=4096), 1, "longer than the model's 2048 positions"),
        (dict(warmup_tokens=10**9), 1, "warmup_tokens 1000000000 (30517 steps) exceeds the run's 50 steps"),
        (dict(warmup_iters=50), 1, "warmup_iters 50 is as long as the run's 50 steps"),
        (dict(warmup_fraction=1.0), 1, "the warm-up fraction must be at least 0 and below 1"),
        (dict(train_iters=8, train_tokens=4096), 1, "train_tokens 4096 and train_iters 8 both give the budget"),
        (dict(warmup_iters=1, warmup_tokens=0), 1, "warmup_tokens 0 and warmup_iters 1 both give the warm-up"),
        (dict(lr_decay_style="exponential"), 1, "lr_decay_style exponential: unknown decay style; expected cosine"),
        (dict(train_iters=0), 1, "train_iters must be positive"),
        (dict(model=""), 1, "--model is required"),
        (dict(min_learning_rate=1.0), 1, "min_learning_rate 1.0 must be between"),
        (dict(split="1,2"), 1, "split '1,2'"),
        (dict(data=["0.5", "a", "b"]), 1, "WEIGHT PREFIX"),
    ],
)
def test_inconsistent_settings_fail_before_work(settings, world, message):
    c = TrainConfig(**{"model": "m", "data": ["d"], "save": "s", **settings})
    with pytest.raises(TrainConfigError) as e:
        c.validate(world, max_positions=2048)
    assert message in str(e.value)


def test_cli_refuses_bad_settings_before_loading_anything(tmp_path, capsys):
    from pai_zoo.cli import main

    code = main(["train", "--model", "llama3-tiny", "--data", str(tmp_path / "d"), "--save", str(tmp_path / "o"),
                 "--global-batch-size", "3", "--batch-size", "2"])
    assert code == 1 and "not divisible by batch_size 2" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()
    from pai_zoo.data.indexed import IndexedDatasetWriter

    with IndexedDatasetWriter(tmp_path / "d", np.int32) as writer:  # the data files are checked before the model
        writer.add_document([1, 2, 3])
    code = main(["train", "--model", "llama3-tiny", "--data", str(tmp_path / "d"), "--save", str(tmp_path / "o"),
                 "--seq-length", "1000000", "--train-tokens", str(32 * 10**6)])
    assert code == 1 and "longer than the model's" in capsys.readouterr().err
    code = main(["train", "--model", "llama3-tiny", "--data", str(tmp_path / "missing"), "--save", str(tmp_path / "o")])
    assert code == 1 and f"no such file or folder: {tmp_path / 'missing.bin'}" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def test_yaml_takes_the_flags_and_megatron_lms_names(tmp_path):
    file = tmp_path / "megatron.yaml"
    file.write_text(
        "load: llama3-tiny\ndata_path: [0.3, a, 0.7, b]\nsave: out\nmicro_batch_size: 2\nglobal-batch-size: 8\n"
        "lr: 1e-4\nmin_lr: 1e-5\nseq_length: 64\ntrain_iters: 20\nlr_warmup_iters: 3\nlr_decay_style: linear\n"
        "tensor_model_parallel_size: 2\npipeline_model_parallel_size: 1\nno_save_optim: true\nkeep_last: 2\n"
        "recompute_activations: true\n"
    )
    c = TrainConfig.load(file)
    assert (c.model, c.data, c.batch_size, c.learning_rate, c.min_learning_rate, c.sequence_length) == \
        ("llama3-tiny", ["0.3", "a", "0.7", "b"], 2, 1e-4, 1e-5, 64)
    assert (c.train_steps, c.warmup_steps, c.lr_decay_style, c.tensor_parallel_size) == (20, 3, "linear", 2)
    assert (c.save_optim, c.keep_last, c.recompute_activations) == (False, 2, True)
    c.recompute_activations = torch.cuda.is_available()  # refused on the CPU (test_recompute_activations_is_refused...)
    c.validate(world_size=2)
    # the budget and warm-up are stored in tokens too, so that a resume compares them whatever their form
    assert (c.to_dict()["train_tokens"], c.to_dict()["warmup_tokens"]) == (20 * 8 * 64, 3 * 8 * 64)


def train_flags(argv):
    """``pai-zoo train ARGV`` parsed into its TrainConfig, as the command does."""
    from pai_zoo.cli import build_parser, parse
    from pai_zoo.cli.train import GIVEN

    args = parse(build_parser(), ["train", *argv])
    return TrainConfig.load(args.config, getattr(args, GIVEN, None) or {})


def test_megatron_lms_flags_are_aliases():
    c = train_flags(["--load", "m", "--data-path", "p", "--save", "s", "--micro-batch-size", "2",
                     "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--train-iters", "8",
                     "--lr-warmup-fraction", "0.25", "--lr-decay-style", "constant", "--no-save-optim", "--keep-last",
                     "3", "--extend", "--recompute-activations", "--lr", "1e-3", "--min-lr", "1e-4", "--seq-length",
                     "16", "--global-batch-size", "4"])
    assert (c.model, c.data, c.save, c.batch_size, c.tensor_parallel_size, c.pipeline_parallel_size) == \
        ("m", ["p"], "s", 2, 2, 2)
    assert (c.train_steps, c.warmup_steps, c.lr_decay_style, c.learning_rate, c.min_learning_rate) == \
        (8, 2, "constant", 1e-3, 1e-4)
    assert (c.save_optim, c.keep_last, c.extend, c.recompute_activations, c.sequence_length) == \
        (False, 3, True, True, 16)
    c.recompute_activations = torch.cuda.is_available()
    c.validate(world_size=8)
    assert train_flags(["--tp", "2", "--warmup-iters", "1"]).tensor_parallel_size == 2
    assert train_flags([]).save_optim and not train_flags([]).recompute_activations  # the switches' defaults


def test_help_shows_pai_zoos_names_first():
    from pai_zoo.cli import build_parser, command_parser

    parser = build_parser()
    text = command_parser(parser, parser.parse_args(["train"])).format_help()
    for primary, megatron in [("--batch-size", "--micro-batch-size"), ("--model", "--load"), ("--data", "--data-path"),
                              ("--tensor-parallel-size", "--tensor-model-parallel-size"),
                              ("--warmup-iters", "--lr-warmup-iters"), ("--learning-rate", "--lr")]:
        assert f"{primary} " in text and f", {megatron} " in text
        assert text.index(f"{primary} ") < text.index(f", {megatron} "), primary


@pytest.mark.parametrize("argv, message", [
    (["--train-iters", "8", "--train-tokens", "4096"], "--train-iters and --train-tokens both give the budget"),
    (["--lr-warmup-iters", "2", "--warmup-tokens", "0"], "--lr-warmup-iters and --warmup-tokens both give the warm-up"),
    (["--lr", "1", "--learning-rate", "2"], "--lr and --learning-rate both set learning_rate"),
    (["--batch-size", "two"], "--batch-size two: not a valid int"),
])
def test_two_spellings_of_one_setting_are_refused(argv, message):
    with pytest.raises(TrainConfigError) as e:
        train_flags(argv)
    assert message in str(e.value)


def test_a_flag_replaces_the_files_other_form_of_the_budget(tmp_path):
    file = tmp_path / "run.yaml"
    file.write_text("train_tokens: 4096\nwarmup_tokens: 256\n")
    c = train_flags([str(file), "--train-iters", "6", "--lr-warmup-fraction", "0.5"])
    assert (c.train_iters, c.train_tokens, c.warmup_tokens, c.warmup_steps) == (6, 1638400, None, 3)
    file.write_text("train_tokens: 4096\ntrain_iters: 8\n")
    with pytest.raises(TrainConfigError, match="train_tokens and train_iters both give the budget"):
        TrainConfig.load(file)


def test_warmup_longer_than_the_run_names_the_flag_given(tmp_path, capsys):
    from pai_zoo.cli import main

    common = ["train", "--model", "llama3-tiny", "--data", str(tmp_path / "d"), "--save", str(tmp_path / "o"),
              "--global-batch-size", "4", "--seq-length", "32"]
    assert main([*common, "--train-iters", "8", "--lr-warmup-iters", "20"]) == 1
    err = capsys.readouterr().err
    assert "--lr-warmup-iters 20 exceeds the run's 8 steps (--train-iters 8); lower it below 8 steps" in err
    assert len(err.strip().splitlines()) == 1
    assert main([*common, "--train-tokens", "1024", "--warmup-tokens", "1024"]) == 1
    assert "--warmup-tokens 1024 (8 steps) is as long as the run's 8 steps (--train-tokens 1024 / 128 tokens " \
           "per step)" in capsys.readouterr().err
    file = tmp_path / "run.yaml"
    file.write_text("train_iters: 8\nlr_warmup_iters: 9\n")
    assert main([*common, str(file)]) == 1
    assert f"lr_warmup_iters: 9 ({file}) exceeds the run's 8 steps (train_iters: 8 ({file}))" in \
        capsys.readouterr().err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("steps, warmup", [(1, 0), (3, 0), (9, 0), (10, 1), (20, 2), (50, 5), (1000, 100)])
def test_the_default_warmup_is_a_tenth_of_the_run_and_fits_short_runs(steps, warmup):
    c = TrainConfig(model="m", data=["d"], save="s", global_batch_size=4, sequence_length=32, train_iters=steps)
    c.validate()
    assert c.warmup_steps == warmup
    c = TrainConfig(model="m", data=["d"], save="s", global_batch_size=4, sequence_length=32,
                    train_tokens=steps * 128)
    c.validate()
    assert c.warmup_steps == warmup


def test_train_without_model_says_it_is_required(capsys):
    from pai_zoo.cli import main

    assert main(["train"]) == 1
    err = capsys.readouterr().err
    assert "pai-zoo: error: --model is required" in err and "checkpoint" not in err.split("required")[0]
    assert main(["train", "--model", "llama3-tiny"]) == 1
    assert "pai-zoo: error: --save is required" in capsys.readouterr().err


@pytest.mark.parametrize("argv, usage", [
    (["train", "--bogus"], "usage: pai-zoo train "),
    (["train", "--model", "m", "--tp"], "usage: pai-zoo train "),
    (["list", "--bogus"], "usage: pai-zoo list "),
    (["dataset", "inspect", "p", "--bogus"], "usage: pai-zoo dataset inspect "),
])
def test_a_subcommands_usage_error_prints_its_own_usage(argv, usage, capsys):
    from pai_zoo.cli import main

    with pytest.raises(SystemExit) as e:
        main(argv)
    err = capsys.readouterr().err
    assert e.value.code == 2 and err.startswith(usage), err
    assert "{list,info" not in err  # not the top-level usage


def test_scheduler_gets_the_decay_style_and_steps(monkeypatch):
    from pai_zoo.training import optim
    from pai_zoo.training.trainer import Trainer

    seen = {}
    monkeypatch.setattr(optim, "megatron_optimizer", lambda model, **kw: (seen.update(kw), None, None))
    cfg = train_flags(["--train-iters", "12", "--lr-warmup-iters", "2", "--lr-decay-style", "linear",
                       "--global-batch-size", "4", "--seq-length", "8"])
    trainer = Trainer(cfg)
    trainer.model = None
    trainer._build_optimizer()
    assert (seen["decay_style"], seen["decay_steps"], seen["warmup_steps"]) == ("linear", 12, 2)


# ---------------------------------------------------------------------------------------------
# data
# ---------------------------------------------------------------------------------------------
def test_batch_order_is_the_same_for_every_data_parallel_layout():
    from pai_zoo.training.data import BatchSchedule

    class Samples:
        def __getitem__(self, i):
            t = torch.full((4,), i)
            return t, t, torch.ones(4), torch.arange(4), torch.zeros(4, dtype=torch.long)

    cfg = TrainConfig(global_batch_size=8, batch_size=2, sequence_length=4)
    seen = {}
    for dp in (1, 2, 4):
        ids = []
        for rank in range(dp):
            sched = BatchSchedule(Samples(), cfg, rank, dp, fixed_length=True)
            for batch in sched.microbatches(step=3, count=cfg.microbatches(dp)):
                ids += batch.tokens[:, 0].tolist()
        seen[dp] = sorted(ids)
    assert seen[1] == seen[2] == seen[4] == list(range(24, 32))  # step 3 = samples 24..31


def test_sft_samples_shift_the_mask_and_confine_attention(tmp_path):
    from pai_zoo.data.indexed import IndexedDatasetWriter
    from pai_zoo.training.data import SFTSamples, collate

    prefix = str(tmp_path / "sft")
    # One packed document of two records: [10 11 12 | 20 21], assistant tokens 12 and 21.
    with IndexedDatasetWriter(prefix + "_text_document", np.uint16) as w:
        w.add_document([10, 11, 12, 20, 21], lengths=[3, 2])
        w.finalize()
    with IndexedDatasetWriter(prefix + "_loss_mask_document", np.uint8) as w:
        w.add_document([0, 0, 1, 0, 1], lengths=[3, 2])
        w.finalize()
    samples = SFTSamples(prefix, (0, 1), seed=0, sequence_length=8)
    tokens, labels, mask, positions, segments = samples[0]
    assert tokens.tolist() == [10, 11, 12, 20] and labels.tolist() == [11, 12, 20, 21]
    assert mask.tolist() == [0, 1, 0, 1]  # 12 and 21 are targets; 12 -> 20 crosses records: not one
    assert positions.tolist() == [0, 1, 2, 0] and segments.tolist() == [0, 0, 0, 1]
    batch = collate([samples[0]], 6)
    allowed = ~batch.attention_mask[0, 0]
    assert allowed[3].tolist() == [False, False, False, True, False, False]  # record 2 sees only itself
    assert allowed[2].tolist() == [True, True, True, False, False, False]
    assert batch.loss_mask[0].tolist() == [0, 1, 0, 1, 0, 0]  # padding is never a target


# ---------------------------------------------------------------------------------------------
# end to end
# ---------------------------------------------------------------------------------------------
STEPS, GBS, SEQ = 8, 4, 32


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    """A tiny Llama HF folder (with the toy tokenizer) and a preprocessed toy corpus."""
    import pai_zoo
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("train")
    toy.write_tokenizer(root / "hf", vocab_size=300)
    handle = pai_zoo.load("llama3-tiny", backend="hf", seed=3, vocab_size=300)
    handle.model.save_pretrained(root / "hf")
    corpus = toy.write_corpus(root / "corpus.jsonl", documents=150)
    preprocess([corpus], root / "toy", str(root / "hf"), append_eod=True, progress=False)
    return root


def train_args(setup, save, *extra):
    return ["--model", str(setup / "hf"), "--data", str(setup / "toy_text_document"), "--save", str(save),
            "--global-batch-size", str(GBS), "--batch-size", "1", "--seq-length", str(SEQ),
            "--train-tokens", str(STEPS * GBS * SEQ), "--warmup-tokens", str(GBS * SEQ), "--lr", "3e-3",
            "--min-lr", "3e-4", "--save-interval", "2", "--no-progress", *extra]


def run(args, *, nproc=1, wrapper=None, check=True, timeout=600):
    """``pai-zoo train ARGS``: in this process (on one thread, as ``OMP_NUM_THREADS=1`` runs it), on the 2 ranks of the
    session's worker group (``nproc=2``, as under torchrun), or, where the process is what is tested, in a
    subprocess that ``tests/train_interrupt.py`` signals or kills at a chosen moment (``wrapper``)."""
    if wrapper is not None:
        head = [sys.executable, str(REPO / "tests" / "train_interrupt.py"), *wrapper, "--"]
        proc = subprocess.run([*head, *args], capture_output=True, text=True, timeout=timeout,
                              env={**os.environ, "OMP_NUM_THREADS": "1"})
    elif nproc == 2:
        proc = run_cli_on_ranks(["train", *args], timeout=timeout)
    else:
        assert nproc == 1, nproc
        proc = run_cli(["train", *args])
    if check and proc.returncode != 0:
        raise AssertionError(f"train failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def losses(save) -> list[float]:
    return [json.loads(line)["loss"] for line in (Path(save) / "metrics.jsonl").read_text().splitlines()]


@pytest.fixture(scope="module")
def baseline(setup):
    save = setup / "baseline"
    run(train_args(setup, save))
    return save


def test_training_loss_is_the_hf_models_cross_entropy(setup):
    """Megatron's padded vocabulary (300 -> 384 rows) must not enter the softmax."""
    import pai_zoo
    from pai_zoo.mcore.build import mask_padded_vocab
    from pai_zoo.mcore.forward import causal_mask

    ids = torch.randint(0, 300, (2, 17), generator=torch.Generator().manual_seed(1))
    inputs, labels = ids[:, :-1], ids[:, 1:]
    hf = pai_zoo.load(setup / "hf", backend="hf")
    want = torch.nn.functional.cross_entropy(
        hf.model(input_ids=inputs).logits.transpose(1, 2), labels, reduction="none"
    )
    model = pai_zoo.load(setup / "hf", backend="mcore").model
    mask, positions = causal_mask(inputs)
    unmasked = model(inputs, positions, mask, labels=labels)
    assert (unmasked - want).abs().max().item() > 0.1  # the padding rows' exp(0) terms
    mask_padded_vocab(model, 300)
    got = model(inputs, positions, mask, labels=labels)
    assert (got - want).abs().max().item() <= 1e-4


def test_training_lowers_loss_logs_and_checkpoints(baseline):
    records = [json.loads(line) for line in (baseline / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in records] == list(range(1, STEPS + 1))
    for key in ("loss", "lr", "grad_norm", "tokens_per_s", "target_tokens"):
        assert all(key in r for r in records), key
    assert records[-1]["loss"] < 0.9 * records[0]["loss"]
    # Warm-up for one step to the peak, cosine decay to the floor at the last step.
    assert records[0]["lr"] == pytest.approx(3e-3) and records[-1]["lr"] == pytest.approx(3e-4)
    assert all(a["lr"] >= b["lr"] for a, b in zip(records, records[1:]))
    assert (baseline / "latest_checkpointed_iteration.txt").read_text() == str(STEPS)
    assert sorted(p.name for p in baseline.glob("iter_*")) == [f"iter_{i:07d}" for i in (2, 4, 6, 8)]


def megatron_lm_args(setup, save, *extra):
    """train_args(setup, save) in Megatron-LM's names, the budget and warm-up in steps."""
    return ["--load", str(setup / "hf"), "--data-path", str(setup / "toy_text_document"), "--save", str(save),
            "--global-batch-size", str(GBS), "--micro-batch-size", "1", "--seq-length", str(SEQ),
            "--train-iters", str(STEPS), "--lr-warmup-iters", "1", "--lr", "3e-3", "--min-lr", "3e-4",
            "--lr-decay-style", "cosine", "--save-interval", "2", "--no-progress", *extra]


def test_megatron_lm_spellings_repeat_the_baseline(setup, baseline, tmp_path):
    """The same run in Megatron-LM's names, in steps instead of tokens: the same losses."""
    save = tmp_path / "megatron"
    run(megatron_lm_args(setup, save))
    assert losses(save) == pytest.approx(losses(baseline), abs=1e-6)


def test_linear_decay_and_the_default_warmup(setup, tmp_path):
    """--lr-decay-style linear; no warm-up setting: a tenth of 8 steps, rounded down, is none (no error)."""
    save = tmp_path / "linear"
    run(["--model", str(setup / "hf"), "--data", str(setup / "toy_text_document"), "--save", str(save),
         "--global-batch-size", str(GBS), "--seq-length", str(SEQ), "--train-iters", str(STEPS), "--lr", "3e-3",
         "--min-lr", "3e-4", "--lr-decay-style", "linear", "--save-interval", "100", "--no-progress"])
    lrs = [json.loads(line)["lr"] for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert lrs == pytest.approx([3e-4 + (1 - step / STEPS) * 2.7e-3 for step in range(1, STEPS + 1)])


def test_final_checkpoint_converts_to_hf_with_the_trained_logits(baseline, tmp_path):
    import pai_zoo
    from pai_zoo.conversion.entry import convert

    convert(baseline, tmp_path / "hf", to="hf")
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(0))
    trained = pai_zoo.load(baseline, backend="mcore").logits(ids)
    converted = pai_zoo.load(tmp_path / "hf", backend="hf")
    assert (converted.logits(ids) - trained).abs().max().item() <= 1e-4
    assert converted.tokenizer is not None and converted.tokenizer.vocab_size <= 300  # the tokenizer came along
    start = pai_zoo.load(baseline.parent / "hf", backend="hf").logits(ids)
    assert (start - trained).abs().max().item() > 1e-2  # and training changed the model


def test_resume_after_sigkill_repeats_the_losses_exactly(setup, baseline):
    save = setup / "killed"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    proc = subprocess.Popen([sys.executable, "-m", "pai_zoo.cli", "train", *train_args(setup, save)],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env)
    metrics = save / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 5:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    assert int((save / "latest_checkpointed_iteration.txt").read_text()) < STEPS
    resumed = run(train_args(setup, save))
    assert "resuming" in resumed.stdout
    assert losses(save) == losses(baseline)  # step for step, bit for bit


@pytest.mark.parametrize("moment", [pytest.param("publish", marks=pytest.mark.megatron_once),  # pai-zoo's publishing
                                    pytest.param("tracker", marks=pytest.mark.megatron_once(first=True))])
def test_interrupted_save_keeps_the_previous_checkpoint(setup, baseline, moment):
    save = setup / f"interrupted-{moment}"
    proc = run(train_args(setup, save), wrapper=(moment, "4"), check=False)
    assert proc.returncode == -signal.SIGKILL
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "2"
    if moment == "publish":
        assert (save / "iter_0000004.tmp").is_dir() and not (save / "iter_0000004").exists()
    run(train_args(setup, save))
    assert losses(save) == losses(baseline)
    assert not list(save.glob("*.tmp"))


def test_resume_refuses_changed_settings(setup, baseline):
    proc = run(train_args(setup, baseline)[:-1] + ["--no-progress", "--global-batch-size", "8"], check=False)
    # argparse keeps the last --global-batch-size: 8, which differs from the run's 4
    assert proc.returncode == 1 and "global_batch_size: 4 -> 8" in proc.stderr


@pytest.mark.parametrize("layout", [("--tp", "2"), ("--pp", "2"), ()], ids=["tp2", "pp2", "dp2"])
def test_parallel_loss_curve_equals_one_process(setup, baseline, layout):
    save = setup / f"parallel-{'-'.join(layout) or 'dp2'}"
    run(train_args(setup, save, *layout), nproc=2)
    got, want = losses(save), losses(baseline)
    assert len(got) == len(want) == STEPS
    assert max(abs(a - b) for a, b in zip(got, want)) <= PARALLEL_LOSS_ATOL, (got, want)


def test_sft_training_uses_the_loss_mask(setup, tmp_path):
    from pai_zoo.data.preprocess import preprocess_sft

    records = tmp_path / "chat.jsonl"
    from pai_zoo.data import toy

    with open(records, "w") as f:
        for i, sentence in enumerate(toy.sentences(60, seed=5)):
            f.write(json.dumps({"messages": [{"role": "user", "content": f"say {i % 7}"},
                                             {"role": "assistant", "content": sentence}]}) + "\n")
    preprocess_sft([records], tmp_path / "chat", str(setup / "hf"), seq_length=SEQ * 2, progress=False)
    save = tmp_path / "sft"
    run(["--model", str(setup / "hf"), "--data", str(tmp_path / "chat"), "--save", str(save), "--sft",
         "--global-batch-size", "2", "--seq-length", str(SEQ * 2), "--train-tokens", str(6 * 2 * SEQ * 2),
         "--warmup-tokens", "0", "--lr", "3e-3", "--save-interval", "100", "--no-progress"])
    records = [json.loads(line) for line in (save / "metrics.jsonl").read_text().splitlines()]
    assert len(records) == 6 and records[-1]["loss"] < records[0]["loss"]
    # Only assistant tokens are targets: far fewer than the tokens in the batch.
    assert all(0 < r["target_tokens"] < 2 * SEQ * 2 * 0.8 for r in records)
