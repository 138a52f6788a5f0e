"""``pai-zoo rl reward``: train a reward model on preference pairs.

The model (any installed family) gets a score head in place of its LM head; each pair's
``prompt + chosen`` and ``prompt + rejected`` are scored at their last token and trained with
the pairwise ranking loss ``-log sigmoid(r_chosen - r_rejected)``. A held-out split reports
pairwise accuracy (the share of pairs with ``r_chosen > r_rejected``) before and after.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

from ..plugin.errors import PaiZooError
from ..util.metrics import METRICS_FILE, MetricsLog
from .base import RLTrainer
from .data import read_pairs
from .stopping import stop_here, stop_request

DEFAULTS = {"epochs": 1, "batch_size": 8, "lr": 1e-5, "weight_decay": 0.0, "eval_fraction": 0.1, "seed": 0,
            "max_grad_norm": 1.0, "tensor_parallel_size": 1, "log_every": 1, "chat": False}


class RewardTrainer(RLTrainer):
    """Settings: ``model`` (SFT model: preset, HF folder or Megatron checkpoint), ``data``
    (JSON Lines of ``{"prompt", "chosen", "rejected"}``), ``save`` (output folder), and
    ``epochs``, ``batch_size``, ``lr``, ``weight_decay``, ``eval_fraction``, ``seed``,
    ``max_grad_norm`` (``--clip-grad``), ``tensor_parallel_size``, ``log_every`` and ``chat`` (apply the
    chat template: :func:`pai_zoo.rl.data.read_pairs`)."""

    name = "reward"
    description = "reward model on preference pairs (pairwise ranking loss)"

    @classmethod
    def add_arguments(cls, parser) -> None:
        parser.add_argument("--model", required=True, help="SFT model: preset, HF folder or Megatron-Core checkpoint")
        parser.add_argument("--data", required=True, help='JSON Lines of {"prompt", "chosen", "rejected"}')
        parser.add_argument("--chat", action="store_true",
                            help="render each prompt (text: a user turn, or a list of messages) with the "
                                 "tokenizer's chat template and chosen/rejected as the assistant's turn "
                                 "(ChatML if it has none)")
        parser.add_argument("--save", required=True, help="output folder (Megatron-Core checkpoint, metrics.jsonl)")
        parser.add_argument("--epochs", type=int, default=DEFAULTS["epochs"], help="passes over the training pairs")
        parser.add_argument("--batch-size", type=int, default=DEFAULTS["batch_size"], help="pairs per step")
        parser.add_argument("--lr", type=float, default=DEFAULTS["lr"], help="learning rate")
        parser.add_argument("--weight-decay", type=float, default=DEFAULTS["weight_decay"], help="AdamW weight decay")
        parser.add_argument("--eval-fraction", type=float, default=DEFAULTS["eval_fraction"], help="held-out share")
        parser.add_argument("--clip-grad", "--max-grad-norm", dest="max_grad_norm", metavar="NORM", type=float,
                            default=DEFAULTS["max_grad_norm"],
                            help="max global gradient norm, as train --clip-grad (0 disables clipping)")
        parser.add_argument("--seed", type=int, default=DEFAULTS["seed"], help="random seed")
        parser.add_argument("--tp", dest="tensor_parallel_size", type=int,
                            default=DEFAULTS["tensor_parallel_size"], help="tensor-parallel size (torchrun)")
        parser.add_argument("--log-every", type=int, default=DEFAULTS["log_every"], help="log every N steps")

    def run(self) -> dict:
        import torch

        from ..mcore.heads import head_record
        from .checkpoint import save_model
        from .models import Optimizer, load_model, pad_id_of, value_model
        from .ops import pairwise_loss

        s = {**DEFAULTS, **self.settings}
        for key in ("model", "data", "save"):
            if not s.get(key):
                raise PaiZooError(f"reward trainer: {key!r} is required")
        torch.manual_seed(s["seed"])
        handle = load_model(s["model"], s["tensor_parallel_size"], s["seed"])
        # bad records fail before training
        pairs = read_pairs(s["data"], handle.tokenizer, handle.vocab_size, chat=s["chat"])
        context = handle.mcore_config.get("max_sequence_length")
        for pair in pairs:
            longest = len(pair.prompt) + max(len(pair.chosen), len(pair.rejected))
            if context and longest > context:
                raise PaiZooError(f"{pair.where}: {longest} tokens exceed the model's context of {context}")
        handle = value_model(handle, seed=s["seed"])
        model = handle.model
        pad_id = pad_id_of(handle)
        order = list(range(len(pairs)))
        random.Random(s["seed"]).shuffle(order)
        held = max(1, round(len(pairs) * s["eval_fraction"])) if len(pairs) > 1 and s["eval_fraction"] > 0 else 0
        evaluation, train = [pairs[i] for i in order[:held]], [pairs[i] for i in order[held:]]
        optimizer = Optimizer(model, s["lr"], s["weight_decay"], s["max_grad_norm"])
        steps = s["epochs"] * -(-len(train) // s["batch_size"])
        log = MetricsLog(Path(s["save"]) / METRICS_FILE, prefix="reward", total=steps)
        accuracy_before = evaluate(model, evaluation, pad_id)
        log.write(
            {"step": 0, "eval_accuracy": accuracy_before, "eval_pairs": len(evaluation), "train_pairs": len(train)}
        )
        step, loss = 0, float("nan")
        start = time.perf_counter()
        # a signal: the step in progress is saved (this trainer does not resume: a rerun starts again)
        with stop_request([s["save"]], lambda: step, resumes=False) as stop:
            for epoch in range(s["epochs"]):
                random.Random(s["seed"] + epoch + 1).shuffle(train)
                for first in range(0, len(train), s["batch_size"]):
                    batch = train[first:first + s["batch_size"]]
                    model.train()
                    step_start = time.perf_counter()
                    lr = optimizer.optimizer.param_groups[0]["lr"]
                    chosen, rejected = score_pairs(model, batch, pad_id)
                    loss_t = pairwise_loss(chosen, rejected)
                    loss_t.backward()
                    grad_norm = optimizer.step()
                    step, loss = step + 1, float(loss_t.detach())
                    if step % s["log_every"] == 0:
                        acc = float((chosen > rejected).float().mean())
                        step_time = time.perf_counter() - step_start
                        tokens = sum(len(p.prompt) * 2 + len(p.chosen) + len(p.rejected) for p in batch)
                        log.write({"step": step, "loss": loss, "lr": lr, "grad_norm": grad_norm,
                                   "tokens_per_s": tokens / step_time, "step_time": round(step_time, 3),
                                   "epoch": epoch, "train_accuracy": acc, "seconds": time.perf_counter() - start})
                    stop_here(stop, step, steps, lambda: save_model(s["save"], handle, model, optimizer, step,
                                                                    head=head_record(pad_id)),
                              False, [s["save"]], resumes=False)
            accuracy = evaluate(model, evaluation, pad_id)
            log.write({"step": step, "eval_accuracy": accuracy, "eval_pairs": len(evaluation)})
            path = save_model(s["save"], handle, model, optimizer, step, head=head_record(pad_id))
        log.close()
        return {"steps": step, "loss": loss, "eval_accuracy_before": accuracy_before, "eval_accuracy": accuracy,
                "eval_pairs": len(evaluation), "checkpoint": str(path)}


def score_pairs(model, pairs, pad_id: int):
    """``(r_chosen [b], r_rejected [b])`` of a batch of pairs, in one forward pass."""
    from ..mcore.heads import sequence_scores
    from .models import forward, pad_right

    seqs = [p.prompt + p.chosen for p in pairs] + [p.prompt + p.rejected for p in pairs]
    ids, mask = pad_right(seqs, pad_id)
    scores = sequence_scores(forward(model, ids, mask), mask).float()
    return scores[: len(pairs)], scores[len(pairs):]


def evaluate(model, pairs, pad_id: int, batch_size: int = 32) -> float | None:
    """Pairwise accuracy on ``pairs`` (None when there are none)."""
    import torch

    if not pairs:
        return None
    model.eval()
    right = 0
    with torch.no_grad():
        for first in range(0, len(pairs), batch_size):
            chosen, rejected = score_pairs(model, pairs[first:first + batch_size], pad_id)
            right += int((chosen > rejected).sum())
    return right / len(pairs)
