"""The generation check: pai-zoo's greedy KV-cached loop on the megatron-core model gives transformers' ``generate``
tokens (near-ties allowed), with vision inputs too where the family has a tower."""
from __future__ import annotations

from .cases import Case, _fail
from .forward_checks import LOGITS_ATOL, _handles, vision_example

#: Greedy-generation check: a divergence is accepted only where transformers' own logits make
#: our token a near-tie with its argmax (within twice the forward tolerance, see check_generation).
GENERATION_TIE_TOL = 2 * LOGITS_ATOL


def check_generation(case: Case, new_tokens: int = 16, lengths=(5, 11, 1, 8), seed: int = 4321,
                     tie_tol: float = GENERATION_TIE_TOL) -> dict:
    """Greedy generation with the megatron-core model (pai-zoo's KV-cached loop, left-padded
    batch) equals transformers' ``generate`` on the same weights, token for token, for prompts
    of different ``lengths`` (EOS disabled on both sides, so every row has ``new_tokens``).

    Random tiny models can have near-ties: two logits closer than the two backends' float
    rounding (the forward check allows ``LOGITS_ATOL`` per logit, so a gap below
    ``2 * LOGITS_ATOL`` may flip). Where a row differs, it still passes only if, teacher-forced
    on *our* tokens, transformers' full forward puts each of our tokens within ``tie_tol`` of its
    own maximum at every step -- a real error (wrong mask, position or cache) gives gaps orders of
    magnitude larger. Returns ``{"rows": n, "tie_rows": rows rescued by the near-tie rule,
    "max_gap": largest such gap}``.
    """
    import torch

    from pai_zoo.generation import Finisher, SamplingParams, hf_generate, left_pad, mcore_generate

    vocab = case.mcore_config["vocab_size"]
    gen = torch.Generator().manual_seed(seed)
    prompts = [torch.randint(0, vocab, (n,), generator=gen).tolist() for n in lengths]
    params = SamplingParams(max_new_tokens=new_tokens)
    ours = [Finisher(params, (), None) for _ in prompts]
    theirs = [Finisher(params, (), None) for _ in prompts]
    mcore_generate(case.mcore_model, prompts, params, ours, vocab_size=vocab)
    hf_generate(case.hf_model, prompts, params, theirs)
    for row, (a, b) in enumerate(zip(ours, theirs)):
        if len(a.tokens) != new_tokens or len(b.tokens) != new_tokens:
            _fail("generation", f"row {row}: expected {new_tokens} tokens, got {len(a.tokens)} (mcore) and "
                                f"{len(b.tokens)} (transformers)")
    differing = [row for row, (a, b) in enumerate(zip(ours, theirs)) if a.tokens != b.tokens]
    max_gap = 0.0
    if differing:
        ids, keep = left_pad([prompts[r] + ours[r].tokens for r in differing])
        positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
        with torch.no_grad():
            logits = case.hf_model(input_ids=ids, attention_mask=keep.long(), position_ids=positions).logits.float()
        steps = logits[:, -new_tokens - 1:-1, :vocab]  # the logits that chose each new token
        chosen = ids[:, -new_tokens:]
        gaps = steps.max(-1).values - steps.gather(-1, chosen[..., None]).squeeze(-1)
        for k, row in enumerate(differing):
            worst = gaps[k].max().item()
            if not worst <= tie_tol:
                step = int((gaps[k] > tie_tol).nonzero()[0])
                _fail("generation", f"prompt of {lengths[row]} tokens: greedy tokens differ from transformers' "
                                    f"generate\n  mcore {ours[row].tokens}\n  hf    {theirs[row].tokens}\n"
                                    f"  and step {step} is no near-tie: transformers' logit of our token is "
                                    f"{gaps[k][step].item():.3g} below its maximum (> {tie_tol:g})")
            max_gap = max(max_gap, worst)
    if case.family.vision is not None:
        _check_vision_generation(case, new_tokens)
    return {"rows": len(prompts), "tie_rows": len(differing), "max_gap": max_gap}


def _check_vision_generation(case: Case, new_tokens: int) -> None:
    """The example batch with images (and videos) beside a text prompt in one left-padded batch: pai-zoo's loop
    (the tower in the prompt's forward, M-RoPE ids counting on after it) gives transformers' greedy tokens."""
    from functools import partial

    from pai_zoo.generation import Finisher, SamplingParams, hf_generate, mcore_generate
    from pai_zoo.generation.images import decode_positions

    ids, inputs = vision_example(case)
    prompts = [ids[0].tolist(), ids[0, :3].tolist()]  # with the vision inputs, and a text prompt beside it
    params = SamplingParams(max_new_tokens=new_tokens)
    ours, theirs = [Finisher(params, (), None) for _ in prompts], [Finisher(params, (), None) for _ in prompts]
    _, mcore = _handles(case)
    mcore_generate(case.mcore_model, prompts, params, ours, vocab_size=case.mcore_config["vocab_size"],
                   vision=(inputs, partial(decode_positions, case.family.vision, case.mcore_config)))
    hf_generate(case.hf_model, prompts, params, theirs, inputs=lambda padded: {**inputs,
                                                                             **mcore.hf_vision_inputs(padded)})
    for row, (a, b) in enumerate(zip(ours, theirs)):
        if a.tokens != b.tokens:
            _fail("generation", f"with {', '.join(sorted(inputs))}, row {row}: greedy tokens differ from "
                                f"transformers' generate\n  mcore {a.tokens}\n  hf    {b.tokens}")
