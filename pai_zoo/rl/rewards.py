"""Where PPO's scores come from: a reward model, a rule, or a Python callable.

Every reward is called as ``reward(prompts, responses) -> FloatTensor[batch]`` with lists of
token ids. ``--reward`` takes a reward-model folder or a rule:
    rule:contains=ID[,ID...]   1 when the response contains one of the ids, else 0
    rule:fraction=ID[,ID...]   the share of response tokens that are among the ids

(``ID`` may be a range ``A-B``, both ends included).
"""
from __future__ import annotations

from collections.abc import Callable, Sequence

import torch

from ..mcore.heads import has_score_head, sequence_scores
from ..plugin.errors import PaiZooError
from .models import describe, forward, load_model, pad_right

RULES = ("contains", "fraction")


def _ids(text: str, where: str) -> frozenset[int]:
    ids: set[int] = set()
    for part in filter(None, (p.strip() for p in text.split(","))):
        try:
            if "-" in part:
                lo, hi = (int(x) for x in part.split("-", 1))
                ids.update(range(lo, hi + 1))
            else:
                ids.add(int(part))
        except ValueError:
            raise PaiZooError(f"{where}: {part!r} is not a token id or a range A-B") from None
    if not ids:
        raise PaiZooError(f"{where}: names no token ids")
    return frozenset(ids)


class RuleReward:
    """A rule on the response's token ids (see the module docstring)."""

    def __init__(self, spec: str):
        body = spec.removeprefix("rule:")
        kind, _, arg = body.partition("=")
        if kind not in RULES:
            raise PaiZooError(
                f"--reward {spec}: unknown rule {kind!r}; rules: {', '.join(f'rule:{r}=IDS' for r in RULES)}"
            )
        self.spec, self.kind, self.ids = spec, kind, _ids(arg, f"--reward {spec}")

    def __call__(self, prompts: Sequence[Sequence[int]], responses: Sequence[Sequence[int]]) -> torch.Tensor:
        out = []
        for response in responses:
            hits = sum(1 for t in response if t in self.ids)
            out.append(float(hits > 0) if self.kind == "contains" else hits / max(len(response), 1))
        return torch.tensor(out, dtype=torch.float32)


class CallableReward:
    """A Python function ``fn(prompt_ids, response_ids) -> float`` applied to each sample."""

    def __init__(self, fn: Callable[[list[int], list[int]], float]):
        self.fn = fn

    def __call__(self, prompts, responses) -> torch.Tensor:
        return torch.tensor([float(self.fn(list(p), list(r))) for p, r in zip(prompts, responses)], dtype=torch.float32)


class ModelReward:
    """A reward model (a ``GPTModel`` with a score head): the score at the last response token."""

    def __init__(self, handle, pad_id: int = 0):
        self.handle, self.pad_id = handle, pad_id
        handle.model.eval()

    def __call__(self, prompts, responses) -> torch.Tensor:
        ids, mask = pad_right([list(p) + list(r) for p, r in zip(prompts, responses)], self.pad_id)
        with torch.no_grad():
            return sequence_scores(forward(self.handle.model, ids, mask), mask).float()


def make_reward(spec, tensor_parallel_size: int = 1, seed: int = 0):
    """A reward from ``spec``: a ``rule:...`` string, a callable, or a reward-model path/handle
    (returned with its handle for the tokenizer checks: ``(reward, handle or None)``)."""

    if callable(spec) and not hasattr(spec, "model"):
        return CallableReward(spec), None
    if isinstance(spec, str) and spec.startswith("rule:"):
        return RuleReward(spec), None
    handle = load_model(spec, tensor_parallel_size, seed)
    if not has_score_head(handle.model):
        raise PaiZooError(f"--reward {describe(handle)}: not a reward model (it has a language-model head); "
                          "train one with `pai-zoo rl reward` or pass rule:...")
    return ModelReward(handle), handle
