"""``make demo``: the main job, end to end, on the CPU with nothing downloaded.

1. a tiny Llama-family model (``llama3-tiny`` sizes, random weights) and a tokenizer trained
   on a generated corpus, saved as a Hugging Face folder;
2. the corpus preprocessed into a Megatron indexed dataset (``.bin``/``.idx``);
3. continued pretraining with ``pai-zoo train`` (megatron-core, one process): the loss falls;
4. the trained Megatron-Core checkpoint converted back to Hugging Face (logits verified);
5. a line of text generated from the converted model with transformers.
"""
from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from importlib.util import find_spec
from pathlib import Path

import pai_zoo
from pai_zoo.data import toy
from pai_zoo.data.preprocess import preprocess
from pai_zoo.tokenizers import load_tokenizer
from pai_zoo.training import TrainConfig, train
from pai_zoo.util.quiet import quiet_run

PROMPT = "the cat"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m pai_zoo.cli.demo", description=__doc__.splitlines()[0])
    parser.add_argument("--out", default="build/demo", help="folder for every artifact (replaced)")
    parser.add_argument("--steps", type=int, default=40, help="training steps")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party warnings and progress bars (else in OUT/mcore/pai-zoo.log)")
    args = parser.parse_args(argv)
    with quiet_run(verbose=args.verbose):  # as every pai-zoo command: library warnings to the run's log
        return run(args)


def run(args) -> int:
    import torch

    from pai_zoo.conversion.entry import convert

    torch.set_num_threads(min(2, torch.get_num_threads()))
    start = time.perf_counter()
    out = Path(args.out).resolve()
    shutil.rmtree(out, ignore_errors=True)
    out.mkdir(parents=True)

    hf_dir = out / "hf-start"
    toy.write_tokenizer(hf_dir, vocab_size=400)
    tokenizer = load_tokenizer(hf_dir)
    start_model = pai_zoo.load("llama3-tiny", backend="hf", seed=0, vocab_size=tokenizer.vocab_size)
    start_model.model.save_pretrained(hf_dir)
    print(f"[1/5] model: {hf_dir} (llama3-tiny sizes, "
          f"{sum(p.numel() for p in start_model.model.parameters()):,} parameters, random weights, "
          f"{tokenizer.vocab_size}-token BPE tokenizer)")

    corpus = toy.write_corpus(out / "corpus.jsonl", documents=600)
    (out / "data").mkdir()
    summary = preprocess([corpus], out / "data" / "corpus", str(hf_dir), append_eod=True, progress=False)
    print(f"[2/5] data: {out / 'data' / 'corpus_text_document'}.bin/.idx ({summary.line()})")

    seq, gbs = 64, 8
    cfg = TrainConfig(model=str(hf_dir), data=[str(out / "data" / "corpus_text_document")], save=str(out / "mcore"),
                      global_batch_size=gbs, batch_size=4, sequence_length=seq, train_tokens=args.steps * gbs * seq,
                      warmup_tokens=2 * gbs * seq, learning_rate=3e-3, min_learning_rate=3e-4,
                      save_interval=args.steps, log_interval=1, progress=False,
                      tensorboard_dir=str(out / "tensorboard") if find_spec("tensorboard") else None)
    print(f"[3/5] pai-zoo train: {cfg.train_steps} steps of {gbs} x {seq} tokens")
    def echo(line: str) -> None:  # every step goes to metrics.jsonl; show the first and every tenth
        step = int(line.split()[1].split("/")[0]) if line.startswith("step ") else 0
        if step in (0, 1) or step % 10 == 0:
            print("      " + line)

    last = train(cfg, echo=echo)
    records = [json.loads(line) for line in (out / "mcore" / "metrics.jsonl").read_text().splitlines()]
    first_loss, last_loss = records[0]["loss"], last["loss"]
    print(
        f"      checkpoint: {out / 'mcore'} (loss {first_loss:.3f} -> {last_loss:.3f}; "
        f"log {out / 'mcore' / 'metrics.jsonl'})"
    )
    if cfg.tensorboard_dir:
        print(f"      curves: tensorboard --logdir {cfg.tensorboard_dir}")

    report = convert(out / "mcore", out / "hf-trained", to="hf", verify=True, progress=False)
    v = report.verification
    print(f"[4/5] converted: {out / 'hf-trained'} (max |delta logits| vs megatron-core {v['max_abs_delta']:.2e})")

    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out / "hf-trained").eval()
    ids = torch.tensor([tokenizer.encode(PROMPT)])
    with torch.no_grad():
        generated = model.generate(ids, max_new_tokens=16, do_sample=False, pad_token_id=tokenizer.eod_id)
    text = tokenizer.decode(generated[0].tolist())
    print(f"[5/5] transformers generate from {out / 'hf-trained'}: {text!r}")
    ok = last_loss < 0.8 * first_loss and report.ok
    print(f"{'OK' if ok else 'FAILED'}: loss fell from {first_loss:.3f} to {last_loss:.3f}, conversion verified "
          f"({time.perf_counter() - start:.0f} s)")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
