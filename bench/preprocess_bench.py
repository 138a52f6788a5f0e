"""Preprocessing benchmark: ``pai-zoo preprocess`` against the fast engine alone and the ``tokenizers`` baseline.

In one run, on the same texts and cores, for each tokenizer (``--kinds``):

* the limit: the fast engine (gigatoken) alone encoding the texts, already in memory, on all cores;
* the baseline: the exact engine's ``encode_batch`` (``tokenizers``' ``encode_batch_fast`` for a
  ``tokenizer.json``; sentencepiece / tiktoken for the others), 256 texts a call, on all cores;
* ``preprocess`` (reading, parsing, encoding, writing ``.bin``/``.idx``) with ``--engine fast`` and ``--engine hf``
  at each worker count, with where the fast engine's time goes (read, parse, encode, write);

then the targets of issue 21: fast preprocess at least 0.7 of the limit, at least 8x the baseline with 2 workers,
and (``--rss-megabytes``, default 1000) peak RSS under 2 GB on a corpus of that size whose words are nearly all
distinct (the case that grows gigatoken's encode caches). Every output must be byte-identical.

Tokenizers (nothing is downloaded): ``qwen2``, a byte-level BPE with Qwen2's pipeline (NFC, Qwen's split pattern,
byte level) and 32,000 merges trained here on the corpus (the real Qwen2 vocabulary is not on these machines);
``llama2``, the Llama-2-style SentencePiece model that mistral-common ships (Mistral-7B-v0.1, 32,000 pieces);
``tiktoken``, a Qwen (v1) ``qwen.tiktoken`` made from the same trained ranks, read as Qwen's tokenizer reads it.
Corpus: English-like Zipf-distributed words, code, digits and some CJK. Run: ``python bench/preprocess_bench.py``.
"""
from __future__ import annotations

import argparse
import base64
import dataclasses
import json
import os
import random
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CODE = ("def forward(self, hidden_states):\n    return self.mlp(hidden_states) + 12345\n",
        "for i in range(10):\n\tprint(f'{i:>4}', end='')\n", "if __name__ == '__main__':\n    main()\n")
CJK = "的一是不了人我在有他这为之大来以个中上们到说国和地也子时道出而要于就下得可你年生"


def make_corpus(path: Path, megabytes: float, *, unique: bool = False, seed: int = 0) -> int:
    """A JSON Lines corpus of about ``megabytes`` MB; ``unique``: nearly every word distinct. Returns its size."""
    if unique:
        return _unique_corpus(path, megabytes, seed)
    rng = random.Random(seed)
    letters = "abcdefghijklmnopqrstuvwxyz"
    words = ["".join(rng.choice(letters) for _ in range(rng.randint(2, 11))) for _ in range(50000)]
    weights = [1 / (rank + 1) for rank in range(len(words))]  # Zipf
    size, target = 0, megabytes * 1_000_000
    with open(path, "w", encoding="utf-8") as f:
        while size < target:
            body = " ".join(rng.choices(words, weights, k=rng.randint(80, 500)))
            if rng.random() < 0.3:
                body += "\n\n" + rng.choice(CODE)
            if rng.random() < 0.2:
                body += " " + "".join(rng.choice(CJK) for _ in range(rng.randint(10, 80)))
            body += f" ({rng.randint(0, 10 ** 6)})"
            line = json.dumps({"text": body}, ensure_ascii=False) + "\n"
            f.write(line)
            size += len(line.encode())
    return size


