"""What a conversion did (:class:`ConversionReport`), and the dtypes it takes by name."""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import torch

from ..plugin.errors import PaiZooError

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class ConversionReport:
    """What a conversion did: counts, sizes and, with ``verify``, the logits comparison."""

    src: Path
    dst: Path
    to: str
    family: str
    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0
    verification: dict | None = field(default=None)
    notes: list[str] = field(default_factory=list)  # what the reader assumed or took from elsewhere

    @property
    def ok(self) -> bool:
        return self.verification is None or self.verification["ok"]


def parse_dtype(value) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    try:
        return DTYPES[str(value).lower()]
    except KeyError:
        raise PaiZooError(f"unknown dtype {value!r}; use one of bf16, fp16, fp32") from None


