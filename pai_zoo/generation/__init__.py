"""Offline text generation: batched, KV-cached, greedy or sampled, for both backends.

    handle = pai_zoo.load("/ckpt/llama-mcore")
    outs = pai_zoo.generate(handle, ["Hello", "The capital of France is"], max_new_tokens=32)
    outs[0].text, outs[0].token_ids, outs[0].stop_reason        # "eos" | "stop" | "length"
    chats = [[{"role": "system", "content": "Be brief."}, {"role": "user", "content": "Hi!"}], "What is 2+2?"]
    outs = pai_zoo.generate(handle, chats, chat=True)          # chat template + generation prompt

megatron-core backend (:func:`mcore_generate`, in ``mcore_loop.py``): the prompts are left-padded into one batch and
run through ``GPTModel.forward`` with a :class:`~pai_zoo.mcore.inference.KVCache` (megatron-core's
``StaticInferenceContext``, the context of its static inference engine, which the attention layers
pai-zoo builds use to cache keys after RoPE and attend with SDPA): one prefill forward over the
prompts (megatron computes logits for the last position only), then one forward per new token
that appends to the cache. Every
forward gets explicit position ids (row ``i``'s real tokens count from 0) and an explicit boolean
attention mask ``[b, 1, q, k]`` (True = masked) that hides the padding, so any family's layer
spec (learned absolute positions, RoPE, ALiBi, parallel attention) sees what it sees in
training. Megatron's text-generation controller is not used: it pads prompts on the right and
runs without per-row position ids or masks, which custom specs and left padding need.
RoPE needs no per-row positions: the cache slots of a left-padded row are shifted by its pad
count, and rotary attention depends only on the distance between tokens. A model whose layers are
not pai-zoo's (a spec without megatron's ``SelfAttention``) runs megatron's own static-cache code
with the same context.

Tensor parallel (under ``torchrun``): every rank runs the loop; the logits are gathered
(``parallel_output=False``) and the chosen tokens are broadcast from the first tensor-parallel
rank, so all ranks agree. Pipeline parallel is not supported for generation. Sliding-window
attention (Mistral) builds its own mask in megatron-core, which cannot hide padding: such
models run prompts of equal length together, one batch per length.

Hugging Face backend (:func:`hf_generate`, in ``hf_loop.py``): transformers' ``generate`` with left padding and
the same sampling parameters; the same stop rules are applied to its output.

The package: ``params`` (settings, results, errors), ``sampling`` (token choice), ``stopping`` (:class:`Finisher`),
``prompts`` (encoding, padding, JSON Lines), ``mcore_loop`` and ``hf_loop`` (the two decode loops) and, here,
:func:`generate`, which ties them together. Importing it imports neither torch nor megatron-core.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from .hf_loop import hf_generate
from .images import VisionPrompts, chat_images, chat_videos
from .mcore_loop import mcore_generate
from .params import Generation, GenerationError, SamplingParams
from .prompts import encode_prompt, fit_context, left_pad, read_prompts, unpad
from .sampling import choose_tokens, filter_logits
from .stopping import Finisher

__all__ = [
    "Finisher",
    "Generation",
    "GenerationError",
    "SamplingParams",
    "choose_tokens",
    "encode_prompt",
    "filter_logits",
    "fit_context",
    "generate",
    "hf_generate",
    "left_pad",
    "mcore_generate",
    "read_prompts",
    "unpad",
]


def eos_ids(handle) -> tuple[int, ...]:
    """End-of-sequence ids of a handle: the tokenizer's and the config's ``eos_token_id``."""
    ids = set()
    tokenizer = getattr(handle, "tokenizer", None)
    if tokenizer is not None and tokenizer.eos_id is not None:
        ids.add(int(tokenizer.eos_id))
    configured = getattr(handle.hf_config, "eos_token_id", None)
    if configured is not None:
        ids.update(int(i) for i in (configured if isinstance(configured, (list, tuple)) else [configured]))
    return tuple(sorted(ids))


def context_length(handle) -> int | None:
    """The model's context (``max_sequence_length`` / ``max_position_embeddings``), or None."""
    value = handle.mcore_config.get("max_sequence_length") if handle.mcore_config is not None else None
    return value or getattr(handle.hf_config, "max_position_embeddings", None)


