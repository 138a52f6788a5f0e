"""``pai-zoo preprocess``: raw text -> Megatron indexed datasets (``.bin``/``.idx``), in parallel.

Records stream from the inputs in batches; worker processes tokenize them; results come back
in input order, so the output is byte-identical whatever the number of workers. At most
``2 x workers`` batches are in flight, so memory stays bounded on inputs of any size. Output
files follow Megatron-LM's ``tools/preprocess_data.py``: ``PREFIX_{key}_document.bin/.idx``
(SFT: ``PREFIX_text_document`` and ``PREFIX_loss_mask_document``), each with the sidecar
``PREFIX_{key}_document.json`` (token-id range and tokenizer; :func:`pai_zoo.data.indexed.sidecar_path`), which
``pai-zoo train`` reads to check the data against the model's vocabulary.
"""
from __future__ import annotations

import collections
import contextlib
import multiprocessing
import time
from dataclasses import dataclass, field
from itertools import chain, islice
from pathlib import Path
from typing import Callable, Iterable, Iterator

from ..plugin.errors import PaiZooError, PaiZooWarning, SettingError
from ..tokenizers import fast as fast_engine
from ..tokenizers.fast import (
    ENGINES,
    FastEngineMismatch,
    FastEngineUnavailable,
    fast_tokenizer,
    first_difference,
    hard_strings,
)
from ..tokenizers.names import TokenizerRef, resolve_tokenizer
from ..util.progress import Progress
from ..util.quiet import VerboseNotice
from .blocks import iter_text_batches
from .blocks import record_texts as _texts
from .sources import BadRecord, iter_raw_records, parse_record


@dataclass
class PreprocessSummary:
    """What a run wrote, and what it skipped (``--skip-bad``).

    ``documents`` and ``sequences`` are the counts of the index that ``pai-zoo dataset inspect`` shows. For
    pretraining data a document is one record, in one sequence. For SFT data ``records`` is the number of chat
    records read; packed, a document is one sequence of ``seq_length`` tokens holding several records, each record a
    sequence, plus a padding sequence where the pack is not full (so ``sequences = records + padding sequences``);
    unpacked, a document is one record padded to a multiple of ``pad_length`` (one sequence)."""

    outputs: list[str]
    documents: int = 0
    tokens: int = 0
    bytes: int = 0
    skipped: int = 0
    skipped_examples: list[str] = field(default_factory=list)
    seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    records: int | None = None  # SFT: the records read (None for pretraining, where it equals documents)
    sequences: int | None = None  # SFT: the sequences written (records + padding sequences when packed)
    engine: str = ""  # what encoded the text: "fast (gigatoken X)" or "hf (tokenizers)" / sentencepiece / tiktoken
    profile: dict = field(default_factory=dict)  # fast engine: seconds spent reading, parsing, encoding, writing

    def line(self) -> str:
        rate = self.seconds or 1e-9
        if self.records is None:
            counts = f"{self.documents} documents"
        else:
            packs = self.extra.get("padding_sequences") is not None
            counts = (f"{self.records} records -> {self.documents} documents "
                      + (f"(packed sequences; {self.sequences} sequences = {self.records} records + "
                         f"{self.extra['padding_sequences']} padding)" if packs else "(one record each)"))
        text = (
            f"{counts}, {self.tokens} tokens, {self.bytes / 1e6:.1f} MB in {self.seconds:.1f} s "
            f"({(self.records or self.documents) / rate:.0f} {'records' if self.records is not None else 'docs'}/s, "
            f"{self.tokens / rate:.0f} tokens/s, {self.bytes / 1e6 / rate:.1f} MB/s)"
        )
        if self.skipped:
            text += f"; skipped {self.skipped} bad records"
        if self.extra.get("padding_note"):
            text += "; " + self.extra["padding_note"]
        text += " -> " + ", ".join(self.outputs)
        return text + (f"; engine {self.engine}" if self.engine else "")


class NoEndOfDocument(SettingError):
    """``append_eod`` with a tokenizer that has no end-of-document (EOS) token."""


def output_prefix(prefix, key: str) -> str:
    """Megatron-LM's naming: ``PREFIX_{key}_document``."""
    return f"{prefix}_{key}_document"


