"""Offline text generation: batched, KV-cached, greedy or sampled, for both backends.

    handle = pai_zoo.load("/ckpt/llama-mcore")
    outs = handle.generate(["Hello", "The capital of France is"], max_new_tokens=32)
    outs[0].text, outs[0].token_ids, outs[0].stop_reason        # "eos" | "stop" | "length"

megatron-core backend (:func:`mcore_generate`): the prompts are left-padded into one batch and
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

Hugging Face backend (:func:`hf_generate`): transformers' ``generate`` with left padding and
the same sampling parameters; the same stop rules are applied to its output.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from .errors import PaiZooError

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
]

STOP_REASONS = ("eos", "stop", "length")


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
        return {"completion": self.text, "token_ids": self.token_ids, "stop_reason": self.stop_reason,
                "prompt_tokens": len(self.prompt_ids), **({"truncated_tokens": self.truncated} if self.truncated else {})}


# -- token choice -----------------------------------------------------------------------------
def filter_logits(logits, temperature: float = 1.0, top_k: int = 0, top_p: float = 1.0):
    """``logits / temperature`` with every token outside the top-k / top-p (nucleus) set at -inf.

    top-k keeps the ``top_k`` largest logits (ties at the k-th value kept); top-p keeps the most
    likely tokens until their probability sum reaches ``top_p`` (the token that crosses it is
    kept, at least one always is) -- the rules of transformers' ``TopKLogitsWarper`` and
    ``TopPLogitsWarper``, applied in that order."""
    import torch

    logits = logits.float()
    if temperature not in (0, 1):
        logits = logits / temperature
    if top_k and top_k < logits.shape[-1]:
        kth = torch.topk(logits, top_k, dim=-1).values[..., -1:]
        logits = logits.masked_fill(logits < kth, float("-inf"))
    if top_p < 1.0:
        sorted_logits, order = torch.sort(logits, descending=False, dim=-1)
        cumulative = sorted_logits.softmax(dim=-1).cumsum(dim=-1)
        remove_sorted = cumulative <= 1 - top_p
        remove_sorted[..., -1:] = False
        remove = remove_sorted.scatter(-1, order, remove_sorted)
        logits = logits.masked_fill(remove, float("-inf"))
    return logits


def choose_tokens(logits, params: SamplingParams, generator=None):
    """Next token per row of ``logits [b, vocab]``: argmax when greedy, else a sample."""
    import torch

    if params.greedy:
        return logits.argmax(dim=-1)
    probs = filter_logits(logits, params.temperature, params.top_k, params.top_p).softmax(dim=-1)
    return torch.multinomial(probs, 1, generator=generator).squeeze(-1)


# -- stopping ---------------------------------------------------------------------------------
class Finisher:
    """The stop rules for one completion, fed one token at a time.

    ``add(token)`` returns True when the completion is over (EOS, a stop string in the decoded
    text, or ``max_new_tokens``). ``on_text(delta)`` (optional) receives the text as it becomes
    final: text that might still turn into a stop string, and incomplete UTF-8 (shown as
    U+FFFD), is held back until it cannot.
    """

    def __init__(self, params: SamplingParams, eos_ids, decode: Callable[[list[int]], str] | None,
                 on_text: Callable[[str], None] | None = None):
        self.params = params
        self.eos = frozenset(eos_ids)
        self.decode = decode
        self.on_text = on_text
        self.tokens: list[int] = []
        self.reason: str | None = None
        self._cut: int | None = None
        self._emitted = 0
        if (params.stop or on_text) and decode is None:
            raise GenerationError("stop strings and streaming need a tokenizer to decode the tokens")
        self._hold = max((len(s) for s in params.stop), default=1) - 1

    @property
    def done(self) -> bool:
        return self.reason is not None

    def add(self, token: int) -> bool:
        if self.done:
            return True
        self.tokens.append(int(token))
        if token in self.eos:
            self.reason = "eos"
        elif self.params.stop or self.on_text:
            text = self.decode(self.tokens)
            hits = [i for i in (text.find(s) for s in self.params.stop) if i >= 0]
            if hits:
                self.reason, self._cut = "stop", min(hits)
            elif self.on_text:
                safe = len(text) - self._hold
                while safe > self._emitted and text[safe - 1] == "\ufffd":
                    safe -= 1
                self._emit(text, safe)
        if not self.done and len(self.tokens) >= self.params.max_new_tokens:
            self.reason = "length"
        if self.done and self.on_text:
            final = self.text()
            self._emit(final, len(final))
        return self.done

    def _emit(self, text: str, upto: int) -> None:
        if upto > self._emitted:
            self.on_text(text[self._emitted:upto])
            self._emitted = upto

    def text(self) -> str | None:
        """The completion's text (EOS dropped, cut before the stop string); None without a decoder."""
        if self.decode is None:
            return None
        ids = self.tokens[:-1] if self.reason == "eos" else self.tokens
        text = self.decode(ids)
        return text[: self._cut] if self._cut is not None else text


