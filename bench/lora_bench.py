"""Peak memory and step time of ``train --peft lora`` against full fine-tuning of the same model, in one run.

Both sides are ``pai-zoo train`` on the same base (a Llama-architecture HF folder, random weights), the same data
(a generated corpus) and the same settings; each runs in a process of its own, so that its peak RSS is its own
(``ru_maxrss``). Step time is the median of the logged steps after the first. The ratios are LoRA / full; the
targets: peak memory well below full training's (the Adam state and gradients of the base are gone), step time at
most full training's (LoRA's backward still runs through every layer for the input gradients)::

    python bench/lora_bench.py [--hidden 1024 --layers 8 --ffn 2816 --vocab 32000 --seq 256 --steps 6 --rank 16]
"""
from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

CHILD = """
import resource, sys, time
from pai_zoo.cli import main
code = main(sys.argv[1:])
print("MAXRSS_KB", resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
sys.exit(code)
"""


def _side(argv: list[str], save: Path) -> tuple[float, float]:
    proc = subprocess.run([sys.executable, "-c", CHILD, *argv], capture_output=True, text=True,
                          env={**os.environ, "OMP_NUM_THREADS": "2"})
    if proc.returncode != 0:
        raise SystemExit(f"train failed:\n{proc.stderr[-3000:]}")
    rss = next(int(x.split()[1]) for x in proc.stdout.splitlines() if x.startswith("MAXRSS_KB"))
    times = [json.loads(x)["step_time"] for x in (save / "metrics.jsonl").read_text().splitlines()][1:]
    return rss / 1024, statistics.median(times)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=1024)
    p.add_argument("--layers", type=int, default=8)
    p.add_argument("--ffn", type=int, default=2816)
    p.add_argument("--vocab", type=int, default=32000)
    p.add_argument("--seq", type=int, default=256)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--rank", type=int, default=16)
    args = p.parse_args()

    import numpy as np

    import pai_zoo
    from pai_zoo.data import toy
    from pai_zoo.data.indexed import IndexedDatasetWriter

    root = Path(tempfile.mkdtemp(prefix="lora-bench-"))
    handle = pai_zoo.load("llama3-tiny", backend="hf", seed=0, hidden_size=args.hidden, num_hidden_layers=args.layers,
                          intermediate_size=args.ffn, vocab_size=args.vocab, num_attention_heads=16,
                          num_key_value_heads=4, max_position_embeddings=max(2048, args.seq))
    handle.model.save_pretrained(root / "base")
    toy.write_tokenizer(root / "base", vocab_size=args.vocab)
    parameters = sum(t.numel() for t in handle.model.parameters())
    del handle
    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(str(root / "data_text_document"), np.int32) as w:
        for _ in range(400):
            w.add_document(rng.integers(0, args.vocab, int(rng.integers(200, 1000))))
        w.finalize()
    common = ["train", "--model", str(root / "base"), "--data", str(root / "data_text_document"),
              "--global-batch-size", "4", "--batch-size", "2", "--seq-length", str(args.seq), "--train-iters",
              str(args.steps), "--warmup-iters", "1", "--save-interval", str(10 * args.steps), "--no-progress",
              "--lr", "1e-4", "--min-lr", "1e-5"]
    full_rss, full_step = _side([*common, "--save", str(root / "full")], root / "full")
    lora_rss, lora_step = _side([*common, "--save", str(root / "lora"), "--peft", "lora", "--lora-rank",
                                 str(args.rank), "--lora-alpha", str(2 * args.rank)], root / "lora")
    print(f"model: {parameters / 1e6:.0f}M parameters (hidden {args.hidden}, {args.layers} layers, FFN {args.ffn}, "
          f"vocabulary {args.vocab}), float32 on the CPU; sequence {args.seq}, global batch 4; LoRA rank {args.rank} "
          "on all linears")
    print(f"full fine-tuning: peak RSS {full_rss:,.0f} MiB, step {full_step:.2f} s")
    print(f"LoRA:             peak RSS {lora_rss:,.0f} MiB, step {lora_step:.2f} s")
    print(f"LoRA / full: memory {lora_rss / full_rss:.2f}x, step time {lora_step / full_step:.2f}x")


if __name__ == "__main__":
    main()