def check_json_keys(keys) -> tuple[str, ...]:
    """``keys`` when each is a plain name; a key names an output file (``PREFIX_{key}_document.bin``), so one with a
    path separator, ``..``, a NUL or nothing at all (which could write outside the prefix's folder) is refused in one
    line naming ``--json-keys`` and the value."""
    import os

    keys = tuple(keys)
    if not keys:
        raise SettingError("--json-keys: give at least one key")
    for key in keys:
        key = str(key)
        bad = ("is empty" if not key.strip() else
               "holds a NUL character" if "\0" in key else
               "holds a path separator" if any(sep and sep in key for sep in ("/", "\\", os.sep, os.altsep)) else
               "holds '..'" if ".." in key else "is '.'" if key == "." else None)
        if bad is not None:
            raise SettingError(f"--json-keys {key!r}: {bad}; a key names the output file PREFIX_{{key}}_document.bin "
                               "inside the --output-prefix folder, so it must be a plain name (no '/', '\\', '..' "
                               "or NUL)")
    return keys


# -- tokenizers by name: pai_zoo.tokenizers.names.resolve_tokenizer ---------------------------------
def family_tokenizer(path: str, family: str | None):
    """The tokenizer adapter of a resolved ``--tokenizer`` (``TokenizerRef(path, family).load()``)."""
    return TokenizerRef(path, family).load()


def _metadata(spec, ref: TokenizerRef, tokenizer) -> dict:
    """The sidecar's record of the tokenizer a dataset was made with."""
    return {"tokenizer": {"name": str(spec), "path": str(Path(ref.path).resolve()), "family": ref.family,
                          "vocab_size": tokenizer.vocab_size}}


# -- workers ------------------------------------------------------------------------------------
_TOKENIZER = None
_INIT_ERROR: BaseException | None = None


def _init_worker(path: str, family: str | None) -> None:
    """Load the tokenizer once per worker. A failure is kept and raised by the first task (an
    exception in a pool initializer would make the pool restart the worker forever)."""
    global _TOKENIZER, _INIT_ERROR
    try:
        _TOKENIZER = family_tokenizer(path, family)
    except BaseException as exc:  # noqa: BLE001 - re-raised in the task
        _INIT_ERROR = exc


@dataclass(frozen=True)
class _Task:
    """What a worker needs to turn one batch of raw records into token ids."""

    keys: tuple[str, ...]
    add_special_tokens: bool
    append_eod: bool
    dtype: str = "int32"


@dataclass
class _EncodedBatch:
    """A tokenized batch, compact for the trip back: per key, all documents' tokens in one array
    and their lengths; the bad records with their position in the batch."""

    tokens: list            # per key: np.ndarray of every good document's tokens, in order
    lengths: list           # per key: np.ndarray[int64] of token counts per good document
    nbytes: int             # UTF-8 bytes of the good documents' texts
    bad: list               # (position in batch, BadRecord)

    @property
    def documents(self) -> int:
        return len(self.lengths[0]) if self.lengths else 0


def _encode_pretraining(task: _Task, batch: list[tuple[str, object]]) -> _EncodedBatch:
    """Parse and tokenize a batch of raw records (one ``encode_batch`` call per key)."""
    import numpy as np


    bad, good = [], []
    for i, (where, payload) in enumerate(batch):
        record = payload if isinstance(payload, BadRecord) else parse_record(where, payload)
        texts = record if isinstance(record, BadRecord) else _texts(record, task.keys, where)
        if isinstance(texts, BadRecord):
            bad.append((i, texts))
        else:
            good.append(texts)
    eod = [_TOKENIZER.eod_id] if task.append_eod else []
    tokens, lengths = [], []
    for k in range(len(task.keys)):
        ids = _TOKENIZER.encode_batch([texts[k] for texts in good], add_special_tokens=task.add_special_tokens)
        if eod:
            ids = [seq + eod for seq in ids]
        lengths.append(np.fromiter(map(len, ids), dtype=np.int64, count=len(ids)))
        flat = np.fromiter(chain.from_iterable(ids), dtype=task.dtype, count=int(lengths[-1].sum()))
        tokens.append(flat)
    nbytes = sum(len(t.encode("utf-8")) for texts in good for t in texts)
    return _EncodedBatch(tokens, lengths, nbytes, bad)


def _run(args):
    if _INIT_ERROR is not None:
        raise _INIT_ERROR
    fn, task, batch = args
    return fn(task, batch)