# -- prompts ----------------------------------------------------------------------------------
def encode_prompt(prompt, tokenizer, where: str = "prompt", chat: bool = False) -> list[int]:
    """Token ids of one prompt: a string (tokenized with BOS as the tokenizer adds it), a chat
    (``[{"role", "content"}, ...]`` rendered with the tokenizer's chat template plus the generation
    prompt, tokenized as :mod:`pai_zoo.data.sft` tokenizes training chats) or a list of ids."""
    if chat:
        if tokenizer is None:
            raise GenerationError(f"{where}: a chat prompt needs a tokenizer; the model has none")
        if not isinstance(prompt, list) or not prompt or not all(isinstance(m, dict) for m in prompt):
            raise GenerationError(f"{where}: 'messages' must be a non-empty list of {{role, content}} objects")
        from .data.sft import _special_affixes, _with_template

        try:
            text = _with_template(tokenizer, None).apply_chat_template(prompt, add_generation_prompt=True)
        except Exception as exc:  # jinja errors, raise_exception() in the template
            raise GenerationError(f"{where}: the chat template failed: {exc}") from exc
        ids = tokenizer.encode(text, add_special_tokens=False)
        if not (tokenizer.bos_token and text.startswith(tokenizer.bos_token)):
            ids = _special_affixes(tokenizer, text, ids)[0] + ids
        return _non_empty(ids, where)
    if isinstance(prompt, str):
        if not prompt:
            raise GenerationError(f"{where}: the prompt is empty")
        if tokenizer is None:
            raise GenerationError(f"{where}: a text prompt needs a tokenizer and the model has none; "
                                  "pass token ids or load a checkpoint with a tokenizer")
        return _non_empty(tokenizer.encode(prompt), where)
    try:
        ids = [int(t) for t in prompt]
    except (TypeError, ValueError):
        raise GenerationError(f"{where}: expected a string or a list of token ids, got {type(prompt).__name__}") from None
    return _non_empty(ids, where)


def _non_empty(ids: list[int], where: str) -> list[int]:
    if not ids:
        raise GenerationError(f"{where}: the prompt is empty (no tokens)")
    return ids


def fit_context(ids: list[int], context: int | None, max_new_tokens: int, truncate: str | None,
                where: str = "prompt") -> tuple[list[int], int]:
    """``(ids, dropped)``: the prompt as it fits the model's context with ``max_new_tokens`` after
    it; with ``truncate="left"`` the oldest tokens are dropped, otherwise a clear error."""
    if truncate not in (None, "left"):
        raise GenerationError(f"truncate must be None or 'left', not {truncate!r}")
    if context is None or len(ids) + max_new_tokens <= context:
        return ids, 0
    room = context - max_new_tokens
    if truncate == "left" and room > 0:
        return ids[len(ids) - room:], len(ids) - room
    if room <= 0:
        raise GenerationError(f"{where}: max_new_tokens={max_new_tokens} leaves no room for a prompt in the "
                              f"model's context of {context} tokens")
    raise GenerationError(f"{where}: {len(ids)} prompt tokens + max_new_tokens={max_new_tokens} exceed the model's "
                          f"context of {context} tokens; shorten the prompt, lower max_new_tokens or truncate it "
                          f"on the left (truncate='left', --truncate left)")


