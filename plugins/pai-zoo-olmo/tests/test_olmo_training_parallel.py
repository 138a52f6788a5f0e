"""OLMo-2 trained with tensor parallelism repeats one process: the whole-projection q/k norms' all-reduced sum of
squares (its gradient summed over the ranks) and their TP-split weights, and the post norms (sequence-parallel
norms under sequence parallelism) train as one process does. The suite's parallel check compares logits only."""
from __future__ import annotations

import json

import pytest

from pai_zoo_conformance.cli_runs import run_cli, run_cli_on_ranks

pytestmark = pytest.mark.megatron_once  # no megatron-core version matters here; the suite's forward checks do

STEPS = 3
#: 3 Adam steps in float32; the scale tests' bound (tests/test_train_scale.py)
LOSS_ATOL = 1e-4


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import pai_zoo
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("olmo-train")
    toy.write_tokenizer(root / "hf", vocab_size=300)
    pai_zoo.load("olmo2-odd", backend="hf", seed=3, vocab_size=300, bos_token_id=0, eos_token_id=0,
                 pad_token_id=0).model.save_pretrained(root / "hf")
    corpus = toy.write_corpus(root / "corpus.jsonl", documents=20)
    preprocess([corpus], root / "toy", str(root / "hf"), append_eod=True, progress=False)
    return root


def _train(setup, name: str, nproc: int, *extra: str) -> list[float]:
    save = setup / name
    argv = ["train", "--model", setup / "hf", "--data", setup / "toy_text_document", "--save", save,
            "--global-batch-size", "2", "--batch-size", "1", "--seq-length", "32", "--train-iters", str(STEPS),
            "--warmup-iters", "1", "--lr", "3e-3", "--min-lr", "3e-4", "--save-interval", str(STEPS),
            "--no-progress", *extra]
    proc = run_cli_on_ranks(argv, timeout=600) if nproc == 2 else run_cli(argv)
    assert proc.returncode == 0, f"{name}:\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}"
    return [json.loads(line)["loss"] for line in (save / "metrics.jsonl").read_text().splitlines()]


def test_tensor_and_sequence_parallel_training_repeats_one_process(setup, pai_zoo_workers):
    baseline = _train(setup, "one", 1)
    got = _train(setup, "tp2_sp", 2, "--tensor-model-parallel-size", "2", "--sequence-parallel")
    assert len(got) == len(baseline) == STEPS
    assert max(abs(a - b) for a, b in zip(got, baseline)) <= LOSS_ATOL, (got, baseline)
