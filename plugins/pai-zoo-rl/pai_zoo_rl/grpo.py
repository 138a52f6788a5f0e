"""``pai-zoo rl grpo``: group-relative policy optimisation with reward functions (Shao et al. 2024), TRL's
objective (:mod:`pai_zoo_rl.grpo_loss`) on megatron-core's parallel layouts, without a value model.

A step takes ``--batch-size`` prompts (split over the data-parallel ranks) and samples ``--num-generations`` (G)
completions of each from the policy with pai-zoo's own generation (:func:`pai_zoo.generation.generate`: the
megatron-core KV-cached decode loop, or under pipeline parallelism a full forward per token through the stages).
Each prompt's group is sampled with a seed of its own (``--seed``, the step and the prompt's number), so the tokens
do not depend on the layout or the data-parallel size, and a resumed run samples what the first would have. The
reward functions (``--reward-funcs``, any registered through ``pai_zoo_reward_funcs``) score each completion with
TRL's contract; their weighted sum, normalised within each prompt's group, is every token's advantage. The policy
then takes ``--num-iterations`` optimisation steps on the batch against the clipped ratio to the policy that
sampled, plus ``--beta`` times the k3 KL to the reference model (none is loaded at ``--beta 0``).

``SAVE/metrics.jsonl`` has one record per step with TRL's names: ``reward``, ``reward_std``,
``rewards/NAME/mean``, ``rewards/NAME/std``, ``frac_reward_zero_std``, ``kl`` (when ``--beta`` is not 0),
``clip_ratio/low_mean``, ``clip_ratio/high_mean``, ``clip_ratio/region_mean``, ``entropy``,
``completions/mean_length``, ``completions/min_length``, ``completions/max_length``,
``completions/clipped_ratio``, ``loss``, with ``step``, ``lr``, ``grad_norm``, ``rollout_tokens_per_s``,
``train_tokens_per_s``, ``step_time`` and ``seconds``.

The rollout engine is pai-zoo's generation on the training ranks: simple and exact (the tokens do not depend on the
tensor-parallel layout), but a CPU or small-GPU engine. A GPU deployment would sample with vLLM or SGLang instead:
the place is :meth:`_GRPORun.sample`, which returns token ids per completion; the trainer needs nothing else of it.
"""
from __future__ import annotations

import time
from pathlib import Path

from pai_zoo.errors import PaiZooError, SettingError
from pai_zoo.rl import RLTrainer
from pai_zoo.rl.stopping import say_resuming, stop_here, stop_request
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
from .variants import GRPO_LOSS_TYPES as LOSS_TYPES
from .variants import REWARD_SCALES as SCALES

DEFAULTS = {
    "ref_model": None, "chat": False, "reward_funcs": "exact_match", "reward_weights": None, "num_generations": 8,
    "batch_size": 4, "steps": 20, "max_completion_length": 32, "temperature": 1.0, "top_k": 0, "top_p": 1.0,
    "beta": 0.04, "epsilon": 0.2, "epsilon_high": None, "loss_type": "dapo", "scale_rewards": "group",
    "num_iterations": 1, "bias_correction_kl": True, "lr": 1e-6, "weight_decay": 0.0, "max_grad_norm": 1.0,
    "seed": 0, "save_every": 0, "resume": True, "tensor_parallel_size": 1, "pipeline_parallel_size": 1, "quiet": False,
    **LORA_DEFAULTS,
}
PROMPT_KEYS = ("prompt", "messages")  # a record's prompt; its other fields go to the reward functions


def _reward_help() -> str:
    from pai_zoo.rl.reward_funcs import list_reward_funcs

    try:
        names = ", ".join(sorted(list_reward_funcs()))
    except PaiZooError as exc:
        names = f"(none: {exc})"
    return (f"reward functions, comma-separated; registered: {names}; or model:PATH, a reward model trained by "
            "`pai-zoo rl reward`")