def generate(
    handle,
    prompts,
    max_new_tokens: int = 64,
    temperature: float = 0.0,
    top_k: int = 0,
    top_p: float = 1.0,
    seed: int | None = None,
    stop: Sequence[str] | str = (),
    *,
    eos_token_id=None,
    chat: bool = False,
    truncate: str | None = None,
    batch_size: int | None = None,
    attention_mask=None,
    on_text: Callable[[int, str], None] | None = None,
    use_cache: bool = True,
    labels: Sequence[str] | None = None,
    images: Sequence[Sequence[Any]] | None = None,
    videos: Sequence[Sequence[Any]] | None = None,
) -> list[Generation]:
    """Complete ``prompts`` with the model of ``handle`` (a :class:`~pai_zoo.models.handle.ModelHandle`).

    ``prompts``: a string, a list of strings (tokenized with the handle's tokenizer), a list of
    token-id lists, chats or a padded id tensor with ``attention_mask`` (left or right padding).
    ``chat=True`` renders each prompt with the tokenizer's chat template (ChatML when it has none)
    followed by the generation prompt, as ``pai-zoo generate --chat`` does: a chat is a list of
    ``{"role", "content"}`` messages, a string is one user turn, and a list of ids is used as it
    is (already rendered): ``generate(handle, [{"role": "user", "content": "Hi"}], chat=True)``.
    ``eos_token_id``: an id or ids that end a completion (default: the tokenizer's and the config's
    EOS; ``[]`` for none). ``truncate="left"`` drops the oldest prompt tokens that do not fit the
    context. ``batch_size`` splits the prompts into batches (default: all at once).
    ``on_text(index, delta)`` streams each completion's text. ``labels`` name the prompts in
    errors (default ``"prompt <index>"``). ``images``: per prompt, the images (paths or PIL images) its
    placeholders name, in order, for a vision-language model; a chat's ``{"type": "image", "image": PATH}`` entries
    add theirs (:mod:`pai_zoo.generation.images`). ``videos``: per prompt, its videos (folders of frames, video
    files or lists of PIL frames), as ``images``; a chat's ``{"type": "video", "video": PATH}`` entries add theirs.
    Returns one :class:`Generation` per prompt, in order.
    """
    if attention_mask is not None or hasattr(prompts, "dim"):
        prompts = unpad(prompts, attention_mask)
    elif isinstance(prompts, str) or (
        isinstance(prompts, (list, tuple)) and prompts and isinstance(prompts[0], (dict, int))
    ):
        prompts = [prompts]  # one prompt: a text, a chat or a list of ids
    prompts = list(prompts)
    if not prompts:
        raise GenerationError("no prompts")
    if eos_token_id is None:
        eos = eos_ids(handle)
    else:
        eos = tuple(int(i) for i in ([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id))
    params = SamplingParams(
        max_new_tokens, temperature, top_k, top_p, seed, tuple([stop] if isinstance(stop, str) else stop), eos
    )
    tokenizer = getattr(handle, "tokenizer", None)
    decode = _decoder(tokenizer)
    context = context_length(handle)
    where = [labels[index] if labels else f"prompt {index}" for index in range(len(prompts))]
    pictures = [[*((images[i] if images and i < len(images) else None) or ()),
                 *(chat_images(p) if chat else ())] for i, p in enumerate(prompts)]
    clips = [[*((videos[i] if videos and i < len(videos) else None) or ()),
              *(chat_videos(p) if chat else ())] for i, p in enumerate(prompts)]
    vision = (VisionPrompts(handle, pictures, where, clips)
              if handle.family.vision is not None or any(pictures) or any(clips) else None)
    encoded = []
    for index, prompt in enumerate(prompts):
        ids = encode_prompt(prompt, tokenizer, where[index], chat)
        if vision is not None:
            ids = vision.expand(index, ids, context)
        fitted = fit_context(ids, context, max_new_tokens, truncate, where[index])
        if vision is not None and (pictures[index] or clips[index]) and fitted[1]:
            raise GenerationError(f"{where[index]}: --truncate would cut a prompt with images or videos; give "
                                  "fewer new tokens or smaller images")
        encoded.append(fitted)
    size = batch_size or len(prompts)
    results: list[Generation] = []
    for start in range(0, len(prompts), size):
        chunk = encoded[start : start + size]
        finishers = [
            Finisher(params, eos, decode, None if on_text is None else (lambda delta, i=start + k: on_text(i, delta)))
            for k in range(len(chunk))
        ]
        rows = range(start, start + len(chunk))
        inputs = vision.batch(rows) if vision is not None else {}
        if handle.backend == "hf":
            extra = (lambda ids: {**inputs, **handle.hf_vision_inputs(ids)}) if inputs else None
            hf_generate(handle.model, [ids for ids, _ in chunk], params, finishers, _pad_id(tokenizer, eos), extra)
        else:
            mcore_generate(handle.model, [ids for ids, _ in chunk], params, finishers, handle.vocab_size, use_cache,
                           (inputs, vision.positions) if inputs else None)
        for k, ((ids, dropped), finisher) in enumerate(zip(chunk, finishers)):
            results.append(
                Generation(prompts[start + k], ids, finisher.tokens, finisher.text(), finisher.reason, dropped)
            )
    return results


def _decoder(tokenizer) -> Callable[[list[int]], str] | None:
    """The tokenizer's ``decode`` for completions, None without one. Ids past the tokenizer's vocabulary (the
    padding rows of a model's vocabulary, which a test preset's toy tokenizer leaves many of) decode to nothing,
    as transformers' tokenizers do, instead of failing a run the model chose them in."""
    if tokenizer is None:
        return None
    size = tokenizer.vocab_size
    return lambda ids: tokenizer.decode([i for i in ids if 0 <= i < size])


def _pad_id(tokenizer, eos) -> int:
    if tokenizer is not None and tokenizer.pad_id is not None:
        return int(tokenizer.pad_id)
    return int(eos[0]) if eos else 0