def ordered_parallel_map(fn: Callable, task, batches: Iterable, workers: int, initializer: Callable | None = None,
                         initargs: tuple = ()) -> Iterator:
    """``fn(task, batch)`` for each batch, results in input order. ``workers <= 1`` runs in this
    process; otherwise a spawn pool (``initializer(*initargs)`` in each worker) with at most
    ``2 x workers`` batches in flight. ``fn`` must be importable (a module-level function)."""
    if workers <= 1:
        if initializer is not None:
            initializer(*initargs)
        for batch in batches:
            yield _run((fn, task, batch))
        return
    from concurrent.futures import ProcessPoolExecutor

    # A pool executor, not multiprocessing.Pool: a worker that dies raises BrokenProcessPool here
    # instead of being restarted forever.
    context = multiprocessing.get_context("spawn")
    with ProcessPoolExecutor(workers, mp_context=context, initializer=initializer, initargs=initargs) as pool:
        pending: collections.deque = collections.deque()
        try:
            for batch in batches:
                pending.append(pool.submit(_run, (fn, task, batch)))
                if len(pending) >= 2 * workers:
                    yield pending.popleft().result()
            while pending:
                yield pending.popleft().result()
        finally:
            for future in pending:
                future.cancel()


def _batches(records: Iterator, size: int) -> Iterator[list]:
    while batch := list(islice(records, size)):
        yield batch


class _BadRecords:
    """Stops at the first bad record, or (``skip``) counts them."""

    def __init__(self, skip: bool):
        self.skip, self.count, self.examples = skip, 0, []

    def __call__(self, error: BadRecord) -> None:
        if not self.skip:
            raise error
        self.count += 1
        if len(self.examples) < 10:
            self.examples.append(str(error))


def _exact_engine_name(tok) -> str:
    return "hf (" + {"hf": "tokenizers", "sentencepiece": "sentencepiece", "tiktoken": "tiktoken"}.get(
        tok.kind, type(tok).__name__) + ")"


def _sample_texts(inputs, keys, text_mode: str, count: int = 64, max_bytes: int = 1 << 16) -> list[str]:
    """Texts of the first good records of the inputs (the run's own text, for the engine check): at most
    ``count`` records and about ``max_bytes`` of text, so that the exact engine checks them in a fraction of a
    second."""

    texts: list[str] = []
    size = 0
    for batch in iter_text_batches(inputs, keys, text_mode=text_mode, batch_bytes=max_bytes):
        for row in zip(*batch.texts):
            texts += row
            size += sum(map(len, row))
            if len(texts) >= count * len(keys) or size >= max_bytes:
                return texts
    return texts


def select_engine(tok, engine: str, inputs, keys, *, text_mode: str = "file", add_special_tokens: bool = True,
                  threads: int | None = None):
    """``(fast tokenizer or None, why not)`` for ``--engine``: ``hf`` never uses the fast engine; ``auto`` uses it
    when it is installed, covers this tokenizer and gives the exact engine's ids on a sample of the run's input and
    on :data:`~pai_zoo.tokenizers.fast.HARD_STRINGS`, and otherwise warns and returns None; ``fast`` raises
    instead of falling back."""
    import warnings


    if engine not in ENGINES:
        raise SettingError(f"--engine {engine}: not one of {', '.join(ENGINES)}")
    if engine == "hf":
        return None, "--engine hf"
    # without the fast extra, the exact engine (fast_engine_installed looked up at call time: tests swap it)
    if engine == "auto" and not fast_engine.fast_engine_installed():
        return None, "gigatoken is not installed"
    try:
        fast = fast_tokenizer(tok, threads=threads)
        texts = hard_strings(tok) + _sample_texts(inputs, keys, text_mode)
        differing = first_difference(fast, texts, add_special_tokens=add_special_tokens)
        if differing is not None:
            shown = differing if len(differing) <= 80 else differing[:77] + "..."
            raise FastEngineMismatch(f"the fast engine's ids differ from the exact engine's on {shown!r}")
    except (FastEngineUnavailable, FastEngineMismatch) as exc:
        if engine == "fast":
            raise type(exc)(f"--engine fast: {exc}", hint="use --engine auto (falls back) or --engine hf") from exc
        # a tokenizer the fast engine does not cover: a note under --verbose only (the output is the same bytes);
        # ids that differ on a text are a gigatoken bug worth a warning on every run
        category = VerboseNotice if isinstance(exc, FastEngineUnavailable) else PaiZooWarning
        warnings.warn(f"fast engine: {exc}; the exact engine encodes the text", category, stacklevel=3)
        return None, str(exc)
    return fast, None


