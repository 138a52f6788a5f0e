"""``pai-zoo rl dpo``: direct preference optimisation on ``{prompt, chosen, rejected}`` pairs, TRL's losses
(:mod:`pai_zoo_rl.dpo_loss`) on megatron-core's parallel layouts.

A step takes ``--batch-size`` pairs (split over the data-parallel ranks), runs each pair's ``prompt + chosen`` and
``prompt + rejected`` through the policy in one batch (chosen rows first, right-padded, as TRL's collator lays
them out), sums each completion's token log-probabilities and applies the loss against the reference model's. The
reference is the starting policy (or ``--ref-model``); its log-probabilities are computed once, before the first
step, and kept in ``SAVE/reference_logps.json`` (a resumed run reads them back), or computed with every step under
``--no-precompute-ref``. A held-out share of the pairs (``--eval-fraction``) is scored before the first step and
after the last (and every ``--eval-every`` steps).

``SAVE/metrics.jsonl`` has one record per step with TRL's names -- ``loss``, ``rewards/chosen``,
``rewards/rejected``, ``rewards/accuracies``, ``rewards/margins``, ``logps/chosen``, ``logps/rejected`` -- and
``pai-zoo train``'s ``step``, ``lr``, ``grad_norm``, ``tokens_per_s``, ``step_time``; an evaluation record has the
same values prefixed ``eval_`` (TRL's evaluation names). The checkpoints are ``pai-zoo train``'s (SAVE is a
Megatron-Core checkpoint folder that ``pai-zoo convert`` and :func:`pai_zoo.load` read).
"""
from __future__ import annotations

import hashlib
import json
import random
import time
from pathlib import Path

from pai_zoo.errors import PaiZooError, SettingError
from pai_zoo.rl import RLTrainer
from pai_zoo.rl.stopping import say_resuming, stop_here, stop_request
from pai_zoo.util.files import write_text_atomic
from pai_zoo.util.metrics import METRICS_FILE, MetricsLog

from .runs import (
    LORA_DEFAULTS,
    add_lora_arguments,
    add_model_arguments,
    add_run_arguments,
    check_run_settings,
    save_policy,
    step_slice,
)
from .variants import DPO_LOSS_TYPES as LOSS_TYPES

DEFAULTS = {
    "ref_model": None, "chat": False, "beta": 0.1, "loss_type": "sigmoid", "label_smoothing": 0.0,
    "precompute_ref": True, "batch_size": 8, "epochs": 1, "max_steps": 0, "lr": 1e-6, "weight_decay": 0.0,
    "max_grad_norm": 1.0, "eval_fraction": 0.1, "eval_every": 0, "seed": 0, "save_every": 0, "resume": True,
    "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "quiet": False, **LORA_DEFAULTS,
}
REFERENCE_FILE = "reference_logps.json"
STEP_KEYS = ("rewards/chosen", "rewards/rejected", "rewards/accuracies", "rewards/margins", "logps/chosen",
             "logps/rejected")


class DPOTrainer(RLTrainer):
    """Settings: ``model`` (the SFT policy: preset, HF folder or Megatron-Core checkpoint), ``data`` (JSON Lines of
    preference pairs, :func:`pai_zoo.rl.data.read_pairs`), ``save`` (output folder) and :data:`DEFAULTS`."""

    name = "dpo"
    description = "DPO and its IPO / hinge / robust variants on preference pairs, TRL's losses"

    @classmethod
    def add_arguments(cls, parser) -> None:
        a = parser.add_argument
        add_model_arguments(parser, "for the log-ratios")
        a("--data", required=True,
          help='JSON Lines of {"prompt", "chosen", "rejected"}: text or token ids, or a chat (prompt a list of '
               "messages, chosen/rejected the assistant's text or message)")
        a("--chat", action="store_true", help="render text prompts with the tokenizer's chat template as a user "
                                              "turn and chosen/rejected as the assistant's (ChatML if it has none)")
        a("--beta", type=float, default=DEFAULTS["beta"], help="the KL strength beta (IPO: its tau)")
        a("--loss-type", choices=LOSS_TYPES, default=DEFAULTS["loss_type"],
          help="sigmoid (DPO), hinge, ipo, robust (with --label-smoothing) or sigmoid_norm (length-normalised)")
        a("--label-smoothing", type=float, default=DEFAULTS["label_smoothing"],
          help="robust DPO's assumed rate of flipped labels, in [0, 0.5)")
        a("--no-precompute-ref", dest="precompute_ref", action="store_false",
          help="compute the reference log-probabilities with every step (default: once, cached in SAVE)")
        a("--batch-size", type=int, default=DEFAULTS["batch_size"], help="pairs per step (all data-parallel ranks)")
        a("--epochs", type=int, default=DEFAULTS["epochs"], help="passes over the training pairs")
        a("--max-steps", type=int, default=DEFAULTS["max_steps"], help="stop after N steps (0: the epochs decide)")
        a("--lr", type=float, default=DEFAULTS["lr"], help="learning rate (constant)")
        a("--weight-decay", type=float, default=DEFAULTS["weight_decay"], help="AdamW weight decay")
        a("--eval-fraction", type=float, default=DEFAULTS["eval_fraction"], help="share of pairs held out")
        a("--eval-every", type=int, default=DEFAULTS["eval_every"],
          help="evaluate every N steps (0: before the first and after the last only)")
        add_run_arguments(parser, DEFAULTS)
        add_lora_arguments(parser)

    def run(self) -> dict:
        return _DPORun({**DEFAULTS, **self.settings}).train()