def _unique_corpus(path: Path, megabytes: float, seed: int) -> int:
    """Random lower-case words of 3 to 12 letters (almost all distinct), about 3 KB a document."""
    import numpy as np

    rng = np.random.default_rng(seed)
    size, target, chunk = 0, megabytes * 1_000_000, 1 << 24
    with open(path, "wb") as f:
        while size < target:
            letters = rng.integers(97, 123, chunk, dtype=np.uint8)
            gaps = np.cumsum(rng.integers(4, 14, chunk // 4))
            letters[gaps[gaps < chunk]] = 32  # spaces
            for start in range(0, chunk - 3000, 3000):
                line = b'{"text": "' + letters[start:start + 3000].tobytes().strip() + b'"}\n'
                f.write(line)
                size += len(line)
                if size >= target:
                    break
    return size


def _texts(path: Path) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [json.loads(line)["text"] for line in f]


# -- tokenizers ---------------------------------------------------------------------------------------------------
def qwen2_folder(folder: Path, texts: list[str]) -> Path:
    from pai_zoo_qwen.tokenizer_files import write_qwen2_tokenizer

    spec = dataclasses.replace(write_qwen2_tokenizer, vocab_size=32000, repeat=1, corpus=tuple(texts[:3000]))
    return spec(folder)


def tiktoken_folder(folder: Path, qwen2: Path) -> Path:
    """Qwen (v1): the Qwen2 folder's learnt tokens as ``qwen.tiktoken`` ranks (id order), read by the qwen plugin."""
    from tokenizers import pre_tokenizers

    alphabet = pre_tokenizers.ByteLevel.alphabet()
    byte_of = {}
    for b in range(256):  # GPT-2's bytes_to_unicode
        printable = 33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255
        byte_of[chr(b) if printable else None] = b
    n = 0
    for b in range(256):
        if not (33 <= b <= 126 or 161 <= b <= 172 or 174 <= b <= 255):
            byte_of[chr(256 + n)] = b
            n += 1
    assert set(alphabet) <= set(byte_of)
    vocab = json.loads((qwen2 / "tokenizer.json").read_text(encoding="utf-8"))["model"]["vocab"]
    ranks = sorted(((bytes(byte_of[c] for c in token), index) for token, index in vocab.items()), key=lambda x: x[1])
    folder.mkdir(parents=True, exist_ok=True)
    with open(folder / "qwen.tiktoken", "w", encoding="ascii") as f:
        for rank, (token, _) in enumerate(ranks):
            f.write(f"{base64.b64encode(token).decode('ascii')} {rank}\n")
    (folder / "config.json").write_text(json.dumps({"model_type": "qwen", "architectures": ["QWenLMHeadModel"]}))
    return folder


def tokenizer_path(kind: str, work: Path, texts: list[str]) -> str:
    if kind == "qwen2":
        return str(qwen2_folder(work / "tok-qwen2", texts))
    if kind == "tiktoken":
        qwen2 = work / "tok-qwen2"
        if not (qwen2 / "tokenizer.json").is_file():
            qwen2_folder(qwen2, texts)
        return str(tiktoken_folder(work / "tok-qwen", qwen2))
    if kind == "llama2":
        return "mistral-7b"
    raise SystemExit(f"unknown kind {kind!r}: qwen2, llama2, tiktoken")


# -- measurements -------------------------------------------------------------------------------------------------
def _batches(texts: list[str], nbytes: int) -> list[list[str]]:
    out, batch, size = [], [], 0
    for text in texts:
        batch.append(text)
        size += len(text)
        if size >= nbytes:
            out.append(batch)
            batch, size = [], 0
    return out + ([batch] if batch else [])


def fast_alone(exact, texts: list[str]) -> tuple[int, float]:
    """The limit: gigatoken's encode on its own thread pool (all cores), the same arrays preprocess gets."""
    from pai_zoo.tokenizers.fast import fast_tokenizer

    fast = fast_tokenizer(exact)  # threads=None: gigatoken's pool
    batches = _batches(texts, 1 << 23)
    fast.encode_batch_arrays(batches[0][:64])  # warm
    start = time.perf_counter()
    tokens = sum(int(fast.encode_batch_arrays(b)[1].sum()) for b in batches)
    return tokens, time.perf_counter() - start


def baseline(exact, texts: list[str]) -> tuple[int, float]:
    batches = _batches(texts, 0)
    batches = [texts[i:i + 256] for i in range(0, len(texts), 256)]
    exact.encode_batch(batches[0][:8])
    start = time.perf_counter()
    tokens = sum(len(ids) for b in batches for ids in exact.encode_batch(b))
    return tokens, time.perf_counter() - start


def peak_rss(corpus: Path, tokenizer: str, out: Path, engine: str, workers: int) -> tuple[float, str]:
    """Peak RSS (GB) of a preprocess run in a fresh process (worker processes included), and its summary line."""
    code = ("import resource, sys\n"
            "from pai_zoo.data.preprocess import preprocess\n"
            f"s = preprocess([{str(corpus)!r}], {str(out)!r}, {tokenizer!r}, engine={engine!r}, workers={workers},"
            " progress=False)\n"
            "own = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss\n"
            "kids = resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss\n"
            "print(max(own, kids) / 1e6, s.line() + f\"; {s.extra.get('cache_resets', 0)} cache resets\")\n")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    rss, line = done.stdout.strip().split(" ", 1)
    return float(rss), line


def _same(*prefixes: Path) -> bool:
    first = [Path(f"{prefixes[0]}_text_document{s}").read_bytes() for s in (".bin", ".idx")]
    return all([Path(f"{p}_text_document{s}").read_bytes() for s in (".bin", ".idx")] == first for p in prefixes)


def bench_kind(kind: str, work: Path, corpus: Path, size: int, texts: list[str], workers: list[int]) -> dict:
    from pai_zoo.data.preprocess import preprocess, resolve_tokenizer

    spec = tokenizer_path(kind, work, texts)
    exact = resolve_tokenizer(spec).load()
    mb = size / 1e6
    row = {"kind": kind, "tokenizer": f"{type(exact).__name__} ({exact.vocab_size} ids)"}
    tokens, seconds = fast_alone(exact, texts)
    row["limit"] = mb / seconds
    base_tokens, base_seconds = baseline(exact, texts)
    assert base_tokens == tokens, (base_tokens, tokens)
    row["baseline"] = mb / base_seconds
    outs = []
    for engine in ("fast", "hf"):
        for w in workers:
            out = work / f"out-{kind}-{engine}-{w}"
            summary = preprocess([corpus], out, spec, engine=engine, workers=w, progress=False)
            if not summary.engine.startswith(engine):
                raise SystemExit(f"{kind}: --engine {engine} ran {summary.engine}")
            row[f"{engine}{w}"] = mb / summary.seconds
            if engine == "fast":
                row[f"profile{w}"] = {k: v / summary.seconds for k, v in summary.profile.items()}
                row[f"steady{w}"] = mb / (summary.seconds - summary.profile["check"])
            outs.append(out)
    row["identical"] = _same(*outs)
    for out in outs:
        for path in work.glob(f"{out.name}_*"):
            path.unlink()
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--megabytes", type=float, default=60)
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--kinds", nargs="+", default=["qwen2", "llama2", "tiktoken"])
    parser.add_argument("--rss-megabytes", type=float, default=1000,
                        help="size of the many-unique-words corpus for the peak RSS check (0: skip)")
    args = parser.parse_args()
    work = Path(tempfile.mkdtemp(prefix="pai-zoo-preprocess-bench-"))
    os.environ.setdefault("PAI_ZOO_CACHE", str(work / "cache"))
    try:
        corpus = work / "corpus.jsonl"
        size = make_corpus(corpus, args.megabytes)
        texts = _texts(corpus)
        print(f"corpus: {len(texts)} documents, {size / 1e6:.1f} MB; {os.cpu_count()} cores; MB/s of JSONL input")
        rows = []
        for kind in args.kinds:
            rows.append(bench_kind(kind, work, corpus, size, texts, args.workers))
            print(f"{kind}: measured", flush=True)
        top = max(args.workers)
        head = ("| tokenizer | fast engine alone | tokenizers/exact encode_batch | "
                + " | ".join(f"preprocess fast w={w}" for w in args.workers) + " | "
                + " | ".join(f"preprocess hf w={w}" for w in args.workers)
                + f" | fast w={top} / alone | fast w={top} / baseline | identical |")
        print(head)
        print("|" + "---|" * (head.count("|") - 1))
        for r in rows:
            cells = [f"{r['limit']:.1f}", f"{r['baseline']:.1f}", *(f"{r[f'fast{w}']:.1f}" for w in args.workers),
                     *(f"{r[f'hf{w}']:.1f}" for w in args.workers), f"{r[f'fast{top}'] / r['limit']:.2f}",
                     f"{r[f'fast{top}'] / r['baseline']:.1f}x", str(r["identical"])]
            print(f"| {r['kind']}: {r['tokenizer']} | " + " | ".join(cells) + " |")
        for r in rows:
            for w in args.workers:
                shares = ", ".join(f"{k} {v:.0%}" for k, v in r[f"profile{w}"].items())
                print(f"profile {r['kind']} fast w={w}: {shares} of the wall time (check: loading the fast engine "
                      "and checking it; read/parse run on the reader thread, overlapping encode); after the check "
                      f"{r[f'steady{w}']:.1f} MB/s = {r[f'steady{w}'] / r['limit']:.2f} of the limit")
        for r in rows:
            print(f"targets {r['kind']}: fast w={top} / alone {r[f'fast{top}'] / r['limit']:.2f} (>= 0.7: "
                  f"{r[f'fast{top}'] / r['limit'] >= 0.7}); / baseline {r[f'fast{top}'] / r['baseline']:.1f}x "
                  f"(>= 8: {r[f'fast{top}'] / r['baseline'] >= 8})")
        if args.rss_megabytes:
            big = work / "unique.jsonl"
            big_size = make_corpus(big, args.rss_megabytes, unique=True, seed=1)
            spec = tokenizer_path(args.kinds[0], work, texts)
            rss, line = peak_rss(big, spec, work / "rss", "fast", top)
            print(f"peak RSS, {big_size / 1e9:.2f} GB corpus of nearly all distinct words, {args.kinds[0]}, "
                  f"--engine fast --workers {top}: {rss:.2f} GB (< 2 GB: {rss < 2}); {line}")
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
