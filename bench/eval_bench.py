"""Tokens per second of ``pai-zoo eval --tasks`` (megatron-core) against lm-eval's own HF model, on the same requests.

One process, one model: a Llama-architecture HF folder with random weights and the 32000-piece Llama-2-style tokenizer,
converted to Megatron-Core. A generated multiple-choice task (``--docs`` questions of 4 choices, one few-shot example)
and a greedy generation task (``--docs / 4`` prompts of ``--gen`` tokens) run through lm-eval's ``simple_evaluate``
twice: with :class:`pai_zoo.evaluation.harness.PaiZooLM` on the Megatron-Core checkpoint and with lm-eval's ``HFLM``
on the HF folder, same batch size. Tokens are the context and continuation tokens run through the model plus the
generated ones (counted by ``PaiZooLM``; both sides run the same requests). The ratio is pai-zoo / HF (target: >= 0.8;
both score with one full forward per batch and decode with a KV cache, and megatron-core's forward also copies the
logits out of its [sequence, batch] layout); the bench also checks that both give the same accuracy::

    python bench/eval_bench.py [--hidden 512 --layers 4 --docs 200 --gen 16 --batch 8 --threads 2]
"""
from __future__ import annotations

import argparse
import json
import random
import tempfile
import time
from pathlib import Path

WORDS = ("river town market boat grain timber valley spring water street people goods floor flood garden seed light "
         "sun cloud train honey paper glass mouse dog fish snake east west north south").split()


def _tasks(root: Path, docs: int, gen: int) -> Path:
    rng = random.Random(0)
    with open(root / "mc.jsonl", "w") as f:
        for _ in range(docs):
            question = " ".join(rng.choice(WORDS) for _ in range(rng.randint(8, 40)))
            choices = [" " + " ".join(rng.choice(WORDS) for _ in range(rng.randint(1, 6))) for _ in range(4)]
            f.write(json.dumps({"question": question, "choices": choices, "answer": rng.randrange(4)}) + "\n")
    with open(root / "gen.jsonl", "w") as f:
        for _ in range(max(1, docs // 4)):
            f.write(json.dumps({"prompt": " ".join(rng.choice(WORDS) for _ in range(20)), "target": "x"}) + "\n")
    (root / "bench_mc.yaml").write_text(
        f"task: bench_mc\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root}/mc.jsonl\n"
        "test_split: test\nfewshot_split: test\noutput_type: multiple_choice\ndoc_to_text: '{{question}}'\n"
        "doc_to_choice: '{{choices}}'\ndoc_to_target: '{{answer}}'\nmetric_list:\n  - metric: acc\n")
    (root / "bench_gen.yaml").write_text(
        f"task: bench_gen\ndataset_path: json\ndataset_kwargs:\n  data_files:\n    test: {root}/gen.jsonl\n"
        "test_split: test\noutput_type: generate_until\ndoc_to_text: '{{prompt}}'\ndoc_to_target: '{{target}}'\n"
        f"generation_kwargs:\n  until: ['<never>']\n  max_gen_toks: {gen}\n  do_sample: false\n"
        "metric_list:\n  - metric: exact_match\n")
    return root


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--hidden", type=int, default=512)
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--docs", type=int, default=200)
    p.add_argument("--gen", type=int, default=16)
    p.add_argument("--batch", type=int, default=8)
    p.add_argument("--threads", type=int, default=2)
    args = p.parse_args()

    import lm_eval
    import torch
    from lm_eval.tasks import TaskManager

    import pai_zoo
    from pai_zoo.cli import main as cli
    from pai_zoo.evaluation.harness import make_lm
    from pai_zoo.families.registry import get_registry

    torch.set_num_threads(args.threads)
    llama = get_registry().family("llama")
    with tempfile.TemporaryDirectory() as tmp:
        root = Path(tmp)
        hf = root / "hf"
        pai_zoo.load("llama3-tiny", backend="hf", hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4,
                     num_hidden_layers=args.layers, num_attention_heads=args.hidden // 64,
                     num_key_value_heads=max(1, args.hidden // 256), vocab_size=32000,
                     max_position_embeddings=2048).model.save_pretrained(hf)
        llama.published_tokenizer(hf)
        assert cli(["convert", str(hf), str(root / "mcore"), "--to", "mcore"]) == 0
        tasks = _tasks(root, args.docs, args.gen)
        names = ["bench_mc", "bench_gen"]
        ours = make_lm(pai_zoo.load(root / "mcore"), root / "mcore" / "hf", batch_size=args.batch)
        start = time.perf_counter()
        mine = lm_eval.simple_evaluate(model=ours, tasks=names, num_fewshot=1,
                                       task_manager=TaskManager(include_path=str(tasks)))
        ours_s = time.perf_counter() - start
        start = time.perf_counter()
        theirs = lm_eval.simple_evaluate(model="hf", model_args={"pretrained": str(hf), "dtype": "float32",
                                                                 "device": "cpu"},
                                         tasks=names, num_fewshot=1, task_manager=TaskManager(include_path=str(tasks)),
                                         batch_size=args.batch)
        hf_s = time.perf_counter() - start
    tokens = ours.tokens_scored
    same = mine["results"]["bench_mc"]["acc,none"] == theirs["results"]["bench_mc"]["acc,none"]
    print(json.dumps({"model": f"llama hidden {args.hidden} x {args.layers} layers, vocab 32000", "tokens": tokens,
                      "pai_zoo_tokens_per_s": round(tokens / ours_s, 1), "hf_tokens_per_s": round(tokens / hf_s, 1),
                      "ratio_pai_zoo_over_hf": round(hf_s / ours_s, 3), "pai_zoo_s": round(ours_s, 2),
                      "hf_s": round(hf_s, 2), "same_accuracy": same}, indent=2))


if __name__ == "__main__":
    main()