def preprocess(inputs, prefix, tokenizer, *, json_keys=("text",), append_eod: bool = False, workers: int = 1,
               skip_bad: bool = False, text_mode: str = "file", batch_size: int = 256,
               add_special_tokens: bool = True, progress: bool | None = None, engine: str = "auto",
               batch_bytes: int = 1 << 23) -> PreprocessSummary:
    """Tokenize ``inputs`` (paths or globs) into ``PREFIX_{key}_document.bin/.idx`` per JSON key.

    A bad record (malformed JSON, missing key, non-UTF-8 bytes, empty document) stops the run
    with its ``file:line`` and leaves no output, unless ``skip_bad`` counts and skips it.

    ``engine`` (:func:`select_engine`): ``auto``, ``fast`` or ``hf``. The fast engine runs in this process: a
    thread reads and parses the input in blocks (``batch_bytes`` of raw input per batch, two batches ahead),
    gigatoken encodes each batch on ``workers`` threads, and each batch is one write per output. The exact engine
    runs ``workers`` processes on ``batch_size`` records each. Both write the same bytes.
    """
    from .indexed import IndexedDatasetWriter, optimal_dtype

    keys = check_json_keys(json_keys)
    ref = resolve_tokenizer(tokenizer)
    tok = ref.load()
    if append_eod and tok.eod_id is None:
        raise NoEndOfDocument(
            f"--append-eod: tokenizer {tokenizer} has no end-of-document token (no eos_token)",
            hint="leave out --append-eod, or give a tokenizer whose tokenizer_config.json names an eos_token (a bare "
                 ".tiktoken rank file has special tokens only when named after an OpenAI encoding: cl100k_base, "
                 "o200k_base, p50k_base, r50k_base)")
    start = time.perf_counter()  # the engine check counts: it is part of every run
    fast, _ = select_engine(tok, engine, inputs, keys, text_mode=text_mode, add_special_tokens=add_special_tokens,
                            threads=max(1, workers))
    dtype = optimal_dtype(tok.vocab_size)
    outputs = [output_prefix(prefix, key) for key in keys]
    summary = PreprocessSummary(outputs)
    summary.profile["check"] = time.perf_counter() - start  # loading the fast engine and checking it
    bad = _BadRecords(skip_bad)
    bar = Progress("preprocess", units=("documents", "tokens"), enabled=progress)
    with contextlib.ExitStack() as stack:
        metadata = _metadata(tokenizer, ref, tok)
        writers = [stack.enter_context(IndexedDatasetWriter(out, dtype, metadata)) for out in outputs]
        if fast is not None:
            encoded_batches = _encode_fast(fast, inputs, keys, text_mode, batch_bytes, add_special_tokens,
                                           append_eod, dtype, summary.profile)
            summary.engine = f"fast (gigatoken {_gigatoken_version()}, {max(1, workers)} threads)"
        else:
            task = _Task(keys, add_special_tokens, append_eod, str(dtype))
            records = iter_raw_records(inputs, text_mode=text_mode, text_key=keys[0])
            encoded_batches = ordered_parallel_map(_encode_pretraining, task, _batches(records, batch_size), workers,
                                                   _init_worker, ref)
            summary.engine = _exact_engine_name(tok) + (f", {workers} workers" if workers > 1 else "")
        stack.callback(encoded_batches.close)  # stops the reader thread or the pool when a bad record stops us
        for encoded in encoded_batches:
            for _, error in encoded.bad:  # stops here (nothing is kept) unless bad records are skipped
                bad(error)
            write_start = time.perf_counter()
            for writer, tokens, lengths in zip(writers, encoded.tokens, encoded.lengths):
                writer.add_documents(tokens, lengths)
            summary.profile["write"] = summary.profile.get("write", 0.0) + time.perf_counter() - write_start
            tokens = sum(t.size for t in encoded.tokens)
            summary.documents += encoded.documents
            summary.tokens += tokens
            summary.bytes += encoded.nbytes
            bar.update(encoded.nbytes, documents=encoded.documents, tokens=tokens)
        if summary.documents == 0:
            raise PaiZooError(
                f"no documents in {', '.join(map(str, inputs))}" + (f" ({bad.count} skipped)" if bad.count else "")
            )
        if fast is not None:
            summary.extra["cache_resets"] = fast.cache_resets
        write_start = time.perf_counter()
        for writer in writers:
            writer.finalize()
        summary.profile["write"] = summary.profile.get("write", 0.0) + time.perf_counter() - write_start
    bar.close()
    summary.skipped, summary.skipped_examples = bad.count, bad.examples
    summary.seconds = time.perf_counter() - start
    return summary