def left_pad(prompts: Sequence[Sequence[int]], pad_id: int = 0):
    """``(ids [b, L], keep [b, L] bool)``: prompts right-aligned, ``keep`` False on the padding."""
    import torch

    length = max(len(p) for p in prompts)
    ids = torch.full((len(prompts), length), pad_id, dtype=torch.long)
    keep = torch.zeros((len(prompts), length), dtype=torch.bool)
    for row, prompt in enumerate(prompts):
        if prompt:
            ids[row, length - len(prompt):] = torch.as_tensor(list(prompt), dtype=torch.long)
            keep[row, length - len(prompt):] = True
    return ids, keep


def unpad(input_ids, attention_mask=None) -> list[list[int]]:
    """Prompts as lists of ids from a padded batch (left or right padding, mask 1 = real token)."""
    import torch

    input_ids = torch.as_tensor(input_ids)
    if input_ids.dim() == 1:
        input_ids = input_ids.unsqueeze(0)
    if attention_mask is None:
        return input_ids.tolist()
    keep = torch.as_tensor(attention_mask).bool()
    return [row[k].tolist() for row, k in zip(input_ids, keep)]


# -- megatron-core ----------------------------------------------------------------------------
def _decode_mask(keep):
    """Mask ``[b, 1, 1, k]`` for one new token per row: it sees every real token of its row."""
    return ~keep[:, None, None, :]


def _prefill_mask(keep):
    """Causal mask ``[b, 1, L, L]`` that also hides the left padding."""
    import torch

    length = keep.shape[1]
    causal = torch.triu(torch.ones(length, length, dtype=torch.bool), diagonal=1)
    return causal[None, None] | ~keep[:, None, None, :]


def mcore_generate(model, prompts: Sequence[Sequence[int]], params: SamplingParams, finishers: Sequence[Finisher],
                   vocab_size: int | None = None, use_cache: bool = True) -> None:
    """Run a megatron-core ``GPTModel`` on a batch of prompts (lists of ids), feeding each
    :class:`Finisher` its row's tokens until all are done. ``use_cache=False`` recomputes the
    whole sequence for every token (slow; a reference for the cache). See the module docstring."""
    import torch
    from megatron.core import parallel_state as ps

    from .mcore.arena import pack_parameters
    from .mcore.inference import KVCache

    if ps.model_parallel_is_initialized() and ps.get_pipeline_model_parallel_world_size() > 1:
        raise GenerationError("generation with pipeline parallelism is not supported; load the model with pp=1")
    if getattr(model.config, "window_size", None) is not None and len({len(p) for p in prompts}) > 1:
        # megatron's sliding-window attention builds its own mask and would attend to padding:
        # run prompts of equal length together instead.
        for length in sorted({len(p) for p in prompts}):
            rows = [i for i, p in enumerate(prompts) if len(p) == length]
            mcore_generate(model, [prompts[i] for i in rows], params, [finishers[i] for i in rows], vocab_size, use_cache)
        return
    ids, keep = left_pad(prompts)
    batch, length = ids.shape
    vocab_size = vocab_size or model.vocab_size
    total = length + params.max_new_tokens
    context = KVCache(batch, total) if use_cache else None
    generator = params.generator()
    tp_group = ps.get_tensor_model_parallel_group() if ps.model_parallel_is_initialized() else None
    tp_src = ps.get_tensor_model_parallel_src_rank() if tp_group is not None else 0
    tp = ps.get_tensor_model_parallel_world_size() if tp_group is not None else 1
    # the whole run's padding and positions, built once: step t uses the first length + t columns
    keep = torch.cat([keep, torch.ones(batch, params.max_new_tokens, dtype=torch.bool)], dim=1)
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    hidden = _decode_mask(keep)  # step t's mask: its first length + t + 1 columns
    pack_parameters(model)  # weights in one arena: decoding streams them faster (pai_zoo.mcore.arena)
    model_was_training = model.training
    model.eval()
    try:
        with _inference_mode():
            logits = model(ids, positions[:, :length], _prefill_mask(keep[:, :length]), inference_context=context,
                           runtime_gather_output=True)[:, -1, :vocab_size]
            for step in range(params.max_new_tokens):
                token = choose_tokens(logits.float(), params, generator)
                if tp > 1:
                    torch.distributed.broadcast(token, src=tp_src, group=tp_group)
                done = [f.add(t) for f, t in zip(finishers, token.tolist())]
                if all(done):
                    break
                seen = length + step + 1  # tokens in the sequence after this one
                if use_cache:
                    context.sequence_len_offset = seen - 1
                    context.enable_decode_mode()
                    out = model(token[:, None], positions[:, seen - 1:seen], hidden[..., :seen],
                                inference_context=context, runtime_gather_output=True)
                else:
                    ids = torch.cat([ids, token[:, None]], dim=1)
                    out = model(ids, positions[:, :seen], _prefill_mask(keep[:, :seen]), runtime_gather_output=True)
                logits = out[:, -1, :vocab_size]
    finally:
        model.train(model_was_training)


