"""``pai-zoo rl ppo``: align a policy with PPO (Ouyang et al. 2022, Ziegler et al. 2019).

One step: the actor samples responses to a batch of prompts (:func:`pai_zoo.generation.generate`,
KV-cached); a teacher-forced forward pass of the actor, the frozen reference and the critic gives
per-token log-probabilities and values; the reward (model, rule or callable) scores each response;
per-token rewards are ``-kl_coef * KL_t`` plus the score at the last response token; GAE gives
advantages and returns; then ``ppo_epochs`` passes over shuffled mini-batches minimise the clipped
policy loss (whitened advantages) and the clipped value loss. The KL coefficient is fixed or
adapted (Ziegler et al.'s controller) to a target KL.

The log is ``SAVE/metrics.jsonl`` (:mod:`pai_zoo.util.metrics`), one record per step with ``pai-zoo train``'s keys
where they mean the same: ``step``, ``lr`` and ``grad_norm`` (the actor's), ``tokens_per_s`` (rollout tokens,
prompts and responses, per second of the step) and ``step_time``; and PPO's own: ``reward``, ``kl``, ``kl_coef``,
``policy_loss``, ``value_loss``, ``clip_fraction``, ``value_clip_fraction``, ``entropy``, ``approx_kl``,
``critic_grad_norm``, ``response_length`` and ``seconds`` (since the start of this process).

Layout of a batch: prompts left-padded to ``P`` columns, responses right-padded after them, so
response token ``t`` of every row sits at column ``P + t`` and is predicted at column ``P + t - 1``.
"""
from __future__ import annotations

import random
import time
from pathlib import Path

from ..generation import context_length, generate
from ..plugin.errors import PaiZooError
from ..util.metrics import METRICS_FILE, MetricsLog
from .base import RLTrainer
from .data import read_prompts
from .stopping import say_resuming, stop_here, stop_request

DEFAULTS = {
    "critic": None, "steps": 20, "rollout_batch_size": 16, "ppo_epochs": 2, "mini_batch_size": 8,
    "clip_range": 0.2, "value_clip": 0.2, "kl_coef": 0.05, "kl_target": None, "kl_horizon": 10000,
    "kl_estimator": "k1", "gamma": 1.0, "lam": 0.95, "max_new_tokens": 16, "temperature": 1.0, "top_k": 0,
    "top_p": 1.0, "actor_lr": 1e-6, "critic_lr": 1e-5, "max_grad_norm": 1.0, "whiten_advantages": True,
    "seed": 0, "save_every": 0, "resume": True, "tensor_parallel_size": 1, "quiet": False, "chat": False,
}