class _DPORun:
    def __init__(self, s: dict):
        import torch

        from pai_zoo.rl.checkpoint import latest_iteration, load_model_state
        from pai_zoo.rl.data import read_pairs
        from pai_zoo.rl.models import Optimizer, load_model, pad_id_of
        from pai_zoo.rl.policy import data_parallel_layout

        from .runs import attach_lora, check_lora_base, load_reference, lora_settings

        check_run_settings("dpo", s, ("model", "data", "save"))
        if not s["beta"] > 0:
            raise SettingError(f"--beta {s['beta']}: must be positive")
        if s["loss_type"] not in LOSS_TYPES:
            raise SettingError(f"--loss-type {s['loss_type']}: one of {', '.join(LOSS_TYPES)}")
        if not 0 <= s["label_smoothing"] < 0.5:
            raise SettingError(f"--label-smoothing {s['label_smoothing']}: must be in [0, 0.5)")
        if s["label_smoothing"] and s["loss_type"] != "robust":
            raise SettingError(f"--label-smoothing applies to --loss-type robust, not {s['loss_type']}")
        if s["batch_size"] < 1 or s["epochs"] < 1 or not 0 <= s["eval_fraction"] < 1:
            raise SettingError("--batch-size and --epochs must be positive and --eval-fraction in [0, 1)")
        self.s, self.save = s, Path(s["save"])
        torch.manual_seed(s["seed"])
        tp, pp, seed = s["tensor_parallel_size"], s["pipeline_parallel_size"], s["seed"]
        self.policy = load_model(s["model"], tp, seed, pp)
        check_lora_base(self.policy, lora_settings(s))
        self.vocab_size = self.policy.vocab_size
        pairs = read_pairs(s["data"], self.policy.tokenizer, self.vocab_size, chat=s["chat"])  # bad records first
        context = self.policy.mcore_config.get("max_sequence_length")
        for pair in pairs:
            longest = len(pair.prompt) + max(len(pair.chosen), len(pair.rejected))
            if context and longest > context:
                raise PaiZooError(f"{pair.where}: {longest} tokens exceed the model's context of {context}")
        self.dp_rank, self.dp_size = data_parallel_layout()
        if s["batch_size"] % self.dp_size:
            raise SettingError(f"--batch-size {s['batch_size']} must be a multiple of the {self.dp_size} "
                               "data-parallel ranks")
        order = list(range(len(pairs)))
        random.Random(seed).shuffle(order)
        held = round(len(pairs) * s["eval_fraction"]) if s["eval_fraction"] > 0 else 0
        held = max(1, held) if s["eval_fraction"] > 0 else 0
        self.pairs = pairs
        self.eval_ids, self.train_ids = sorted(order[:held]), sorted(order[held:])
        self.steps_per_epoch = len(self.train_ids) // s["batch_size"]
        if self.steps_per_epoch == 0:
            raise SettingError(f"{s['data']}: {len(self.train_ids)} training pairs, fewer than --batch-size "
                               f"{s['batch_size']}")
        total = s["epochs"] * self.steps_per_epoch
        self.total = min(total, s["max_steps"]) if s["max_steps"] else total
        lora = lora_settings(s)
        reference_spec = s["ref_model"] if s["ref_model"] is not None else s["model"]
        if lora is not None and s["ref_model"] is None and s["precompute_ref"]:
            self.reference = self.policy  # the base, before its adapters: no second model (TRL's way with PEFT)
        else:
            self.reference = load_reference(reference_spec, self.policy, tp, seed, pp)
        self.pad_id = pad_id_of(self.policy)
        resume_at = latest_iteration(self.save) if s["resume"] else None
        self.ref_logps = self._reference_logps(reference_spec, resume_at) if s["precompute_ref"] else None
        if s["precompute_ref"]:
            self.reference = None  # its log-probabilities are all it was needed for
        if lora is not None:
            attach_lora(self.policy, lora, seed)
        self.lora = lora
        self.optimizer = Optimizer(self.policy.model, s["lr"], s["weight_decay"], s["max_grad_norm"])
        self.step = 0
        if resume_at is not None:
            self.step = load_model_state(self.save, self.policy.model, self.optimizer)["step"]
            say_resuming(self.save, self.step, self.total)
        self.resumed_from = resume_at
        self.log = MetricsLog(self.save / METRICS_FILE, None if resume_at is None else self.step,
                              prefix=None if s["quiet"] else "dpo", total=self.total)

    # -- batches ------------------------------------------------------------------------------
    def _batch(self, indices: list[int]) -> dict:
        return pair_batch([self.pairs[i] for i in indices], self.pad_id, indices)

    def _sequence_logps(self, model, batch: dict):
        from pai_zoo.rl.policy import token_logprobs

        return (token_logprobs(model, batch, self.vocab_size) * batch["completion"][:, 1:]).sum(-1)

    def _reference_logps(self, spec, resume_at) -> dict:
        """``{pair index: (chosen, rejected)}`` of the reference, cached in SAVE (read back on resume)."""
        data = Path(self.s["data"]).read_bytes()
        key = {"data": hashlib.sha256(data).hexdigest(), "reference": str(spec), "chat": self.s["chat"]}
        cache = self.save / REFERENCE_FILE
        if resume_at is not None and cache.is_file():
            record = json.loads(cache.read_text())
            if record.get("key") == key:
                return {int(k): tuple(v) for k, v in record["logps"].items()}
        logps = {}
        ids = list(range(len(self.pairs)))
        size = self.s["batch_size"]
        for first in range(0, len(ids), size):
            chunk = ids[first:first + size]
            values = self._sequence_logps(self.reference.model, self._batch(chunk)).tolist()
            for k, i in enumerate(chunk):
                logps[i] = (values[k], values[len(chunk) + k])
        from pai_zoo.util.dist import is_rank0

        if is_rank0():
            self.save.mkdir(parents=True, exist_ok=True)
            write_text_atomic(cache, json.dumps({"key": key, "logps": {str(k): v for k, v in logps.items()}}) + "\n")
        return logps

    def _with_reference(self, batch: dict) -> dict:
        import torch

        if self.ref_logps is not None:
            index = batch["index"].tolist()
            ref = [self.ref_logps[i][0] for i in index] + [self.ref_logps[i][1] for i in index]
            batch["ref"] = torch.tensor(ref, dtype=torch.float32)
        else:
            batch["ref"] = self._sequence_logps(self.reference.model, batch)
        return batch

    # -- the loss -------------------------------------------------------------------------------
    def loss(self, logits, batch: dict):
        s = self.s
        return batch_loss(logits, batch, self.vocab_size, s["beta"], s["loss_type"], s["label_smoothing"])

    def evaluate(self) -> dict:
        """TRL's metrics on the held-out pairs, prefixed ``eval_`` (averaged over pairs)."""
        import torch

        from pai_zoo.mcore.pipeline import forward_logits

        if not self.eval_ids:
            return {}
        sums: dict[str, float] = {}
        model = self.policy.model
        model.eval()
        size = self.s["batch_size"]
        with torch.no_grad():
            for first in range(0, len(self.eval_ids), size):
                chunk = self.eval_ids[first:first + size]
                batch = self._with_reference(self._batch(chunk))
                loss, values = self.loss(forward_logits(model, batch["ids"], batch["mask"]), batch)
                for key, value in {"loss": loss, **values}.items():
                    sums[key] = sums.get(key, 0.0) + float(value) * len(chunk)
        model.train()
        return {f"eval_{k}": v / len(self.eval_ids) for k, v in sums.items()}

    # -- the run --------------------------------------------------------------------------------
    def _checkpoint(self) -> None:
        save_policy(self.policy, self.optimizer, self.save, self.step, self.lora)

    def train(self) -> dict:
        from pai_zoo.rl.policy import data_parallel_share, train_step

        s = self.s
        start = time.perf_counter()
        first_eval = self.evaluate() if self.step == 0 else {}
        if first_eval:
            self.log.write({"step": 0, **first_eval})
        record: dict = {}
        with stop_request([self.save], lambda: self.step) as stop:  # a signal: the step in progress is saved
            while self.step < self.total:
                step_start = time.perf_counter()
                lr = self.optimizer.optimizer.param_groups[0]["lr"]
                pairs = step_slice(self.train_ids, s["seed"], self.step, s["batch_size"])
                batch = self._with_reference(self._batch(data_parallel_share(pairs, self.dp_rank, self.dp_size)))
                values, grad_norm = train_step(self.optimizer, batch, self.loss, STEP_KEYS)
                self.step += 1
                step_time = time.perf_counter() - step_start
                tokens = int(batch["mask"].sum()) * self.dp_size
                record = {"step": self.step, "loss": values.pop("loss"), "lr": lr, "grad_norm": grad_norm, **values,
                          "tokens_per_s": tokens / step_time, "step_time": round(step_time, 3),
                          "epoch": self.step / self.steps_per_epoch, "seconds": round(time.perf_counter() - start, 3)}
                self.log.write(record)
                if s["eval_every"] and self.step % s["eval_every"] == 0 and self.step < self.total:
                    self.log.write({"step": self.step, **self.evaluate()})
                saved = bool(s["save_every"] and self.step % s["save_every"] == 0 and self.step < self.total)
                if saved:
                    self._checkpoint()
                stop_here(stop, self.step, self.total, self._checkpoint, saved, [self.save])
        last_eval = self.evaluate() if record or self.resumed_from is None else {}
        if last_eval:
            self.log.write({"step": self.step, **last_eval})
        if self.resumed_from is None or record:
            self._checkpoint()
        self.log.close()
        return {"steps": self.step, "last": record, "eval_before": first_eval, "eval_after": last_eval,
                "resumed_from": self.resumed_from, "checkpoint": str(self.save), "log": str(self.save / METRICS_FILE)}