@contextlib.contextmanager
def _inference_mode():
    """``torch.inference_mode()`` for a generation run (less autograd bookkeeping per op), then
    drop the inference tensors megatron-core keeps between calls -- its global memory buffer and
    the RoPE frequencies ``RotaryEmbedding.forward`` caches -- so a later training step (RL
    trains the model that generated) never receives one (autograd refuses inference tensors)."""
    import torch
    from megatron.core import parallel_state as ps
    from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding

    from .mcore.inference import megatron_inference_mode

    buffers = ps.get_global_memory_buffer().buffer if ps._GLOBAL_MEMORY_BUFFER is not None else {}
    before = dict(buffers)
    try:
        with torch.inference_mode(), megatron_inference_mode():
            yield
    finally:
        for key, tensor in list(buffers.items()):
            if isinstance(tensor, torch.Tensor) and tensor.is_inference():
                if key in before:
                    buffers[key] = before[key]
                else:
                    del buffers[key]
        cache_clear = getattr(RotaryEmbedding.forward, "cache_clear", None)
        if cache_clear is not None:
            cache_clear()


# -- transformers -----------------------------------------------------------------------------
def hf_generate(model, prompts: Sequence[Sequence[int]], params: SamplingParams, finishers: Sequence[Finisher],
                pad_id: int = 0) -> None:
    """Run transformers' ``generate`` (left padding, attention mask) and feed each
    :class:`Finisher` its row's tokens; stop strings also stop ``generate`` early. Sampling
    draws from torch's global generator, seeded with ``params.seed`` when it is set."""
    import torch
    from transformers import StoppingCriteria, StoppingCriteriaList

    ids, keep = left_pad(prompts, pad_id)
    length = ids.shape[1]

    class _Stops(StoppingCriteria):
        def __call__(self, input_ids, scores, **kwargs):
            return torch.tensor([_finished_after(f, row[length:].tolist()) for f, row in zip(finishers, input_ids)])

    kwargs: dict[str, Any] = dict(max_new_tokens=params.max_new_tokens, pad_token_id=pad_id,
                                  eos_token_id=sorted(finishers[0].eos) if finishers[0].eos else [])
    if params.greedy:
        kwargs.update(do_sample=False, temperature=None, top_k=None, top_p=None)
    else:
        kwargs.update(do_sample=True, temperature=params.temperature, top_k=params.top_k, top_p=params.top_p)
        if params.seed is not None:
            torch.manual_seed(params.seed)
    if params.stop:
        kwargs["stopping_criteria"] = StoppingCriteriaList([_Stops()])
    with torch.no_grad():
        out = model.generate(input_ids=ids, attention_mask=keep.long(), **kwargs)
    for finisher, row in zip(finishers, out[:, length:].tolist()):
        for token in row:
            if finisher.add(token):
                break