class PPOTrainer(RLTrainer):
    """Settings: ``actor`` (SFT policy: preset, HF folder or Megatron checkpoint), ``reward``
    (reward-model checkpoint, ``"rule:..."`` or a callable ``(prompt_ids, response_ids) -> float``),
    ``prompts`` (JSON Lines path or a list of token-id lists), ``save`` (output folder), optional
    ``critic`` (default: the reward model, or the actor with a new zero value head for a rule or
    callable reward) and the hyper-parameters of :data:`DEFAULTS`."""

    name = "ppo"
    description = "PPO with a reward model, a critic and a KL penalty against the frozen reference"

    @classmethod
    def add_arguments(cls, parser) -> None:
        a = parser.add_argument
        a("--actor", required=True, help="policy to train: preset, HF folder or Megatron-Core checkpoint")
        a(
            "--reward",
            required=True,
            help="reward-model checkpoint (pai-zoo rl reward) or rule:contains=IDS / rule:fraction=IDS",
        )
        a("--critic", help="critic initialisation (default: the reward model; the actor with a new head for a rule)")
        a("--prompts", required=True,
          help='JSON Lines of {"prompt": text | [ids]} (or {"messages": [...]} with --chat)')
        a("--chat", action="store_true",
          help="apply the tokenizer's chat template to the prompts (ChatML if it has none), as generate --chat")
        a("--save", required=True, help="output folder: actor/ and critic/ checkpoints, metrics.jsonl")
        a("--steps", type=int, default=DEFAULTS["steps"], help="PPO steps (rollout + update)")
        a("--rollout-batch-size", type=int, default=DEFAULTS["rollout_batch_size"], help="prompts per rollout")
        a("--ppo-epochs", type=int, default=DEFAULTS["ppo_epochs"], help="passes over each rollout")
        a("--mini-batch-size", type=int, default=DEFAULTS["mini_batch_size"], help="responses per update")
        a("--clip-range", type=float, default=DEFAULTS["clip_range"], help="policy ratio clip epsilon")
        a("--value-clip", type=float, default=DEFAULTS["value_clip"], help="value clip range (negative: off)")
        a("--kl-coef", type=float, default=DEFAULTS["kl_coef"], help="KL penalty coefficient (initial, if adaptive)")
        a("--kl-target", type=float, help="target KL: adapt the coefficient (Ziegler et al.); default fixed")
        a("--kl-horizon", type=int, default=DEFAULTS["kl_horizon"], help="adaptive KL controller horizon")
        a("--kl-estimator", choices=("k1", "k2", "k3"), default=DEFAULTS["kl_estimator"], help="per-token KL estimator")
        a("--gamma", type=float, default=DEFAULTS["gamma"], help="GAE discount")
        a("--lam", type=float, default=DEFAULTS["lam"], help="GAE lambda")
        a("--max-new-tokens", type=int, default=DEFAULTS["max_new_tokens"], help="response length")
        a("--temperature", type=float, default=DEFAULTS["temperature"], help="rollout sampling temperature")
        a("--top-k", type=int, default=DEFAULTS["top_k"], help="rollout top-k (0: off)")
        a("--top-p", type=float, default=DEFAULTS["top_p"], help="rollout nucleus top-p (1: off)")
        a("--actor-lr", type=float, default=DEFAULTS["actor_lr"], help="policy learning rate")
        a("--critic-lr", type=float, default=DEFAULTS["critic_lr"], help="critic learning rate")
        a("--clip-grad", "--max-grad-norm", dest="max_grad_norm", metavar="NORM", type=float,
          default=DEFAULTS["max_grad_norm"],
          help="max global gradient norm, as train --clip-grad (0 disables clipping)")
        a("--no-whiten-advantages", dest="whiten_advantages", action="store_false", help="use the raw advantages")
        a("--seed", type=int, default=DEFAULTS["seed"], help="random seed")
        a("--save-every", type=int, default=DEFAULTS["save_every"], help="checkpoint every N steps (0: at the end)")
        a("--no-resume", dest="resume", action="store_false", help="start over even if SAVE holds a checkpoint")
        a("--tp", dest="tensor_parallel_size", type=int, default=DEFAULTS["tensor_parallel_size"],
          help="tensor-parallel size (under torchrun)")

    def run(self) -> dict:
        return _PPORun({**DEFAULTS, **self.settings}).train()


