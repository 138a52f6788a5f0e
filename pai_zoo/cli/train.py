"""``pai-zoo train [CONFIG.yaml] --model M --data PREFIX --save DIR``: continued pretraining or SFT.

Every flag is a :class:`~pai_zoo.training.config.TrainConfig` field; the help shows the field's
default. A flag overrides the YAML file, which overrides the defaults (so the flags' own defaults are None).
"""
from __future__ import annotations

from ..util.dist import is_rank0
from ._common import add_command, defaults

#: TrainConfig field -> (flag names, help without the default)
FLAGS = {
    "model": (("--model",), "preset, Hugging Face folder or Megatron-Core checkpoint"),
    "data": (("--data",), "PREFIX (preprocess output) or WEIGHT PREFIX WEIGHT PREFIX ... to blend"),
    "save": (("--save",), "output folder: checkpoints, metrics.jsonl; rerun to resume"),
    "batch_size": (("--batch-size", "--micro-batch-size"), "samples per data-parallel rank per micro-step"),
    "global_batch_size": (("--global-batch-size",), "samples per optimizer step across ranks"),
    "learning_rate": (("--learning-rate", "--lr"), "peak learning rate"),
    "min_learning_rate": (("--min-learning-rate", "--min-lr"), "floor of the cosine decay"),
    "sequence_length": (("--sequence-length", "--seq-length"), "tokens per sample"),
    "pad_length": (("--pad-length",), "SFT: pad sequences to a multiple of this"),
    "save_interval": (("--save-interval",), "steps between checkpoints"),
    "train_tokens": (("--train-tokens",), "total training tokens"),
    "warmup_tokens": (("--warmup-tokens",), "tokens of linear warm-up"),
    "weight_decay": (("--weight-decay",), "AdamW weight decay"),
    "adam_beta1": (("--adam-beta1",), "AdamW beta1"),
    "adam_beta2": (("--adam-beta2",), "AdamW beta2"),
    "adam_eps": (("--adam-eps",), "AdamW epsilon"),
    "clip_grad": (("--clip-grad",), "max gradient norm, 0 = off"),
    "seed": (("--seed",), "random seed"),
    "split": (("--split",), "train,valid,test document weights"),
    "eval_interval": (("--eval-interval",), "steps between evaluations, 0 = never"),
    "eval_iters": (("--eval-iters",), "global batches per evaluation"),
    "log_interval": (("--log-interval",), "steps between log lines"),
    "tensor_parallel_size": (("--tensor-parallel-size", "--tp"), "tensor-parallel size"),
    "pipeline_parallel_size": (("--pipeline-parallel-size", "--pp"), "pipeline-parallel size"),
}


def add_parser(subparsers) -> None:
    from ..training.config import TrainConfig

    default = defaults(TrainConfig)
    p = add_command(subparsers, "train",
                    "continued pretraining or SFT on Megatron-Core (torchrun for several processes)")
    p.add_argument("config", nargs="?", help="YAML file of settings (flags override it)")
    for name, (flags, text) in FLAGS.items():
        shown = f" (default: {default[name]})" if default.get(name) not in (None, "") else ""
        p.add_argument(*flags, dest=name, nargs="+" if name == "data" else None, help=text + shown)
    p.add_argument("--bf16", action="store_const", const=True, help="bfloat16 training (GPU)")
    p.add_argument("--sft", action="store_const", const=True,
                   help="SFT data from preprocess --sft (loss mask, boundaries)")
    p.add_argument("--no-progress", action="store_true", help="plain log lines instead of a progress bar")
    p.set_defaults(func=run)


def run(args) -> int:
    from ..training.config import TrainConfig
    from ..training.trainer import train

    overrides = {name: getattr(args, name) for name in FLAGS if getattr(args, name, None) is not None}
    overrides.update({flag: True for flag in ("bf16", "sft") if getattr(args, flag)})
    if args.no_progress:
        overrides["progress"] = False
    cfg = TrainConfig.load(args.config, overrides)
    last = train(cfg)
    if last and is_rank0():
        print(f"trained {cfg.model} -> {cfg.save}: step {last['step']}, loss {last['loss']:.4f}"
              + (f", eval loss {last['eval_loss']:.4f}" if "eval_loss" in last else ""))
    return 0
