"""The transformers decode loop: ``generate`` with left padding and the same sampling and stop rules."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from .params import SamplingParams
from .prompts import left_pad
from .stopping import Finisher, finished_after


def hf_generate(
    model, prompts: Sequence[Sequence[int]], params: SamplingParams, finishers: Sequence[Finisher], pad_id: int = 0,
    inputs=None,
) -> None:
    """Run transformers' ``generate`` (left padding, attention mask) and feed each
    :class:`Finisher` its row's tokens; stop strings also stop ``generate`` early. Sampling
    draws from torch's global generator, seeded with ``params.seed`` when it is set. ``inputs``: a function of the
    padded ids giving more keyword arguments of ``generate`` (a vision-language model's images)."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    ids, keep = left_pad(prompts, pad_id)
    length = ids.shape[1]

    class _Stops(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([finished_after(f, row[length:].tolist()) for f, row in zip(finishers, input_ids)])

    kwargs: dict[str, Any] = dict(
        max_new_tokens=params.max_new_tokens,
        pad_token_id=pad_id,
        eos_token_id=sorted(finishers[0].eos) if finishers[0].eos else [],
    )
    if params.greedy:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
        if params.seed is not None:
            torch.manual_seed(params.seed)
    if params.stop:
        kwargs["stopping_criteria"] = StoppingCriteriaList([_Stops()])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=keep.long(), **kwargs, **(inputs(ids) if inputs else {}))
    for finisher, row in zip(finishers, out[:, length:].tolist()):
        for token in row:
            if finisher.add(token):
                break