def _gigatoken_version() -> str:
    from importlib.metadata import version

    return version("gigatoken")


def _prefetch(iterator: Iterator, depth: int = 2) -> Iterator:
    """``iterator``'s items, produced by a thread at most ``depth`` items ahead (its exception re-raised here)."""
    import queue
    import threading

    items: queue.Queue = queue.Queue(depth)
    done = object()
    stop = threading.Event()

    def produce() -> None:
        try:
            for item in iterator:
                while not stop.is_set():
                    try:
                        items.put((item, None), timeout=0.1)
                        break
                    except queue.Full:
                        continue
                if stop.is_set():
                    return
            items.put((done, None))
        except BaseException as exc:  # noqa: BLE001 - handed to the consumer
            items.put((done, exc))

    thread = threading.Thread(target=produce, name="preprocess-reader", daemon=True)
    thread.start()
    try:
        while True:
            item, error = items.get()
            if item is done:
                if error is not None:
                    raise error
                return
            yield item
    finally:
        stop.set()
        thread.join()


#: How much the fast engine's encode caches may grow the process before they are dropped (bytes).
FAST_CACHE_GROWTH = 512 << 20


def _encode_fast(fast, inputs, keys, text_mode, batch_bytes, add_special_tokens, append_eod, dtype,
                 profile: dict) -> Iterator[_EncodedBatch]:
    """The fast engine's batches: read and parsed by a thread, encoded here (gigatoken releases the GIL)."""

    append = [fast.eod_id] if append_eod else []
    for name in ("read", "parse", "encode"):
        profile.setdefault(name, 0.0)
    batches = iter_text_batches(inputs, keys, text_mode=text_mode, batch_bytes=batch_bytes)
    for batch in _prefetch(batches):
        profile["read"] += batch.read_seconds
        profile["parse"] += batch.parse_seconds
        start = time.perf_counter()
        tokens, lengths = [], []
        for column in batch.texts:
            flat, sizes = fast.encode_batch_arrays(column, add_special_tokens, append=append)
            tokens.append(flat.astype(dtype, copy=False))
            lengths.append(sizes)
        fast.bound_memory(FAST_CACHE_GROWTH)
        profile["encode"] += time.perf_counter() - start
        yield _EncodedBatch(tokens, lengths, batch.nbytes, [(None, error) for error in batch.bad])


# -- SFT ------------------------------------------------------------------------------------------
def _encode_sft(task: _Task, batch: list[tuple[str, object]]) -> list:
    """Per record: ``(where, tokens, loss_mask, utf8 bytes)`` or ``(where, BadRecord)``."""
    from .sft import build_example, normalize_record

    out = []
    for where, payload in batch:
        record = payload if isinstance(payload, BadRecord) else parse_record(where, payload)
        if isinstance(record, BadRecord):
            out.append((where, record))
            continue
        try:
            messages = normalize_record(record, where)
            tokens, mask = build_example(messages, _TOKENIZER)
        except ValueError as exc:
            out.append((where, BadRecord(str(exc))))
            continue
        nbytes = sum(len(m["content"].encode("utf-8")) for m in messages)
        out.append((where, tokens, mask, nbytes))
    return out


