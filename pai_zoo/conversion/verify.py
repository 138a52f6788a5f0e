"""``convert --verify``: both sides loaded in float32 and their logits compared on a sample prompt, by the rule
:mod:`pai_zoo.models.verification` keeps."""
from __future__ import annotations

from pathlib import Path

import torch

from .. import formats
from ..models.handle import load
from ..models.megatron_checkpoint import open_megatron
from ..models.verification import VERIFY_TOLERANCES, compare_logits, describe_verification  # noqa: F401
from ..plugin.errors import PaiZooError
from .to_mcore import floating_dtype

SAMPLE_PROMPT_LENGTH = 32

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: coarsest first: the dtype that limits a comparison of two stored dtypes
_COARSEST = ("bf16", "fp16", "fp32")


def _stored_dtype(path: Path, tokenizer=None, iteration=None) -> torch.dtype:
    if formats.detect(path, iteration=iteration) == "hf":
        with formats.open_checkpoint(path, format="hf") as source:
            return floating_dtype(source)
    with open_megatron(path, None, reference=tokenizer, iteration=iteration) as checkpoint:
        return checkpoint.stored_dtype


def verification_dtype(src, dst, tokenizer=None, iteration=None) -> str:
    """The dtype whose tolerance applies to ``src`` vs ``dst`` compared in float32: ``fp32`` when both store
    the same dtype (the same weights), else the coarser of the two (the conversion rounded every weight)."""
    names = set()
    for path, options in ((Path(src), {"tokenizer": tokenizer, "iteration": iteration}), (Path(dst), {})):
        try:
            names.add(_DTYPE_NAMES.get(_stored_dtype(path, **options), "fp32"))
        except (PaiZooError, OSError):  # unreadable here: the strict fp32 rule
            names.add("fp32")
    return "fp32" if len(names) == 1 else next(n for n in _COARSEST if n in names)


def verify_conversion(src, dst, tokenizer=None, iteration=None, tolerance=None, dtype=None) -> dict:
    """Load both sides in float32 (HF with transformers, megatron-core with megatron-core's own
    loader), run a sample prompt, and compare the logits (:func:`compare_logits`: within
    ``atol + rtol * max |logits|``, :data:`VERIFY_TOLERANCES` for ``dtype``, default
    :func:`verification_dtype`; ``tolerance`` = ``(atol, rtol)`` or ``"ATOL[,RTOL]"`` overrides)."""

    src, dst = Path(src), Path(dst)
    hf_side, mcore_side = (src, dst) if formats.detect(src) == "hf" else (dst, src)
    if dtype is None and tolerance is None:
        dtype = verification_dtype(src, dst, tokenizer, iteration)
    reference = load(hf_side, backend="hf", dtype=torch.float32)
    options = {"tokenizer": tokenizer, "iteration": iteration} if mcore_side == src else {}
    candidate = load(mcore_side, backend="mcore", dtype=torch.float32, **options)
    vocab = candidate.vocab_size
    ids = torch.randint(0, vocab, (1, SAMPLE_PROMPT_LENGTH), generator=torch.Generator().manual_seed(0))
    if reference.tokenizer is not None:
        text = "The quick brown fox jumps over the lazy dog. Megatron-Core checkpoints convert both ways."
        encoded = reference.tokenizer.encode(text)[:SAMPLE_PROMPT_LENGTH]
        if encoded and max(encoded) < vocab:
            ids = torch.tensor([encoded])
    return compare_logits(reference.logits(ids), candidate.logits(ids), dtype or "fp32", tolerance)