def _finished_after(finisher: Finisher, tokens: list[int]) -> bool:
    """Whether ``tokens`` already end the completion (a trial on a copy, for ``generate``)."""
    trial = Finisher(finisher.params, finisher.eos, finisher.decode)
    return any(trial.add(t) for t in tokens)


# -- entry point ------------------------------------------------------------------------------
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


def generate(handle, prompts, max_new_tokens: int = 64, temperature: float = 0.0, top_k: int = 0,
             top_p: float = 1.0, seed: int | None = None, stop: Sequence[str] | str = (), *,
             eos_token_id=None, chat: bool = False, truncate: str | None = None, batch_size: int | None = None,
             attention_mask=None, on_text: Callable[[int, str], None] | None = None,
             use_cache: bool = True, labels: Sequence[str] | None = None) -> list[Generation]:
    """Complete ``prompts`` with the model of ``handle`` (a :class:`~pai_zoo.handle.ModelHandle`).

    ``prompts``: a string, a list of strings (tokenized with the handle's tokenizer), a list of
    token-id lists, chats (``chat=True``: lists of ``{"role", "content"}``) or a padded id tensor
    with ``attention_mask`` (left or right padding). ``eos_token_id``: an id or ids that end a
    completion (default: the tokenizer's and the config's EOS; ``[]`` for none). ``truncate="left"``
    drops the oldest prompt tokens that do not fit the context. ``batch_size`` splits the prompts
    into batches (default: all at once). ``on_text(index, delta)`` streams each completion's text.
    ``labels`` name the prompts in errors (default ``"prompt <index>"``).
    Returns one :class:`Generation` per prompt, in order.
    """
    if attention_mask is not None or hasattr(prompts, "dim"):
        prompts = unpad(prompts, attention_mask)
    elif isinstance(prompts, str) or (isinstance(prompts, (list, tuple)) and prompts
                                      and isinstance(prompts[0], (dict, int))):
        prompts = [prompts]  # one prompt: a text, a chat or a list of ids
    prompts = list(prompts)
    if not prompts:
        raise GenerationError("no prompts")
    if eos_token_id is None:
        eos = eos_ids(handle)
    else:
        eos = tuple(int(i) for i in ([eos_token_id] if isinstance(eos_token_id, int) else eos_token_id))
    params = SamplingParams(max_new_tokens, temperature, top_k, top_p, seed, tuple([stop] if isinstance(stop, str) else stop), eos)
    tokenizer = getattr(handle, "tokenizer", None)
    decode = _decoder(tokenizer)
    context = context_length(handle)
    encoded = []
    for index, prompt in enumerate(prompts):
        where = labels[index] if labels else f"prompt {index}"
        ids = encode_prompt(prompt, tokenizer, where, chat)
        encoded.append(fit_context(ids, context, max_new_tokens, truncate, where))
    size = batch_size or len(prompts)
    results: list[Generation] = []
    for start in range(0, len(prompts), size):
        chunk = encoded[start:start + size]
        finishers = [
            Finisher(params, eos, decode, None if on_text is None else (lambda delta, i=start + k: on_text(i, delta)))
            for k in range(len(chunk))
        ]
        if handle.backend == "hf":
            hf_generate(handle.model, [ids for ids, _ in chunk], params, finishers, _pad_id(tokenizer, eos))
        else:
            mcore_generate(handle.model, [ids for ids, _ in chunk], params, finishers, handle.vocab_size, use_cache)
        for k, ((ids, dropped), finisher) in enumerate(zip(chunk, finishers)):
            results.append(Generation(prompts[start + k], ids, finisher.tokens, finisher.text(), finisher.reason, dropped))
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