def preprocess_sft(inputs, prefix, tokenizer, *, seq_length: int = 1024, pad_length: int = 128, pack: bool = True,
                   workers: int = 1, skip_bad: bool = False, batch_size: int = 256,
                   progress: bool | None = None) -> PreprocessSummary:
    """Instruction or chat records -> ``PREFIX_text_document`` (token ids) and
    ``PREFIX_loss_mask_document`` (1 where the loss applies: assistant responses), with the same
    layout: with ``pack``, one document per packed sequence of ``seq_length`` tokens and one
    sequence per record inside it (the record boundaries, so attention can be reset); without,
    one document per record, padded to a multiple of ``pad_length``."""
    import numpy as np

    from . import sft
    from .indexed import IndexedDatasetWriter, optimal_dtype

    ref = resolve_tokenizer(tokenizer)
    tok = ref.load()
    pad_id, padding_note = sft_pad_id(tok, tokenizer)
    outputs = [output_prefix(prefix, "text"), output_prefix(prefix, "loss_mask")]
    summary = PreprocessSummary(outputs, records=0)
    bad = _BadRecords(skip_bad)
    start = time.perf_counter()
    bar = Progress("preprocess --sft", units=("records", "tokens"), enabled=progress)
    task = _Task(("messages",), True, False)
    records = iter_raw_records(inputs)

    def examples():
        batches = _batches(records, batch_size)
        for results in ordered_parallel_map(_encode_sft, task, batches, workers, _init_worker, ref):
            for result in results:
                if isinstance(result[1], BadRecord):
                    bad(result[1])
                    continue
                _, tokens, mask, nbytes = result
                summary.records, summary.bytes = summary.records + 1, summary.bytes + nbytes
                bar.update(nbytes, records=1, tokens=len(tokens))
                yield tokens, mask

    metadata = _metadata(tokenizer, ref, tok)
    with IndexedDatasetWriter(outputs[0], optimal_dtype(tok.vocab_size), metadata) as text_writer, \
            IndexedDatasetWriter(outputs[1], np.uint8, metadata) as mask_writer:
        if pack:
            stats = sft.PackStats()
            for packed in sft.pack(examples(), seq_length, pad_id, stats=stats):
                text_writer.add_document(packed.tokens, lengths=packed.boundaries)
                mask_writer.add_document(packed.loss_mask, lengths=packed.boundaries)
                summary.tokens += len(packed.tokens)
                summary.extra["padding_sequences"] = summary.extra.get("padding_sequences", 0) + bool(packed.padding)
            summary.extra.update(packs=stats.packs, truncated=stats.truncated, padding=stats.padding)
        else:
            for tokens, mask in examples():
                tokens, mask = sft.pad_to_multiple(tokens, mask, pad_length, pad_id)
                text_writer.add_document(tokens)
                mask_writer.add_document(mask)
                summary.tokens += len(tokens)
        if summary.records == 0:
            raise PaiZooError(
                f"no records in {', '.join(map(str, inputs))}" + (f" ({bad.count} skipped)" if bad.count else "")
            )
        summary.documents, summary.sequences = text_writer.documents_written, text_writer.sequences_written
        summary.extra.update(pad_id=pad_id, padding_note=padding_note)
        sft_record = {"records": summary.records, "packed": pack, "pad_id": pad_id,
                      "padding_sequences": summary.extra.get("padding_sequences", 0)}
        for writer in (text_writer, mask_writer):
            writer.metadata["sft"] = sft_record
        text_writer.finalize()
        mask_writer.finalize()
    bar.close()
    summary.skipped, summary.skipped_examples = bad.count, bad.examples
    summary.seconds = time.perf_counter() - start
    return summary


def sft_pad_id(tok, name="") -> tuple[int, str | None]:
    """``(pad_id, note)``: SFT pads with the tokenizer's pad token; without one, with its end-of-document token,
    and ``note`` says so (decoded, that padding reads as repeated end-of-document tokens; it has loss mask 0 and
    its own attention segment, so training never sees it)."""
    if tok.pad_id is not None:
        note = None
        if tok.pad_id == tok.eod_id:
            note = (f"the tokenizer's pad token is its end-of-document token {_token_text(tok, tok.pad_id)} "
                    f"(id {tok.pad_id}): padding decodes as repeats of it (loss mask 0, never attended to by the "
                    "records)")
        return int(tok.pad_id), note
    if tok.eod_id is None:
        raise PaiZooError(f"--tokenizer {name}: no pad or end-of-document token to pad with")
    shown = _token_text(tok, tok.eod_id)
    return int(tok.eod_id), (f"the tokenizer has no pad token: padded with the end-of-document token {shown} "
                             f"(id {tok.eod_id}; loss mask 0, never attended to by the records)")


def _token_text(tok, token_id: int) -> str:
    for name in ("eos_token", "pad_token", "bos_token"):
        text = getattr(tok, name, None)
        if text is not None and getattr(tok, name.replace("_token", "_id"), None) == token_id:
            return repr(text)
    try:
        return repr(tok.decode([token_id]))
    except Exception:  # noqa: BLE001 - only for the message
        return f"#{token_id}"