def pair_batch(pairs, pad_id: int, indices=None) -> dict:
    """A batch of :class:`~pai_zoo.rl.data.Pair` s in TRL's layout: ``prompt + chosen`` rows, then ``prompt +
    rejected`` rows, right-padded; ``completion`` marks the answers' tokens, ``index`` the pairs' numbers."""
    import torch

    from pai_zoo.rl.models import pad_right

    rows = [p.prompt + p.chosen for p in pairs] + [p.prompt + p.rejected for p in pairs]
    ids, mask = pad_right(rows, pad_id)
    completion = torch.zeros_like(mask)
    for row, (p, answer) in enumerate([(p, p.chosen) for p in pairs] + [(p, p.rejected) for p in pairs]):
        completion[row, len(p.prompt):len(p.prompt) + len(answer)] = 1
    return {"ids": ids, "mask": mask, "completion": completion,
            "index": torch.as_tensor(list(range(len(pairs))) if indices is None else list(indices))}


def batch_loss(logits, batch: dict, vocab_size: int, beta: float, loss_type: str, label_smoothing: float = 0.0):
    """The mean DPO loss of a :func:`pair_batch` (with ``ref``: the reference's sequence log-probabilities, chosen
    rows then rejected) from the policy's logits, and TRL's step metrics."""
    from pai_zoo.rl.policy import next_token_logprobs

    from .dpo_loss import dpo_losses

    completion = batch["completion"][:, 1:]
    logps = (next_token_logprobs(logits, batch["ids"], vocab_size) * completion).sum(-1)
    tokens = completion.sum(-1).float()
    n = logps.shape[0] // 2
    losses, chosen, rejected = dpo_losses(logps[:n], logps[n:], batch["ref"][:n], batch["ref"][n:], beta, loss_type,
                                          label_smoothing, tokens[:n], tokens[n:])
    return losses.mean(), {"rewards/chosen": chosen.mean(), "rewards/rejected": rejected.mean(),
                           "rewards/accuracies": (chosen > rejected).float().mean(),
                           "rewards/margins": (chosen - rejected).mean(),
                           "logps/chosen": logps[:n].detach().mean(), "logps/rejected": logps[n:].detach().mean()}
