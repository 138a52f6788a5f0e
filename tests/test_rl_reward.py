"""Reward-model training (``pai-zoo rl reward``) on synthetic preference pairs, its checkpoint, its
Hugging Face conversion (same rewards, numerically) and its bad-input errors."""
from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

import pai_zoo
from pai_zoo.cli import main as cli
from pai_zoo.mcore.heads import ScalarHead, sequence_scores
from pai_zoo.plugin.errors import PaiZooError
from pai_zoo.rl.models import forward, pad_right
from pai_zoo.rl.reward import RewardTrainer

GOOD = range(10, 60)  # chosen responses use these ids, rejected ones ids >= 100


def write_pairs(path: Path, n: int, seed: int = 0) -> Path:
    rng = random.Random(seed)
    with open(path, "w") as f:
        for _ in range(n):
            prompt = [rng.randrange(100, 1000) for _ in range(rng.randint(2, 5))]
            chosen = [rng.choice(GOOD) for _ in range(rng.randint(2, 6))]
            rejected = [rng.randrange(100, 1000) for _ in range(rng.randint(2, 6))]
            f.write(json.dumps({"prompt": prompt, "chosen": chosen, "rejected": rejected}) + "\n")
    return path


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    root = tmp_path_factory.mktemp("rm")
    data = write_pairs(root / "pairs.jsonl", 96)
    summary = RewardTrainer(model="llama3-tiny", data=str(data), save=str(root / "rm"), epochs=2, batch_size=8,
                            lr=3e-3, eval_fraction=0.25, seed=0).run()
    return root, summary


def test_reward_model_accuracy_rises_above_chance(trained):
    root, summary = trained
    assert summary["eval_pairs"] == 24 and summary["steps"] == 18  # 72 training pairs, 8 per step, 2 epochs
    assert summary["eval_accuracy"] >= 0.9, summary
    assert summary["eval_accuracy"] > summary["eval_accuracy_before"], summary
    assert not (root / "rm" / "log.jsonl").exists()  # one log format with pai-zoo train
    records = [json.loads(line) for line in (root / "rm" / "metrics.jsonl").read_text().splitlines()]
    losses = [r["loss"] for r in records if "loss" in r]
    for key in ("lr", "grad_norm", "tokens_per_s", "step_time"):  # the keys pai-zoo train writes too
        assert all(isinstance(r[key], float) for r in records if "loss" in r), key
    assert len(losses) == 18 and sum(losses[-3:]) / 3 < 0.5 * sum(losses[:3]) / 3  # the ranking loss falls
    assert records[-1]["eval_accuracy"] == summary["eval_accuracy"]


def test_reward_checkpoint_records_its_head_and_loads_back(trained):
    root, _ = trained
    record = json.loads((root / "rm" / "pai_zoo.json").read_text())
    assert record["head"] == {"kind": "score", "num_labels": 1, "pad_token_id": 0}
    assert record["mcore_config"]["arch"]["share_embeddings_and_output_weights"] is False
    assert (root / "rm" / "latest_checkpointed_iteration.txt").read_text() == "18"
    handle = pai_zoo.load(root / "rm")
    assert isinstance(handle.model.output_layer, ScalarHead)
    assert tuple(handle.model.output_layer.weight.shape) == (1, 64)
    # the loaded model ranks held-out-like pairs as the trained one did: chosen-style text scores higher
    ids, mask = pad_right([[500, 600, 20, 30, 40], [500, 600, 700, 800, 900]])
    with torch.no_grad():
        scores = sequence_scores(forward(handle.model, ids, mask), mask)
    assert scores[0] > scores[1]