class GRPOTrainer(RLTrainer):
    """Settings: ``model`` (the policy: preset, HF folder or Megatron-Core checkpoint), ``data`` (JSON Lines of
    prompt records: ``{"prompt": text | [ids] | [messages], ...fields}``), ``save`` (output folder) and
    :data:`DEFAULTS`."""

    name = "grpo"
    description = "GRPO: group-relative advantages from reward functions, TRL's clipped objective and k3 KL"

    @classmethod
    def add_arguments(cls, parser) -> None:
        a = parser.add_argument
        add_model_arguments(parser, "for the KL term")
        a("--data", required=True, help='JSON Lines of {"prompt": text | [ids], FIELD: ...} (or {"messages": '
                                        "[...]}); the other fields reach the reward functions")
        a("--chat", action="store_true", help="render the prompts with the tokenizer's chat template")
        a("--reward-funcs", default=DEFAULTS["reward_funcs"], metavar="NAME[,NAME]", help=_reward_help())
        a("--reward-weights", metavar="W[,W]", help="one weight per reward function (default: 1 each)")
        a("--num-generations", type=int, default=DEFAULTS["num_generations"], metavar="G",
          help="completions sampled per prompt (the group; at least 2)")
        a("--batch-size", type=int, default=DEFAULTS["batch_size"],
          help="prompts per step, all data-parallel ranks (each answered G times)")
        a("--steps", type=int, default=DEFAULTS["steps"], help="rollout + update steps")
        a("--max-completion-length", "--max-new-tokens", dest="max_completion_length", type=int,
          default=DEFAULTS["max_completion_length"], help="longest completion in tokens")
        a("--temperature", type=float, default=DEFAULTS["temperature"], help="sampling temperature (> 0)")
        a("--top-k", type=int, default=DEFAULTS["top_k"], help="sampling top-k (0: off)")
        a("--top-p", type=float, default=DEFAULTS["top_p"], help="sampling nucleus top-p (1: off)")
        a("--beta", type=float, default=DEFAULTS["beta"], help="KL coefficient (0: no reference model is loaded)")
        a("--epsilon", type=float, default=DEFAULTS["epsilon"], help="lower clip range of the ratio")
        a("--epsilon-high", type=float, help="upper clip range (DAPO; default: --epsilon)")
        a("--loss-type", choices=LOSS_TYPES, default=DEFAULTS["loss_type"],
          help="aggregation as TRL names it: grpo (sequence level), bnpo, dr_grpo or dapo (token level)")
        a("--scale-rewards", choices=SCALES, default=DEFAULTS["scale_rewards"],
          help="divide the advantages by the group's std, the batch's, or none (Dr. GRPO)")
        a("--num-iterations", type=int, default=DEFAULTS["num_iterations"],
          help="optimisation steps per rollout batch (the sampling policy's log-probabilities are kept)")
        a("--no-bias-correction-kl", dest="bias_correction_kl", action="store_false",
          help="leave the KL term unweighted by the ratio (TRL's use_bias_correction_kl=False)")
        a("--lr", type=float, default=DEFAULTS["lr"], help="learning rate (constant)")
        a("--weight-decay", type=float, default=DEFAULTS["weight_decay"], help="AdamW weight decay")
        add_run_arguments(parser, DEFAULTS)
        add_lora_arguments(parser)

    def run(self) -> dict:
        return _GRPORun({**DEFAULTS, **self.settings}).train()


def _check(s: dict) -> None:
    check_run_settings("grpo", s, ("model", "data", "save"))
    if s["num_generations"] < 2:
        raise SettingError(f"--num-generations {s['num_generations']}: GRPO needs at least 2 completions per prompt "
                           "(the advantage is a completion's reward against its group's)")
    for key, flag in (("batch_size", "--batch-size"), ("steps", "--steps"),
                      ("max_completion_length", "--max-completion-length"), ("num_iterations", "--num-iterations")):
        if s[key] < 1:
            raise SettingError(f"{flag} {s[key]}: must be at least 1")
    if not s["temperature"] > 0:
        raise SettingError(f"--temperature {s['temperature']}: GRPO samples, so it must be above 0")
    if s["beta"] < 0 or s["epsilon"] < 0 or (s["epsilon_high"] is not None and s["epsilon_high"] < 0):
        raise SettingError("--beta, --epsilon and --epsilon-high must not be negative")
    if s["loss_type"] not in LOSS_TYPES or s["scale_rewards"] not in SCALES:
        raise SettingError(f"--loss-type: one of {', '.join(LOSS_TYPES)}; --scale-rewards: one of {', '.join(SCALES)}")


