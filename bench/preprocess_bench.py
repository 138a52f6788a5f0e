"""Preprocessing benchmark: ``pai-zoo preprocess`` tokens/s against the tokenizer alone.

Generates a JSON Lines corpus (default 60 MB; English-like words plus some CJK), then, for each
worker count, measures in the same run:

* the limit: the same tokenizer encoding the same texts in batches with the same number of
  processes, doing nothing else;
* ``preprocess`` (reading, tokenizing, writing ``.bin``/``.idx``) with that many workers,

and prints tokens/s for both and their ratio (issue #4 target: at least 0.8 with 2 workers,
and linear scaling in workers up to the cores). The tokenizer is the Llama plugin's bundled
Mistral-7B-v0.1 SentencePiece model (``--tokenizer mistral-7b``, 32,000 pieces). Run:
``python bench/preprocess_bench.py``.
"""
from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import random
import shutil
import tempfile
import time
from pathlib import Path

_TOKENIZER = None


def _init(path: str, family: str | None) -> None:
    global _TOKENIZER
    from pai_zoo.data.preprocess import family_tokenizer

    _TOKENIZER = family_tokenizer(path, family)


def _count(texts: list[str]) -> int:
    return sum(len(ids) for ids in _TOKENIZER.encode_batch(texts))


def make_corpus(path: Path, megabytes: int) -> tuple[list[str], int]:
    rng = random.Random(0)
    words = [
        "".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(2, 10))) for _ in range(20000)
    ]
    cjk = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生"
    texts, size = [], 0
    with open(path, "w", encoding="utf-8") as f:
        while size < megabytes * 1_000_000:
            text = " ".join(rng.choice(words) for _ in range(rng.randint(50, 400)))
            if rng.random() < 0.2:
                text += " " + "".join(rng.choice(cjk) for _ in range(rng.randint(10, 100)))
            line = json.dumps({"text": text}, ensure_ascii=False)
            f.write(line + "\n")
            texts.append(text)
            size += len(line.encode()) + 1
    return texts, size


def tokenizer_only(texts: list[str], workers: int, init_args, batch: int = 256) -> tuple[int, float]:
    batches = [texts[i:i + batch] for i in range(0, len(texts), batch)]
    context = multiprocessing.get_context("spawn")
    with context.Pool(workers, initializer=_init, initargs=init_args) as pool:
        pool.map(_count, [batches[0][:1]] * workers)  # warm: every worker has its tokenizer
        start = time.perf_counter()
        tokens = sum(pool.imap(_count, batches, chunksize=1))
        return tokens, time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=int, default=60)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--tokenizer", default="mistral-7b", help="preset, folder or file")
    args = parser.parse_args()

    from pai_zoo.data.preprocess import preprocess, resolve_tokenizer

    work = Path(tempfile.mkdtemp(prefix="pai-zoo-preprocess-bench-"))
    try:
        init_args = resolve_tokenizer(args.tokenizer)
        texts, size = make_corpus(work / "corpus.jsonl", args.megabytes)
        print(
            f"corpus: {len(texts)} documents, {size / 1e6:.1f} MB; tokenizer {args.tokenizer}; {os.cpu_count()} cores"
        )
        rates = {}
        for workers in args.workers:
            tokens, seconds = tokenizer_only(texts, workers, init_args)
            limit = tokens / seconds
            summary = preprocess([work / "corpus.jsonl"], work / f"out{workers}", args.tokenizer, workers=workers,
                                 progress=False)
            ours = summary.tokens / summary.seconds
            rates[workers] = ours
            print(f"workers={workers}: tokenizer alone {limit:,.0f} tokens/s; preprocess {ours:,.0f} tokens/s "
                  f"({summary.bytes / 1e6 / summary.seconds:.1f} MB/s); ratio {ours / limit:.2f}")
        if len(rates) > 1:
            base = min(rates)
            for workers, rate in sorted(rates.items()):
                print(f"scaling: {workers} workers = {rate / rates[base]:.2f}x of {base} worker(s) "
                      f"(linear would be {workers / base:.1f}x)")
        same = all(
            Path(f"{work}/out{w}_text_document.bin").read_bytes()
            == Path(f"{work}/out{args.workers[0]}_text_document.bin").read_bytes()
            for w in args.workers
        )
        print(f"outputs identical across worker counts: {same}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