# -- JSON Lines -------------------------------------------------------------------------------
def read_prompts(path, chat: bool = False) -> list[tuple[str, dict, Any]]:
    """``(where, record, prompt)`` per non-blank line of a JSON Lines file (``where`` is
    ``"FILE:LINE"``): ``{"prompt": str | [ids]}``, or with ``chat`` ``{"messages": [...]}``.
    Errors name the file and line."""
    out = []
    try:
        handle = open(path, encoding="utf-8")
    except OSError as exc:
        raise GenerationError(f"{path}: cannot read prompts: {exc.strerror or exc}") from exc
    with handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            where = f"{path}:{number}"
            try:
                record = json.loads(line)
            except json.JSONDecodeError as exc:
                raise GenerationError(f"{where}: malformed JSON: {exc.msg} (column {exc.colno})") from None
            if not isinstance(record, dict):
                raise GenerationError(f"{where}: expected a JSON object, got {type(record).__name__}")
            key = "messages" if chat else "prompt"
            if key not in record:
                other = "'prompt' (without --chat)" if chat else "'messages' (with --chat)"
                raise GenerationError(f"{where}: no {key!r} key" + (f"; use {other}" if ("prompt" if chat else "messages") in record else ""))
            out.append((where, record, record[key]))
    if not out:
        raise GenerationError(f"{path}: no prompts in the file")
    return out


def run_command(args, out=None) -> int:
    """``pai-zoo generate``: prompts from JSON Lines to JSON Lines, or one ``--prompt`` streamed to
    ``out`` (stdout). The output file appears only when every prompt is done (written to a
    temporary name, renamed at the end). Under ``torchrun`` with ``--tp N`` rank 0 writes."""
    import os
    import sys
    from pathlib import Path

    import torch

    from .handle import load

    out = out or sys.stdout
    if (args.prompt is None) == (args.prompts is None):
        raise GenerationError("give either --prompt TEXT or --prompts FILE.jsonl --output OUT.jsonl")
    if args.prompts is not None and args.output is None:
        raise GenerationError("--prompts needs --output OUT.jsonl")
    if args.prompt is not None:
        chat = [{"role": "user", "content": args.prompt}]
        records = [("--prompt", {"prompt": args.prompt}, chat if args.chat else args.prompt)]
    else:
        records = read_prompts(args.prompts, chat=args.chat)
    labels = [where for where, _, _ in records]
    prompts = [prompt for _, _, prompt in records]
    if args.threads:
        torch.set_num_threads(args.threads)
    handle = load(args.model, backend=args.backend, tensor_parallel_size=args.tp if args.tp > 1 else None)
    rank0 = not torch.distributed.is_initialized() or torch.distributed.get_rank() == 0
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, stop=tuple(args.stop or ()), chat=args.chat,
                   truncate=args.truncate, batch_size=args.batch_size)
    if args.prompt is not None:
        def stream(_index, delta):
            if rank0:
                out.write(delta)
                out.flush()

        [result] = generate(handle, prompts, on_text=stream, labels=labels, **options)
        if rank0:
            out.write("\n")
            print(f"[{result.stop_reason}: {len(result.token_ids)} tokens]", file=sys.stderr)
        return 0
    results = generate(handle, prompts, labels=labels, **options)
    if rank0:
        target = Path(args.output)
        temporary = target.with_name(f".{target.name}.pai-zoo-tmp-{os.getpid()}")
        try:
            with open(temporary, "w", encoding="utf-8") as sink:
                for (_, record, _), result in zip(records, results):
                    sink.write(json.dumps({**record, **result.to_json()}, ensure_ascii=False) + "\n")
            os.replace(temporary, target)
        finally:
            temporary.unlink(missing_ok=True)
        print(f"generated {len(results)} completions ({sum(len(r.token_ids) for r in results)} tokens) -> {target}",
              file=sys.stderr)
    return 0