def test_reward_model_converts_to_hf_sequence_classification_with_the_same_rewards(trained, tmp_path):
    from safetensors import safe_open
    from transformers import AutoModelForSequenceClassification

    root, _ = trained
    pai_zoo.convert(root / "rm", tmp_path / "hf", to="hf")
    config = json.loads((tmp_path / "hf" / "config.json").read_text())
    assert config["architectures"] == ["LlamaForSequenceClassification"] and config["pad_token_id"] == 0
    with safe_open(tmp_path / "hf" / "model.safetensors", "pt") as f:
        names = set(f.keys())
        assert "score.weight" in names and "lm_head.weight" not in names
        assert tuple(f.get_tensor("score.weight").shape) == (1, 64)
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == "LlamaForSequenceClassification"
    mcore = pai_zoo.load(root / "rm")
    seqs = [[5, 6, 7, 8, 9, 10], [300, 20, 30], [1, 2, 3, 4, 500, 600, 700, 800]]
    ids, mask = pad_right(seqs, pad_id=0)  # right padding: HF reads the rightmost non-pad token
    with torch.no_grad():
        ours = sequence_scores(forward(mcore.model, ids, mask), mask)
        theirs = hf(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
        singles = torch.stack([hf(input_ids=torch.tensor([s])).logits[0, 0] for s in seqs])
    assert (ours - theirs).abs().max() < 1e-5, (ours, theirs)
    assert (ours - singles).abs().max() < 1e-5, (ours, singles)
    assert ours.std() > 1e-3  # different sequences, different rewards: the comparison is not vacuous


def test_cli_reward_trains_and_prints_a_summary(tmp_path, capsys):
    data = write_pairs(tmp_path / "pairs.jsonl", 20, seed=1)
    rc = cli(["rl", "reward", "--model", "llama3-tiny", "--data", str(data), "--save", str(tmp_path / "rm"),
              "--batch-size", "8", "--lr", "1e-3", "--eval-fraction", "0.2"])
    assert rc == 0
    out = capsys.readouterr().out
    summary = json.loads(out[out.index("{\n"):])
    assert summary["steps"] == 2 and summary["eval_pairs"] == 4
    assert Path(summary["checkpoint"]) == tmp_path / "rm" / "iter_0000002"
    assert "[reward] step 1/2 | loss " in out  # the per-step terminal log, in pai-zoo train's layout


# -- bad input: clear errors before any training ---------------------------------------------
def test_missing_field_names_file_and_line(tmp_path, capsys):
    data = write_pairs(tmp_path / "pairs.jsonl", 3)
    lines = data.read_text().splitlines()
    broken = json.loads(lines[1])
    del broken["rejected"]
    lines[1] = json.dumps(broken)
    data.write_text("\n".join(lines) + "\n")
    rc = cli(["rl", "reward", "--model", "llama3-tiny", "--data", str(data), "--save", str(tmp_path / "rm")])
    err = capsys.readouterr().err
    assert rc == 1 and f"{data}:2: preference record lacks 'rejected'" in err, err
    assert not (tmp_path / "rm").exists()  # nothing trained or written


@pytest.mark.parametrize("record,message", [
    ({"prompt": "hello", "chosen": [1], "rejected": [2]}, "field 'prompt' is text but the model has no tokenizer"),
    ({"prompt": [1], "chosen": [1, 5000], "rejected": [2]}, "outside the vocabulary [0, 1000): [5000]"),
    ({"prompt": [1], "chosen": [], "rejected": [2]}, "'chosen' and 'rejected' must not be empty"),
    ({"prompt": [1], "chosen": {"a": 1}, "rejected": [2]}, "must be text or a list of token ids, not dict"),
])
def test_bad_records(tmp_path, record, message):
    data = tmp_path / "pairs.jsonl"
    data.write_text("\n" + json.dumps(record) + "\n")
    with pytest.raises(PaiZooError) as err:  # "llama": llama3-tiny's model without a tokenizer (a family name)
        RewardTrainer(model="llama", data=str(data), save=str(tmp_path / "rm")).run()
    assert f"{data}:2:" in str(err.value) and message in str(err.value)
    assert not (tmp_path / "rm").exists()


def test_malformed_json_names_its_line(tmp_path):
    data = tmp_path / "pairs.jsonl"
    data.write_text('{"prompt": [1], "chosen": [2], "rejected": [3]}\n{"prompt": [1\n')
    with pytest.raises(PaiZooError, match=rf"{data}:2: malformed JSON"):
        RewardTrainer(model="llama3-tiny", data=str(data), save=str(tmp_path / "rm")).run()


@pytest.mark.parametrize("preset,hf_class", [
    ("starcoder-tiny", "GPTBigCodeForSequenceClassification"),  # multi-query attention, learned positions
    ("galactica-tiny", "OPTForSequenceClassification"),          # OPT's position offset, LayerNorm with biases
])
def test_score_head_on_other_families_converts_with_the_same_rewards(preset, hf_class, tmp_path):
    from transformers import AutoModelForSequenceClassification

    from pai_zoo.mcore.heads import head_record
    from pai_zoo.rl.checkpoint import save_model
    from pai_zoo.rl.models import Optimizer, value_model

    handle = value_model(preset, init_std=0.5)  # the family's tiny model with a new score head
    save_model(tmp_path / "rm", handle, handle.model, Optimizer(handle.model, lr=0.0), 0, head=head_record(0))
    pai_zoo.convert(tmp_path / "rm", tmp_path / "hf", to="hf")
    hf = AutoModelForSequenceClassification.from_pretrained(tmp_path / "hf").eval()
    assert type(hf).__name__ == hf_class
    ids, mask = pad_right([[5, 6, 7, 8, 9], [10, 11, 12]], pad_id=0)
    with torch.no_grad():
        ours = sequence_scores(forward(handle.model, ids, mask), mask)
        theirs = hf(input_ids=ids, attention_mask=mask).logits.squeeze(-1)
    assert (ours - theirs).abs().max() < 1e-5, (ours, theirs)
    assert (ours[0] - ours[1]).abs() > 1e-3
