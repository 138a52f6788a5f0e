"""Step time of ``pai-zoo train`` against a bare megatron-core training loop (target ratio <= 1.05).

Both run in this process over the same model (a Llama-architecture GPTModel, same weights), the
same data (megatron's GPTDataset over a generated corpus) and the same layout (one process on
the CPU; on a GPU, bf16). The bare loop is what a user writes by hand with megatron-core's own
pieces: DistributedDataParallel, get_megatron_optimizer, OptimizerParamScheduler,
get_forward_backward_func. Steps are timed in interleaved rounds; medians are reported.

    python bench/train_bench.py [--hidden 512 --layers 4 --seq 512 --global-batch 8 --steps 5 --rounds 3]

GPU mode (``--gpu``, on a machine with ``pip install -e ".[gpu]"``: Transformer Engine): Llama-3-8B's layer shape
(hidden 4096, 32 heads, 8 key/value groups, FFN 14336, vocabulary 128256) in bf16 with megatron-core's Transformer
Engine spec (``transformer_impl: transformer_engine``), sequence 4096, micro-batch 1; ``--layers`` of its 32 layers
(default 8: both models and their Adam states, 18 bytes a parameter each, fit one 80 GB GPU). It reports
tokens/s/GPU, MFU (6N + attention FLOPs over the GPU's bf16 peak) and the ratio to the bare loop over the same
model and data; the targets are ratio <= 1.02 and MFU >= 45% on an H100/H200-class GPU::

    python bench/train_bench.py --gpu                 # one command; add --layers 16 on a GPU with 141 GB
"""
from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
import time
from functools import partial

import numpy as np
import torch


def write_corpus(prefix: str, vocab: int, tokens: int) -> None:
    from pai_zoo.data.indexed import IndexedDatasetWriter

    rng = np.random.default_rng(0)
    with IndexedDatasetWriter(prefix, np.int32) as w:
        done = 0
        while done < tokens:
            n = int(rng.integers(200, 2000))
            w.add_document(rng.integers(0, vocab, n))
            done += n
        w.finalize()


