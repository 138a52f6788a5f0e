"""``pai-zoo train --sft`` on the hybrid models' packed data: Gated DeltaNet (``qwen3_next``) and Mamba-2
(``nemotron_h``) layers. Each packed sequence holds several records; the recurrent layers restart at each record
(:mod:`pai_zoo.mcore.segments`), so TP=2 (with sequence parallelism, which megatron-core's MoE layers need under TP)
and PP=2 repeat one process's losses, and a run resumed from a checkpoint repeats the same losses, bit for
bit. That no packed record sees another is the conformance suite's ``test_packed_records_stay_apart`` (every
family); here the same data goes through the trainer."""
from __future__ import annotations

import json
from pathlib import Path

import pytest

from pai_zoo_conformance.cli_runs import run_cli, run_cli_on_ranks

# pai-zoo's trainer and layers (their forward runs in every pass), in the megatron-core 0.16 pass: its MoE
# load-balancing loss under sequence parallelism is pai-zoo's fix (pai_zoo.mcore.moe_aux_loss); 0.19 scales it itself
pytestmark = pytest.mark.megatron_once(first=True)

PRESETS = ("qwen3_next-tiny", "nemotron_h-tiny")
STEPS, GBS, SEQ = 3, 2, 160  # a chat record of the test tokenizers is ~70 tokens: two or more to a sequence
#: a TP/PP run's losses against one process's (float32)
PARALLEL_LOSS_ATOL = 1e-4


@pytest.fixture(scope="module", params=PRESETS)
def setup(request, tmp_path_factory):
    """The preset's HF folder (its family's test tokenizer) and chat records preprocessed into packed SFT sequences
    of ``SEQ`` tokens (several records each), and one process's run of them."""
    import pai_zoo
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess_sft
    from pai_zoo.families.registry import get_registry

    preset = request.param
    root = tmp_path_factory.mktemp(preset)
    family, _ = get_registry().preset(preset)
    pai_zoo.load(preset, backend="hf", seed=3).model.save_pretrained(root / "hf")
    family.test_tokenizer(root / "hf")
    records = root / "chat.jsonl"
    with open(records, "w") as f:
        for i, sentence in enumerate(toy.sentences(40, seed=5)):
            words = " ".join(sentence.split()[:2 + i % 3])  # short records
            f.write(json.dumps({"messages": [{"role": "user", "content": f"say {i % 7}"},
                                             {"role": "assistant", "content": words}]}) + "\n")
    preprocess_sft([records], root / "chat", str(root / "hf"), seq_length=SEQ, progress=False)
    run(train_args(root, root / "baseline", "--save-interval", "2"))  # its step-2 checkpoint: the resume's start
    return root


def train_args(root, save, *extra):
    return ["--model", str(root / "hf"), "--data", str(root / "chat"), "--save", str(save), "--sft",
            "--global-batch-size", str(GBS), "--batch-size", "1", "--seq-length", str(SEQ),
            "--train-tokens", str(STEPS * GBS * SEQ), "--warmup-tokens", "0", "--lr", "3e-3",
            "--save-interval", str(STEPS), "--no-progress", *extra]


def run(args, nproc: int = 1):
    proc = run_cli_on_ranks(["train", *args], timeout=600) if nproc == 2 else run_cli(["train", *args])
    assert proc.returncode == 0, f"failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return proc


def losses(save) -> list[float]:
    return [json.loads(line)["loss"] for line in (Path(save) / "metrics.jsonl").read_text().splitlines()]


def test_the_sequences_are_packed_records(setup):
    """Several records share each sequence: the recurrent layers have boundaries to restart at."""
    from pai_zoo.training.data import SFTSamples

    samples = SFTSamples(str(setup / "chat"), (0, 4), 1, SEQ)
    records = [int(samples[i][-1].max()) + 1 for i in range(len(samples))]
    assert min(records) >= 2, records


@pytest.mark.parametrize("layout", [("--tp", "2", "--sequence-parallel"), ("--pp", "2")], ids=["tp2-sp", "pp2"])
def test_parallel_losses_equal_one_process(setup, layout):
    save = setup / f"parallel-{'-'.join(layout)}"
    run(train_args(setup, save, *layout), nproc=2)
    got, want = losses(save), losses(setup / "baseline")
    assert len(got) == len(want) == STEPS
    assert max(abs(a - b) for a, b in zip(got, want)) <= PARALLEL_LOSS_ATOL, (got, want)


def test_resume_is_exact(setup):
    """The one-process run as a run stopped after step 2 leaves it (its step-2 checkpoint; the last one and its log
    line left out): the rerun resumes from step 2 and repeats step 3. A run SIGKILLed while it publishes a
    checkpoint resumes in tests/test_train.py (every pass) and tests/test_vision_sft_resume.py."""
    import shutil

    save = setup / "stopped"
    shutil.copytree(setup / "baseline", save, ignore=shutil.ignore_patterns(f"iter_{STEPS:07d}"))
    (save / "latest_checkpointed_iteration.txt").write_text("2")
    lines = (save / "metrics.jsonl").read_text().splitlines(keepends=True)
    (save / "metrics.jsonl").write_text("".join(x for x in lines if json.loads(x).get("step", 0) <= 2))
    assert len(losses(save)) == 2
    resumed = run(train_args(setup, save, "--save-interval", "2"))
    assert "resuming" in resumed.stdout
    assert losses(save) == losses(setup / "baseline")  # step for step, bit for bit
