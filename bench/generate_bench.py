"""Greedy generation speed: pai-zoo's megatron-core loop against transformers' ``generate``.

One Llama-architecture model with random weights (246M parameters by default), built
locally in float32; the same weights in both backends; the same process and thread count
(``torch.set_num_threads``). For batch 1 and batch 8 (prompts of different lengths, left
padded) it times ``--new-tokens`` greedy tokens (EOS off), checks that both backends produce the
same tokens, and prints tokens/s and the ratio (megatron-core / transformers; > 1 = faster) of the
median runs, of the best runs and of process CPU time (the backends alternate, the order swapped
every round). On a shared 2-core VM two identical transformers models measured this way differ by
up to 4% (0.96-1.04), so ratios within that band are a tie. pai-zoo's generation moves the
megatron-core weights into one arena before decoding (:mod:`pai_zoo.mcore.arena`);
``--arena-both`` does the same to transformers' weights, the control that separates that gain from
the rest of the code::

    OMP_NUM_THREADS=2 .venv/bin/python bench/generate_bench.py [--threads 2] [--new-tokens 32] [--repeats 5]
"""
from __future__ import annotations

import argparse
import statistics
import time


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=32)
    parser.add_argument("--prompt-tokens", type=int, default=32, help="longest prompt; the others are shorter")
    parser.add_argument("--batch-sizes", type=int, nargs="+", default=[1, 8])
    parser.add_argument("--repeats", type=int, default=5, help="timed runs per setting and backend")
    parser.add_argument("--hidden", type=int, default=1024)
    parser.add_argument("--layers", type=int, default=16)
    parser.add_argument("--vocab", type=int, default=32000)
    parser.add_argument("--arena-both", action="store_true",
                        help="control: also move transformers' weights into one arena (pai_zoo.mcore.arena), as "
                             "pai-zoo's generation does with its own")
    args = parser.parse_args(argv)

    import torch

    torch.set_num_threads(args.threads)
    import pai_zoo
    from pai_zoo.generation import generate
    from pai_zoo.models.state_dicts import hf_model_to_mcore

    shape = dict(hidden_size=args.hidden, intermediate_size=args.hidden * 11 // 4, num_hidden_layers=args.layers,
                 num_attention_heads=args.hidden // 64, num_key_value_heads=args.hidden // 256, head_dim=64,
                 vocab_size=args.vocab, max_position_embeddings=4096,
                 rope_parameters={"rope_type": "default", "rope_theta": 500000.0})
    hf = pai_zoo.load("llama3-tiny", backend="hf", **shape)
    mcore = pai_zoo.load("llama3-tiny", backend="mcore", **shape)
    hf_model_to_mcore(mcore.family, mcore.mcore_config, hf.model, mcore.model)
    if args.arena_both:
        from pai_zoo.mcore.arena import pack_parameters

        pack_parameters(hf.model)
    params = sum(p.numel() for p in hf.model.parameters())
    print(f"Llama-architecture model: {params / 1e6:.0f}M parameters, {args.layers} layers, hidden {args.hidden}, "
          f"float32, {torch.get_num_threads()} threads, {args.new_tokens} new tokens, greedy")

    gen = torch.Generator().manual_seed(0)
    results = {}
    for batch in args.batch_sizes:
        lengths = [args.prompt_tokens - (7 * i) % (args.prompt_tokens // 2) for i in range(batch)]
        prompts = [torch.randint(3, args.vocab, (n,), generator=gen).tolist() for n in lengths]
        walls, cpus, outputs = {"mcore": [], "hf": []}, {"mcore": [], "hf": []}, {}
        backends = [("mcore", mcore), ("hf", hf)]
        for _name, handle in backends:
            generate(handle, prompts, max_new_tokens=2, eos_token_id=[])  # warm-up
        for _ in range(args.repeats):  # interleaved, the order swapped each round: fair on a shared machine
            for name, handle in backends:
                start, start_cpu = time.perf_counter(), time.process_time()
                out = generate(handle, prompts, max_new_tokens=args.new_tokens, eos_token_id=[])
                walls[name].append(time.perf_counter() - start)
                cpus[name].append(time.process_time() - start_cpu)
                outputs[name] = [r.token_ids for r in out]
            backends.reverse()
        rate = {name: batch * args.new_tokens / statistics.median(t) for name, t in walls.items()}
        same = outputs["mcore"] == outputs["hf"]
        results[batch] = rate["mcore"] / rate["hf"]
        best = min(walls["hf"]) / min(walls["mcore"])
        cpu = statistics.median(cpus["hf"]) / statistics.median(cpus["mcore"])
        print(
            f"batch {batch} (prompts of {min(lengths)}-{max(lengths)} tokens): "
            f"megatron-core {rate['mcore']:.1f} tok/s, "
            f"transformers {rate['hf']:.1f} tok/s (medians of {args.repeats}), ratio {results[batch]:.2f} "
            f"(best runs {best:.2f}, CPU time {cpu:.2f}); same tokens: {same}"
        )
    print("ratio (megatron-core / transformers): " + ", ".join(f"batch {b}: {r:.2f}" for b, r in results.items()))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
