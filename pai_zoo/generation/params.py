"""What a generation run is asked for and what it returns: :class:`SamplingParams`, :class:`Generation`,
:class:`GenerationError`."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ..plugin.errors import PaiZooError


class GenerationError(PaiZooError):
    """Bad generation input (empty prompt, prompt too long, no tokenizer for text...)."""


@dataclass
class SamplingParams:
    """How to pick tokens. ``temperature == 0`` is greedy (argmax); otherwise logits are divided
    by ``temperature``, cut to the ``top_k`` most likely (0 = all) and to the smallest set whose
    probability reaches ``top_p`` (1.0 = all), then sampled with a generator seeded by ``seed``
    (None = torch's global generator). ``stop``: strings that end a completion (the text is cut
    before them). ``eos_token_id``: ids that end a completion (None = the model's)."""

    max_new_tokens: int = 64
    temperature: float = 0.0
    top_k: int = 0
    top_p: float = 1.0
    seed: int | None = None
    stop: tuple[str, ...] = ()
    eos_token_id: tuple[int, ...] = ()

    def __post_init__(self):
        if isinstance(self.stop, str):
            self.stop = (self.stop,)
        self.stop = tuple(self.stop or ())
        if any(not isinstance(s, str) or not s for s in self.stop):
            raise GenerationError(f"stop strings must be non-empty strings, got {list(self.stop)!r}")
        if not isinstance(self.max_new_tokens, int) or self.max_new_tokens < 1:
            raise GenerationError(f"max_new_tokens must be a positive integer, got {self.max_new_tokens!r}")
        if self.temperature < 0:
            raise GenerationError(f"temperature must be >= 0, got {self.temperature}")
        if self.top_k < 0:
            raise GenerationError(f"top_k must be >= 0 (0 = no top-k), got {self.top_k}")
        if not 0.0 < self.top_p <= 1.0:
            raise GenerationError(f"top_p must be in (0, 1], got {self.top_p}")

    @property
    def greedy(self) -> bool:
        return self.temperature == 0

    def generator(self):
        """A CPU ``torch.Generator`` seeded with ``seed``, or None (global RNG)."""
        import torch

        return None if self.seed is None else torch.Generator().manual_seed(int(self.seed))


@dataclass
class Generation:
    """One completion. ``token_ids`` are the generated ids (an ending EOS included; generation
    stops at the token that completes a stop string); ``text`` is their decoding without the
    EOS and cut before the stop string (None without a tokenizer); ``stop_reason`` is
    ``"eos"``, ``"stop"`` or ``"length"``; ``truncated`` counts prompt tokens dropped on the left."""

    prompt: Any
    prompt_ids: list[int]
    token_ids: list[int]
    text: str | None
    stop_reason: str
    truncated: int = 0

    def to_json(self) -> dict:
        return {
            "completion": self.text,
            "token_ids": self.token_ids,
            "stop_reason": self.stop_reason,
            "prompt_tokens": len(self.prompt_ids),
            **({"truncated_tokens": self.truncated} if self.truncated else {}),
        }