def bare_loop(trainer, steps_done: int):
    """A hand-written megatron-core loop over the trainer's model, dataset and schedule."""
    from megatron.core.distributed import DistributedDataParallel, DistributedDataParallelConfig, finalize_model_grads
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.optimizer_param_scheduler import OptimizerParamScheduler
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from pai_zoo.mcore.build import build_gpt_model, mask_padded_vocab

    cfg = trainer.cfg
    from pai_zoo.training.trainer import model_overrides

    model = build_gpt_model(trainer.family, trainer.mcore_config, trainer.dtype, parallel_output=True,
                            transformer_impl=cfg.transformer_impl,
                            **model_overrides(cfg, trainer.mcore_config.num_layers))
    model.load_state_dict(trainer.model.state_dict())
    mask_padded_vocab(model, trainer.mcore_config["vocab_size"])  # part of the model: the real vocabulary's softmax
    if torch.cuda.is_available():
        model.cuda()
    ddp = DistributedDataParallel(model.config, DistributedDataParallelConfig(grad_reduce_in_fp32=True), model)
    opt = get_megatron_optimizer(OptimizerConfig(optimizer="adam", lr=cfg.learning_rate, min_lr=cfg.min_learning_rate,
                                                 weight_decay=cfg.weight_decay, clip_grad=cfg.clip_grad,
                                                 bf16=cfg.bf16, params_dtype=trainer.dtype), [ddp])
    sched = OptimizerParamScheduler(opt, 0.0, cfg.learning_rate, cfg.min_learning_rate, cfg.warmup_steps,
                                    cfg.train_steps, "cosine", cfg.weight_decay, cfg.weight_decay, cfg.train_steps,
                                    "constant")
    model.config.finalize_model_grads_func = finalize_model_grads
    dataset = trainer.train_batches.samples.dataset
    device = "cuda" if torch.cuda.is_available() else "cpu"
    causal = torch.ones(cfg.sequence_length, cfg.sequence_length, dtype=torch.bool, device=device).tril().logical_not()

    def batches(step):
        for m in range(trainer.microbatches):
            items = [dataset[step * cfg.global_batch_size + m * cfg.batch_size + k] for k in range(cfg.batch_size)]
            yield {
                k: torch.stack([it[k] for it in items]).to(device)
                for k in ("tokens", "labels", "loss_mask", "position_ids")
            }

    def loss_func(mask, output):
        loss = (output.float().view(-1) * mask.view(-1)).sum() / mask.sum()
        return loss, {"lm loss": loss.detach()}

    te = cfg.transformer_impl == "transformer_engine"

    def forward_step(it, m):
        b = next(it)
        mask = None if te else causal[None, None].expand(b["tokens"].shape[0], 1, -1, -1)  # TE: causal by type
        out = m(b["tokens"], b["position_ids"], mask, labels=b["labels"])
        return out, partial(loss_func, b["loss_mask"])

    def step(i):
        ddp.zero_grad_buffer()
        opt.zero_grad()
        get_forward_backward_func()(forward_step_func=forward_step, data_iterator=batches(i), model=[ddp],
                                    num_microbatches=trainer.microbatches, seq_length=cfg.sequence_length,
                                    micro_batch_size=cfg.batch_size, forward_only=False)
        opt.step()
        sched.step(1)

    return step


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--hidden", type=int, default=512)
    parser.add_argument("--layers", type=int, default=4)
    parser.add_argument("--seq", type=int, default=512)
    parser.add_argument("--global-batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=4, help="timed steps per round and side")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--gpu", action="store_true",
                        help="GPU mode: Llama-3-8B's layer shape, bf16, Transformer Engine, sequence 4096")
    args, given = parser.parse_args(), {a.lstrip("-").split("=")[0].replace("-", "_") for a in sys.argv[1:]}
    torch.set_num_threads(args.threads)

    from pai_zoo.training.config import TrainConfig
    from pai_zoo.training.trainer import Trainer

    gpu = torch.cuda.is_available()
    if args.gpu and not gpu:
        raise SystemExit("--gpu: no GPU here (GPU mode needs CUDA and the gpu extra: pip install -e '.[gpu]')")
    hidden = args.hidden if not gpu else 4096
    layers = args.layers if not gpu or "layers" in given else 8
    seq = args.seq if not gpu or "seq" in given else 4096
    with tempfile.TemporaryDirectory() as tmp:
        vocab = 32000 if not gpu else 128256
        write_corpus(f"{tmp}/corpus", vocab, args.global_batch * seq * (args.steps * args.rounds + 4) * 2)
        overrides = dict(
            vocab_size=vocab,
            hidden_size=hidden,
            num_hidden_layers=layers,
            intermediate_size=hidden * 3 if not gpu else 14336,
            num_attention_heads=8 if not gpu else 32,
            num_key_value_heads=4 if not gpu else 8,
            max_position_embeddings=max(seq, 2048),
        )
        from pai_zoo.families.registry import get_registry

        family, preset = get_registry().preset("llama3-tiny")
        cfg = TrainConfig(
            model="llama3-tiny",
            data=[f"{tmp}/corpus"],
            save=f"{tmp}/run",
            global_batch_size=args.global_batch,
            batch_size=1,
            sequence_length=seq,
            train_tokens=args.global_batch * seq * (args.steps * args.rounds + 2),
            warmup_tokens=0,
            save_interval=10**9,
            bf16=gpu,
            progress=False,
            transformer_impl="transformer_engine" if args.gpu else "local",
            recompute_granularity="selective" if args.gpu else None,
        )
        trainer = Trainer(cfg, echo=lambda *a: None)
        # The model comes from the preset with the benchmark's sizes (random weights).
        from pai_zoo.models.handle import Source

        trainer._source = lambda: Source(family, {**preset, **overrides})
        trainer.setup()
        bare_step = bare_loop(trainer, 0)
        n_params = sum(p.numel() for p in trainer.model.parameters())
        ours, bare = [], []
        step_no = 0
        trainer.train_step(step_no)  # warm-up both sides
        bare_step(step_no)
        step_no += 1
        for _ in range(args.rounds):
            for side in ("ours", "bare"):
                start = time.perf_counter()
                for k in range(args.steps):
                    (trainer.train_step if side == "ours" else bare_step)(step_no + k)
                if gpu:
                    torch.cuda.synchronize()
                (ours if side == "ours" else bare).append((time.perf_counter() - start) / args.steps)
            step_no += args.steps
        o, b = statistics.median(ours), statistics.median(bare)
        tokens = args.global_batch * seq
        print(
            f"model: Llama architecture, {n_params / 1e6:.1f}M parameters, hidden {hidden}, {layers} layers, "
            f"sequence {seq}, global batch {args.global_batch}, "
            f"{'GPU bf16' if gpu else f'CPU fp32, {args.threads} threads'}"
        )
        print(
            f"pai-zoo train step: median {o:.3f} s ({tokens / o:,.0f} tokens/s); rounds {[round(x, 3) for x in ours]}"
        )
        print(
            f"bare megatron-core: median {b:.3f} s ({tokens / b:,.0f} tokens/s); rounds {[round(x, 3) for x in bare]}"
        )
        print(f"ratio pai-zoo / bare = {o / b:.3f} (target <= {1.02 if args.gpu else 1.05})")
        if gpu:
            print(f"tokens/s/GPU: pai-zoo {tokens / o:,.0f}, bare {tokens / b:,.0f} ({cfg.transformer_impl})")
            from pai_zoo.mcore.flops import model_flops_per_token, peak_flops

            peak = peak_flops(torch.cuda.get_device_name(), torch.bfloat16)
            if peak:
                print(f"MFU: {tokens / o * model_flops_per_token(trainer.mcore_config, seq) / peak:.1%} on "
                      f"{torch.cuda.get_device_name()} (target >= 45% in --gpu mode)")


if __name__ == "__main__":
    main()