class _GRPORun:
    def __init__(self, s: dict):
        import torch

        from pai_zoo.generation import context_length
        from pai_zoo.generation import read_prompts as read_prompt_records
        from pai_zoo.rl.checkpoint import latest_iteration, load_model_state
        from pai_zoo.rl.data import check_ids
        from pai_zoo.rl.models import Optimizer, load_model, pad_id_of
        from pai_zoo.rl.policy import data_parallel_layout
        from pai_zoo.rl.reward_funcs import get_reward_funcs

        from .runs import attach_lora, load_reference, lora_settings

        _check(s)
        self.s, self.save = s, Path(s["save"])
        tp, pp, seed = s["tensor_parallel_size"], s["pipeline_parallel_size"], s["seed"]
        names = [n.strip() for n in str(s["reward_funcs"]).split(",") if n.strip()]
        if not names:
            raise SettingError("--reward-funcs names no reward function")
        models = {n: n.removeprefix("model:") for n in names if n.startswith("model:")}
        found = get_reward_funcs([n for n in names if n not in models]) if len(models) < len(names) else {}
        torch.manual_seed(s["seed"])
        self.policy = load_model(s["model"], tp, seed, pp)
        self.functions = {}  # in --reward-funcs order; a reward model is named by its folder, as TRL names it
        for name in names:
            self.functions[Path(models[name]).name if name in models else name] = (
                reward_model_function(models[name], self.policy, tp, seed, pp) if name in models else found[name])
        self.weights = self._weights(s["reward_weights"])
        self.vocab_size = self.policy.vocab_size
        self.records = []  # (where, prompt as the record gives it, token ids, fields)
        from pai_zoo.generation import encode_prompt

        for where, record, prompt in read_prompt_records(s["data"], chat=s["chat"]):
            ids = check_ids(where, encode_prompt(prompt, self.policy.tokenizer, where, s["chat"]), self.vocab_size)
            fields = {k: v for k, v in record.items() if k not in PROMPT_KEYS}
            self.records.append((where, prompt, ids, fields))
        if not self.records:
            raise PaiZooError(f"{s['data']}: no prompts")
        context = context_length(self.policy)
        for where, _, ids, _ in self.records:
            if context and len(ids) + s["max_completion_length"] > context:
                raise PaiZooError(f"{where}: {len(ids)} prompt tokens and --max-completion-length "
                                  f"{s['max_completion_length']} exceed the model's context of {context}")
        names = set(self.records[0][3])
        for where, _, _, fields in self.records:
            if set(fields) != names:
                raise PaiZooError(f"{where}: fields {sorted(fields)} differ from the first record's {sorted(names)}; "
                                  "every record needs the same fields (the reward functions get them as columns)")
        self.dp_rank, self.dp_size = data_parallel_layout()
        if s["batch_size"] % self.dp_size:
            raise SettingError(f"--batch-size {s['batch_size']} must be a multiple of the {self.dp_size} "
                               "data-parallel ranks")
        if s["batch_size"] > len(self.records):
            raise SettingError(f"--batch-size {s['batch_size']}: {s['data']} has {len(self.records)} prompts")
        self.reference = None
        if s["beta"] != 0.0:
            reference_spec = s["ref_model"] if s["ref_model"] is not None else s["model"]
            self.reference = load_reference(reference_spec, self.policy, tp, seed, pp)
        self.pad_id = pad_id_of(self.policy)
        resume_at = latest_iteration(self.save) if s["resume"] else None
        self.lora = lora = lora_settings(s)
        if lora is not None:
            attach_lora(self.policy, lora, seed)
        self.optimizer = Optimizer(self.policy.model, s["lr"], s["weight_decay"], s["max_grad_norm"])
        self.step = 0
        if resume_at is not None:
            self.step = load_model_state(self.save, self.policy.model, self.optimizer)["step"]
            say_resuming(self.save, self.step, s["steps"])
        self.resumed_from = resume_at
        self.log = None  # opened with the first record: a run that fails in its first rollout writes nothing

    def _weights(self, spec) -> list[float]:
        if spec is None:
            return [1.0] * len(self.functions)
        try:
            weights = [float(w) for w in (spec.split(",") if isinstance(spec, str) else spec)]
        except ValueError:
            raise SettingError(f"--reward-weights {spec}: not a list of numbers") from None
        if len(weights) != len(self.functions):
            raise SettingError(f"--reward-weights gives {len(weights)} weights for {len(self.functions)} reward "
                               f"functions ({', '.join(self.functions)})")
        return weights

    # -- rollout --------------------------------------------------------------------------------
    def sample(self, prompts: list[list[int]], seed: int) -> tuple[list[list[int]], list[str | None]]:
        """Completions of ``prompts``, one per entry, sampled from the policy: their token ids (an ending EOS
        included) and texts (the decoding without the EOS; None without a tokenizer). The one place a rollout
        engine lives: a vLLM or SGLang client returning the same would replace it."""
        from pai_zoo.generation import generate

        s = self.s
        out = generate(self.policy, prompts, max_new_tokens=s["max_completion_length"], temperature=s["temperature"],
                       top_k=s["top_k"], top_p=s["top_p"], seed=seed)
        return [list(g.token_ids) for g in out], [g.text if self.policy.tokenizer is not None else None for g in out]

    def rollout(self, indices: list[int]) -> dict:
        """This rank's share of the step's prompts, G completions each, scored; the batch the updates train on."""
        import torch

        from pai_zoo.rl.policy import data_parallel_share, gather_objects, token_logprobs
        from pai_zoo.rl.reward_funcs import score

        from .grpo_loss import group_advantages

        s, G = self.s, self.s["num_generations"]
        mine = data_parallel_share(indices, self.dp_rank, self.dp_size)
        prompts = [self.records[i][2] for i in mine for _ in range(G)]
        start = time.perf_counter()
        completions, decoded = [], []
        for i in mine:  # each prompt's group from a seed of its own: the same tokens on any layout and DP size
            ids, texts = self.sample([self.records[i][2]] * G, seed=(s["seed"] * 1_000_003 + self.step) * 1009 + i)
            completions += ids
            decoded += texts
        rollout_time = time.perf_counter() - start
        texts = self._texts(mine, completions, decoded)
        fields = {k: [self.records[i][3][k] for i in mine for _ in range(G)] for k in self.records[mine[0]][3]}
        fields.update(completion_ids=completions, prompt_ids=prompts)  # TRL passes completion_ids too
        where = [f"{self.records[i][0]} (completion {g + 1} of {G}: {texts[n * G + g]!r:.80})"
                 for n, i in enumerate(mine) for g in range(G)]
        shown = [self.records[i][1] for i in mine for _ in range(G)]
        per_function = score(self.functions, shown, texts, fields, where)  # [k][n]
        local = torch.tensor(per_function, dtype=torch.float32).T.reshape(len(completions), -1)
        everyone = torch.tensor(gather_objects(local.tolist()), dtype=torch.float32)  # the whole batch's
        rewards = (everyone * torch.tensor(self.weights)).sum(-1)
        advantages, std = group_advantages(rewards, G, s["scale_rewards"])
        share = slice(self.dp_rank * len(completions), (self.dp_rank + 1) * len(completions))
        batch = self._layout(prompts, completions)
        batch["advantages"] = advantages[share]
        lengths = torch.tensor(gather_objects([len(c) for c in completions]), dtype=torch.float32)
        batch["batch_tokens"] = float(lengths.sum()) / self.dp_size
        with torch.no_grad():
            if self.reference is not None:
                batch["ref"] = self._completion_part(token_logprobs(self.reference.model, batch, self.vocab_size,
                                                                   s["temperature"]), batch)
            if s["num_iterations"] > 1:
                batch["old"] = self._completion_part(token_logprobs(self.policy.model, batch, self.vocab_size,
                                                                   s["temperature"]), batch)
        eos = set(self._eos())
        stats = {"reward": float(rewards.mean()), "reward_std": float(rewards.std()),
                 **{f"rewards/{name}/{k}": float(v) for j, name in enumerate(self.functions)
                    for k, v in (("mean", everyone[:, j].mean()), ("std", everyone[:, j].std()))},
                 "frac_reward_zero_std": float(torch.isclose(std, torch.zeros_like(std)).float().mean()),
                 "completions/mean_length": float(lengths.mean()), "completions/min_length": float(lengths.min()),
                 "completions/max_length": float(lengths.max()),
                 "completions/clipped_ratio": sum(gather_objects([float(not c or c[-1] not in eos)
                                                                  for c in completions])) / len(lengths),
                 "rollout_tokens_per_s": float(lengths.sum()) / max(rollout_time, 1e-9)}
        return batch, stats

    def _eos(self) -> tuple[int, ...]:
        from pai_zoo.generation import eos_ids

        return eos_ids(self.policy)

    def _texts(self, mine: list[int], completions: list[list[int]], decoded: list) -> list:
        """The completions as the reward functions get them (TRL's): text, or one assistant message for a chat
        prompt, or token ids for a model without a tokenizer."""
        G = self.s["num_generations"]
        out = []
        for n, (ids, text) in enumerate(zip(completions, decoded)):
            prompt = self.records[mine[n // G]][1]
            chat = self.s["chat"] or (isinstance(prompt, list) and bool(prompt) and isinstance(prompt[0], dict))
            if text is None:
                out.append(list(ids))
            else:
                out.append([{"role": "assistant", "content": text}] if chat else text)
        return out

    def _layout(self, prompts: list[list[int]], completions: list[list[int]]) -> dict:
        """Prompts left-padded to ``P`` columns, completions right-padded after them (TRL's layout)."""
        import torch

        P, T = max(len(p) for p in prompts), max(max(len(c) for c in completions), 1)
        ids = torch.full((len(prompts), P + T), self.pad_id, dtype=torch.long)
        mask = torch.zeros_like(ids)
        for row, (p, c) in enumerate(zip(prompts, completions)):
            ids[row, P - len(p):P] = torch.as_tensor(p)
            ids[row, P:P + len(c)] = torch.as_tensor(c, dtype=torch.long)
            mask[row, P - len(p):P + len(c)] = 1
        return {"ids": ids, "mask": mask, "completion": mask[:, P:].clone(), "P": P}

    @staticmethod
    def _completion_part(per_token, batch: dict):
        return per_token[:, batch["P"] - 1:]

    # -- update ---------------------------------------------------------------------------------
    def loss(self, logits, batch: dict):
        s = self.s
        return batch_loss(logits, batch, self.vocab_size, temperature=s["temperature"], beta=s["beta"],
                          epsilon=s["epsilon"], epsilon_high=s["epsilon_high"], loss_type=s["loss_type"],
                          max_completion_length=s["max_completion_length"],
                          bias_correction_kl=s["bias_correction_kl"])

    def _checkpoint(self) -> None:
        save_policy(self.policy, self.optimizer, self.save, self.step, self.lora)

    def train(self) -> dict:
        from pai_zoo.rl.policy import train_step

        s = self.s
        start = time.perf_counter()
        record: dict = {}
        keys = ("entropy", "clip_ratio/low_mean", "clip_ratio/high_mean", "clip_ratio/region_mean") + \
            (("kl",) if s["beta"] != 0.0 else ())
        with stop_request([self.save], lambda: self.step) as stop:  # a signal: the step in progress is saved
            while self.step < s["steps"]:
                step_start = time.perf_counter()
                lr = self.optimizer.optimizer.param_groups[0]["lr"]
                batch, stats = self.rollout(step_slice(list(range(len(self.records))), s["seed"], self.step,
                                                       s["batch_size"]))
                train_start = time.perf_counter()
                sums: dict[str, float] = {}
                for _ in range(s["num_iterations"]):
                    values, grad_norm = train_step(self.optimizer, batch, self.loss, keys)
                    for k, v in {**values, "grad_norm": grad_norm}.items():
                        sums[k] = sums.get(k, 0.0) + v / s["num_iterations"]
                train_time = time.perf_counter() - train_start
                self.step += 1
                trained = float(batch["mask"].sum()) * self.dp_size * s["num_iterations"]
                record = {"step": self.step, "loss": sums.pop("loss"), "lr": lr, "grad_norm": sums.pop("grad_norm"),
                          **stats, **sums, "train_tokens_per_s": trained / max(train_time, 1e-9),
                          "step_time": round(time.perf_counter() - step_start, 3),
                          "seconds": round(time.perf_counter() - start, 3)}
                if self.log is None:
                    self.log = MetricsLog(self.save / METRICS_FILE,
                                          None if self.resumed_from is None else self.step - 1,
                                          prefix=None if s["quiet"] else "grpo", total=s["steps"])
                self.log.write(record)
                saved = bool(s["save_every"] and self.step % s["save_every"] == 0 and self.step < s["steps"])
                if saved:
                    self._checkpoint()
                stop_here(stop, self.step, s["steps"], self._checkpoint, saved, [self.save])
        if self.resumed_from is None or record:
            self._checkpoint()
        if self.log is not None:
            self.log.close()
        return {"steps": self.step, "last": record, "resumed_from": self.resumed_from, "checkpoint": str(self.save),
                "log": str(self.save / METRICS_FILE)}


def reward_model_function(path, policy, tensor_parallel_size: int, seed: int, pipeline_parallel_size: int):
    """A reward model (``pai-zoo rl reward``'s checkpoint, sharing the policy's tokenizer) as a reward function:
    the score of ``prompt + completion`` ids at the completion's last token (``--reward-funcs model:PATH``)."""
    from pai_zoo.mcore.heads import has_score_head
    from pai_zoo.rl.models import check_same_tokenizer, load_model, pad_id_of
    from pai_zoo.rl.rewards import ModelReward

    handle = load_model(path, tensor_parallel_size, seed, pipeline_parallel_size)
    if not has_score_head(handle.model):
        raise PaiZooError(f"--reward-funcs model:{path}: not a reward model (it has a language-model head); train one "
                          "with `pai-zoo rl reward`")
    check_same_tokenizer(policy, handle, "policy", "reward model")
    scorer = ModelReward(handle, pad_id_of(handle))

    def reward_model(prompts, completions, prompt_ids, completion_ids, **fields):
        return scorer(prompt_ids, completion_ids).tolist()

    return reward_model


def batch_loss(logits, batch: dict, vocab_size: int, *, temperature: float, beta: float, epsilon: float,
               epsilon_high: float | None, loss_type: str, max_completion_length: int,
               bias_correction_kl: bool = True):
    """The GRPO loss of a rollout batch (``ids``, ``mask``, ``completion``, ``P``, ``advantages``, ``batch_tokens``,
    and ``ref`` / ``old`` per-token log-probabilities where used) from the policy's logits, and TRL's metrics."""
    import torch

    from pai_zoo.rl.ops import entropy_of, masked_mean
    from pai_zoo.rl.policy import next_token_logprobs

    from .grpo_loss import grpo_loss

    P = batch["P"]
    logps = next_token_logprobs(logits, batch["ids"], vocab_size, temperature)[:, P - 1:]
    mask = batch["completion"]
    loss, kl, (low, high) = grpo_loss(
        logps, batch.get("old"), batch.get("ref"), batch["advantages"], mask, beta=beta, epsilon_low=epsilon,
        epsilon_high=epsilon if epsilon_high is None else epsilon_high, loss_type=loss_type,
        max_completion_length=max_completion_length, batch_tokens=batch["batch_tokens"],
        bias_correction_kl=bias_correction_kl)
    with torch.no_grad():
        entropy = masked_mean(entropy_of(logits[:, P - 1:-1, :vocab_size].float() / temperature), mask)
        values = {"entropy": entropy, "clip_ratio/low_mean": masked_mean(low, mask),
                  "clip_ratio/high_mean": masked_mean(high, mask),
                  "clip_ratio/region_mean": masked_mean(torch.maximum(low, high), mask)}
        if kl is not None:
            values["kl"] = masked_mean(kl.detach(), mask)
    return loss, values