class _PPORun:
    def __init__(self, s: dict):
        import torch

        from ..mcore.heads import has_score_head
        from .checkpoint import latest_iteration, load_model_state
        from .models import Optimizer, check_same_tokenizer, describe, load_model, pad_id_of, value_model
        from .ops import kl_controller
        from .rewards import make_reward

        for key in ("actor", "reward", "prompts", "save"):
            if s.get(key) is None or s.get(key) == "":
                raise PaiZooError(f"ppo: {key!r} is required")
        if s["mini_batch_size"] < 1 or s["rollout_batch_size"] < 1:
            raise PaiZooError("ppo: rollout and mini-batch sizes must be positive")
        if s["kl_estimator"] not in ("k1", "k2", "k3"):
            raise PaiZooError(f"ppo: unknown KL estimator {s['kl_estimator']!r}")
        if s["kl_target"] is not None and (s["kl_target"] <= 0 or s["kl_horizon"] <= 0):
            raise PaiZooError("ppo: --kl-target and --kl-horizon must be positive")
        if not s["temperature"] > 0:
            raise PaiZooError("ppo: --temperature must be positive (PPO samples from the policy)")
        self.s = s
        self.save = Path(s["save"])
        tp, seed = s["tensor_parallel_size"], s["seed"]
        torch.manual_seed(seed)
        resume_at = latest_iteration(self.save / "actor") if s["resume"] else None
        # -- models, checked against each other before any training -------------------------
        self.reference = load_model(s["actor"], tp, seed)
        if has_score_head(self.reference.model):
            raise PaiZooError(f"--actor {describe(self.reference)}: a reward model / critic, not a language model")
        self.reward, reward_handle = make_reward(s["reward"], tp, seed)
        if reward_handle is not None:
            check_same_tokenizer(self.reference, reward_handle, "actor", "reward model")
        critic_spec = s["critic"]
        if critic_spec is None and reward_handle is not None:
            critic_spec = reward_handle.checkpoint  # a second copy: the reward model stays frozen
        self.actor = load_model(s["actor"], tp, seed)
        self.critic = value_model(critic_spec if critic_spec is not None else s["actor"], tp, seed, init_std=0.0)
        check_same_tokenizer(self.actor, self.critic, "actor", "critic")
        self.reference.model.eval()
        for p in self.reference.model.parameters():
            p.requires_grad_(False)
        self.prompts = self._prompts(s["prompts"])
        self.order = list(range(len(self.prompts)))
        random.Random(seed).shuffle(self.order)
        self.actor_opt = Optimizer(self.actor.model, s["actor_lr"], max_grad_norm=s["max_grad_norm"])
        self.critic_opt = Optimizer(self.critic.model, s["critic_lr"], max_grad_norm=s["max_grad_norm"])
        self.kl = kl_controller(s["kl_coef"], s["kl_target"], s["kl_horizon"])
        self.step = 0
        if resume_at is not None:  # weights, optimizer, scheduler and RNG states of the last checkpoint
            load_model_state(self.save / "critic", self.critic.model, self.critic_opt)
            state = load_model_state(self.save / "actor", self.actor.model, self.actor_opt)
            self.kl.load_state_dict(state["kl"])
            self.step = state["step"]
            say_resuming(self.save, self.step, s["steps"])
        self.pad_id = pad_id_of(self.actor)
        self.log_path = self.save / METRICS_FILE
        self.log = MetricsLog(self.log_path, None if resume_at is None else self.step,
                              prefix=None if s["quiet"] else "ppo", total=s["steps"])
        self.resumed_from = resume_at

    def _prompts(self, prompts) -> list[list[int]]:
        """The prompts as token ids, each inside the vocabulary and leaving room for a response."""

        if isinstance(prompts, (str, Path)):
            prompts = read_prompts(prompts, self.actor.tokenizer, self.actor.vocab_size, chat=self.s["chat"])
        prompts = [list(p) for p in prompts]
        if not prompts:
            raise PaiZooError("ppo: no prompts")
        context, room = context_length(self.actor), self.s["max_new_tokens"]
        for number, ids in enumerate(prompts, start=1):
            if not ids or not all(isinstance(t, int) and 0 <= t < self.actor.vocab_size for t in ids):
                raise PaiZooError(
                    f"ppo: prompt {number} must be a non-empty list of token ids in [0, {self.actor.vocab_size})"
                )
            if context and len(ids) + room > context:
                raise PaiZooError(f"ppo: prompt {number} has {len(ids)} tokens; with --max-new-tokens {room} it "
                                  f"exceeds the model's context of {context}")
        return prompts

    def _logits(self, model, ids, mask, P: int):
        """The policy's next-token logits over the response positions, at the sampling temperature."""
        from .models import forward

        return forward(model, ids, mask)[:, P - 1:-1, : self.actor.vocab_size].float() / self.s["temperature"]

    # -- one rollout --------------------------------------------------------------------------
    def rollout(self) -> dict:
        import torch

        from .models import forward
        from .ops import gae, kl_penalised_rewards, kl_penalty, logprobs_of, masked_whiten

        s, B = self.s, self.s["rollout_batch_size"]
        prompts = [self.prompts[self.order[(self.step * B + i) % len(self.prompts)]] for i in range(B)]
        generations = generate(self.actor, prompts, max_new_tokens=s["max_new_tokens"], temperature=s["temperature"],
                               top_k=s["top_k"], top_p=s["top_p"], seed=s["seed"] * 1_000_003 + self.step)
        responses = [g.token_ids for g in generations]
        P, T = max(len(p) for p in prompts), max(len(r) for r in responses)
        ids = torch.full((B, P + T), self.pad_id, dtype=torch.long)
        mask = torch.zeros((B, P + T), dtype=torch.long)
        for row, (p, r) in enumerate(zip(prompts, responses)):
            ids[row, P - len(p):P] = torch.as_tensor(p)
            ids[row, P:P + len(r)] = torch.as_tensor(r)
            mask[row, P - len(p):P + len(r)] = 1
        response_mask = mask[:, P:].float()
        with torch.no_grad():
            self.actor.model.eval()
            self.critic.model.eval()
            old_logprobs = logprobs_of(self._logits(self.actor.model, ids, mask, P), ids[:, P:])
            ref_logprobs = logprobs_of(self._logits(self.reference.model, ids, mask, P), ids[:, P:])
            values = forward(self.critic.model, ids, mask)[:, P - 1:-1, 0].float()
            scores = self.reward(prompts, responses).float()
            rewards = kl_penalised_rewards(scores, old_logprobs, ref_logprobs, response_mask, self.kl.value,
                                           s["kl_estimator"])
            advantages, returns = gae(rewards, values, response_mask, s["gamma"], s["lam"])
            if s["whiten_advantages"]:
                advantages = masked_whiten(advantages, response_mask)
            kl_per_sequence = (kl_penalty(old_logprobs, ref_logprobs, "k1") * response_mask).sum(-1)
        return {"ids": ids, "mask": mask, "P": P, "response_mask": response_mask, "old_logprobs": old_logprobs,
                    "values": values, "advantages": advantages, "returns": returns, "scores": scores,
                    "kl": float(kl_per_sequence.mean()), "lengths": response_mask.sum(-1)}

    # -- PPO updates --------------------------------------------------------------------------
    def update(self, batch: dict) -> dict:
        import torch

        from .models import forward
        from .ops import entropy_of, logprobs_of, masked_mean, policy_loss, value_loss

        s, B, P = self.s, self.s["rollout_batch_size"], batch["P"]
        value_clip = s["value_clip"] if s["value_clip"] is not None and s["value_clip"] >= 0 else None
        generator = torch.Generator().manual_seed(s["seed"] * 7919 + self.step)
        sums: dict[str, float] = {}
        n = 0
        for _epoch in range(s["ppo_epochs"]):
            perm = torch.randperm(B, generator=generator)
            for first in range(0, B, s["mini_batch_size"]):
                idx = perm[first:first + s["mini_batch_size"]]
                ids, mask, rmask = batch["ids"][idx], batch["mask"][idx], batch["response_mask"][idx]
                self.actor.model.train()
                logits = self._logits(self.actor.model, ids, mask, P)
                logprobs = logprobs_of(logits, ids[:, P:])
                pg_loss, clip_frac = policy_loss(logprobs, batch["old_logprobs"][idx], batch["advantages"][idx], rmask,
                                                 s["clip_range"])
                pg_loss.backward()
                actor_norm = self.actor_opt.step()
                self.critic.model.train()
                values = forward(self.critic.model, ids, mask)[:, P - 1:-1, 0].float()
                vf_loss, vf_clip_frac = value_loss(
                    values, batch["values"][idx], batch["returns"][idx], rmask, value_clip
                )
                vf_loss.backward()
                critic_norm = self.critic_opt.step()
                with torch.no_grad():
                    entropy = masked_mean(entropy_of(logits.detach()), rmask)
                    approx_kl = masked_mean(batch["old_logprobs"][idx] - logprobs.detach(), rmask)
                for key, value in (("policy_loss", pg_loss), ("value_loss", vf_loss), ("clip_fraction", clip_frac),
                                   ("value_clip_fraction", vf_clip_frac), ("entropy", entropy),
                                   ("approx_kl", approx_kl), ("grad_norm", actor_norm),
                                   ("critic_grad_norm", critic_norm)):
                    sums[key] = sums.get(key, 0.0) + float(value.detach() if hasattr(value, "detach") else value)
                n += 1
        return {k: v / n for k, v in sums.items()}

    def checkpoint(self) -> None:
        from ..mcore.heads import head_record
        from .checkpoint import save_model

        state = {"step": self.step, "kl": self.kl.state_dict(), "settings": _plain(self.s)}
        save_model(self.save / "critic", self.critic, self.critic.model, self.critic_opt, self.step,
                   head=head_record(self.pad_id), state=state)
        save_model(self.save / "actor", self.actor, self.actor.model, self.actor_opt, self.step, state=state)

    def train(self) -> dict:
        start = time.perf_counter()
        folders = [self.save / "actor", self.save / "critic"]
        with stop_request(folders, lambda: self.step) as stop:  # a signal: the step in progress is saved
            self._loop(stop, folders, start)
            record, first_reward = self._record, self._first_reward
            if self.resumed_from is None or record:
                self.checkpoint()
        self.log.close()
        return {"steps": self.step, "last": record, "first_reward": first_reward, "resumed_from": self.resumed_from,
                "actor": str(self.save / "actor"), "critic": str(self.save / "critic"),
                "log": str(self.log_path)}

    def _loop(self, stop, folders, start: float) -> None:
        """The steps; on a signal, the step in progress is finished and saved (see :mod:`.stopping`)."""
        s = self.s
        self._record, self._first_reward = {}, None
        while self.step < s["steps"]:
            step_start = time.perf_counter()
            lr = self.actor_opt.optimizer.param_groups[0]["lr"]
            batch = self.rollout()
            stats = self.update(batch)
            kl_coef = self.kl.value
            self.kl.update(batch["kl"], s["rollout_batch_size"])
            self.step += 1
            step_time = time.perf_counter() - step_start
            record = {"step": self.step, "lr": lr, "grad_norm": stats.pop("grad_norm"),
                      "tokens_per_s": float(batch["mask"].sum()) / step_time, "step_time": round(step_time, 3),
                      "reward": float(batch["scores"].mean()), "kl": batch["kl"], "kl_coef": kl_coef,
                      **stats, "response_length": float(batch["lengths"].mean()),
                      "seconds": round(time.perf_counter() - start, 3)}
            self._record = record
            self._first_reward = record["reward"] if self._first_reward is None else self._first_reward
            self.log.write(record)
            saved = bool(s["save_every"] and self.step % s["save_every"] == 0 and self.step < s["steps"])
            if saved:
                self.checkpoint()
            stop_here(stop, self.step, s["steps"], self.checkpoint, saved, folders)


def _plain(settings: dict) -> dict:
    """The JSON-able settings (a callable reward or in-memory prompts are named, not stored)."""
    out = {}
    for key, value in settings.items():
        if isinstance(value, (str, int, float, bool)) or value is None:
            out[key] = value
        elif isinstance(value, Path):
            out[key] = str(value)
        else:
            out[key] = f"<{type(value).__name__}>"
    return out

