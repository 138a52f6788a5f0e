"""The one table of ``pai-zoo train``'s spellings (:data:`SETTINGS`): each setting's pai-zoo flags (the first is the
primary spelling, shown first in ``--help``), Megatron-LM's flag for the same setting, and its meaning; with the
choices some settings take. :mod:`pai_zoo.training.config` reads YAML keys and flags through it."""
from __future__ import annotations

from dataclasses import dataclass

from ..util.trackers import TRACKER_FLAGS

#: The warm-up as a fraction of the run's steps when no warm-up setting is given (Megatron-LM's
#: ``--lr-warmup-fraction``): the PAI recipe's 163,840 of 1,638,400 tokens.
DEFAULT_WARMUP_FRACTION = 0.1

#: ``lr_decay_style``'s choices (styles of megatron-core's ``OptimizerParamScheduler``)
DECAY_STYLES = ("cosine", "linear", "constant")

#: ``recompute_granularity``'s, ``recompute_method``'s and ``transformer_impl``'s choices (Megatron-LM's)
RECOMPUTE_GRANULARITIES = ("selective", "full")
RECOMPUTE_METHODS = ("uniform", "block")
TRANSFORMER_IMPLS = ("local", "transformer_engine")

#: Settings given in more than one form, and what they set: at most one form of each may be given.
FORMS = {"budget": ("train_tokens", "train_iters"), "warm-up": ("warmup_tokens", "warmup_iters", "warmup_fraction")}


@dataclass(frozen=True)
class Setting:
    """How one :class:`TrainConfig` field is spelled, and what it means."""

    flags: tuple[str, ...]       #: pai-zoo's flags, the primary one first
    help: str                    #: its meaning (``--help`` and ``docs/configuration.md``)
    megatron: str | None = None  #: Megatron-LM's flag for the same setting (also accepted), if it has one
    switch: bool | None = None   #: a flag without a value: the value it sets (False for a ``--no-...`` flag)

    @property
    def all_flags(self) -> tuple[str, ...]:
        """pai-zoo's flags, then Megatron-LM's where it is another spelling."""
        return self.flags + ((self.megatron,) if self.megatron and self.megatron not in self.flags else ())


def _s(*flags: str, help: str, megatron: str | None = None, switch: bool | None = None) -> Setting:
    return Setting(tuple(flags), help, megatron, switch)


#: TrainConfig field -> its spellings and meaning; every field has one (tests/test_configuration_docs.py).
SETTINGS: dict[str, Setting] = {
    "model": _s("--model", megatron="--load",
                help="the model to start from: a preset, a Hugging Face folder or Hub id (org/name) or a "
                     "Megatron checkpoint (pai-zoo's or Megatron-LM's); required"),
    "revision": _s("--revision", help="when --model is a Hugging Face Hub id: the branch, tag or commit to read "
                                      "(default: the default branch; docs/hub.md)"),
    "data": _s("--data", megatron="--data-path",
               help="PREFIX (preprocess output) or WEIGHT PREFIX WEIGHT PREFIX ... to blend"),
    "save": _s("--save", megatron="--save",
               help="output folder: checkpoints, metrics.jsonl; rerun the same command to resume; required"),
    "batch_size": _s("--batch-size", megatron="--micro-batch-size",
                     help="samples per data-parallel rank per micro-step"),
    "global_batch_size": _s("--global-batch-size", megatron="--global-batch-size",
                            help="samples per optimizer step across all ranks"),
    "learning_rate": _s("--learning-rate", megatron="--lr", help="peak learning rate"),
    "min_learning_rate": _s("--min-learning-rate", megatron="--min-lr",
                            help="the learning rate at the end of the decay"),
    "lr_decay_style": _s("--lr-decay-style", megatron="--lr-decay-style",
                         help="the decay after the warm-up: " + ", ".join(DECAY_STYLES)),
    "sequence_length": _s("--sequence-length", megatron="--seq-length", help="tokens per sample"),
    "pad_length": _s("--pad-length", help="SFT: pad each sequence up to a multiple of this"),
    "save_interval": _s("--save-interval", megatron="--save-interval", help="steps between checkpoints"),
    "train_tokens": _s("--train-tokens", help="the budget in tokens (steps = tokens // (global batch x "
                                              "sequence length)), unless train_iters is given"),
    "train_iters": _s("--train-iters", megatron="--train-iters",
                      help="the budget in optimizer steps, instead of train_tokens"),
    "warmup_tokens": _s("--warmup-tokens", help="tokens of linear warm-up, instead of warmup_fraction"),
    "warmup_iters": _s("--warmup-iters", megatron="--lr-warmup-iters",
                       help="steps of linear warm-up, instead of warmup_fraction"),
    "warmup_fraction": _s("--warmup-fraction", megatron="--lr-warmup-fraction",
                          help="the warm-up as a fraction of the run's steps (rounded down), unless warmup_tokens "
                               "or warmup_iters is given"),
    "weight_decay": _s("--weight-decay", megatron="--weight-decay", help="AdamW weight decay"),
    "adam_beta1": _s("--adam-beta1", megatron="--adam-beta1", help="AdamW beta1"),
    "adam_beta2": _s("--adam-beta2", megatron="--adam-beta2", help="AdamW beta2"),
    "adam_eps": _s("--adam-eps", megatron="--adam-eps", help="AdamW epsilon"),
    "clip_grad": _s("--clip-grad", megatron="--clip-grad", help="max global gradient norm (0 disables clipping)"),
    "seed": _s("--seed", megatron="--seed", help="random seed (a preset's initialisation, the data order)"),
    "split": _s("--split", megatron="--split", help="train,validation,test weights of the documents"),
    "eval_interval": _s("--eval-interval", megatron="--eval-interval",
                        help="steps between evaluations (0: never)"),
    "eval_iters": _s("--eval-iters", megatron="--eval-iters", help="global batches per evaluation"),
    "log_interval": _s("--log-interval", megatron="--log-interval", help="steps between log lines"),
    "tensor_parallel_size": _s("--tensor-parallel-size", "--tp", megatron="--tensor-model-parallel-size",
                               help="tensor-parallel size (run under torchrun)"),
    "pipeline_parallel_size": _s("--pipeline-parallel-size", "--pp", megatron="--pipeline-model-parallel-size",
                                 help="pipeline-parallel size (run under torchrun)"),
    "bf16": _s("--bf16", megatron="--bf16", switch=True, help="bfloat16 parameters with fp32 main weights (GPU)"),
    "context_parallel_size": _s("--context-parallel-size", "--cp", megatron="--context-parallel-size",
                                help="context-parallel size: each sample's sequence split over this many ranks "
                                     "(needs transformer_impl transformer_engine on GPUs)"),
    "virtual_pipeline_model_parallel_size": _s(
        "--virtual-pipeline-model-parallel-size", "--vpp", megatron="--virtual-pipeline-model-parallel-size",
        help="model chunks per pipeline rank: megatron-core's interleaved pipeline schedule (the layers must "
             "divide by pipeline x virtual size)"),
    "expert_model_parallel_size": _s("--expert-model-parallel-size", "--ep", megatron="--expert-model-parallel-size",
                                     help="expert-parallel size: the MoE experts split over this many ranks"),
    "sequence_parallel": _s("--sequence-parallel", megatron="--sequence-parallel", switch=True,
                            help="megatron-core's sequence parallelism: norms, dropout and activations outside "
                                 "the tensor-parallel layers split along the sequence (needs tensor_parallel_size "
                                 "> 1)"),
    "use_distributed_optimizer": _s(
        "--use-distributed-optimizer", megatron="--use-distributed-optimizer", switch=True,
        help="megatron-core's distributed optimizer: fp32 main weights and Adam states sharded over the "
             "data-parallel ranks"),
    "overlap_grad_reduce": _s("--overlap-grad-reduce", megatron="--overlap-grad-reduce", switch=True,
                              help="overlap the data-parallel gradient reduction with the backward pass"),
    "overlap_param_gather": _s("--overlap-param-gather", megatron="--overlap-param-gather", switch=True,
                               help="overlap the distributed optimizer's parameter all-gather with the next "
                                    "forward pass (needs use_distributed_optimizer)"),
    "recompute_granularity": _s(
        "--recompute-granularity", megatron="--recompute-granularity",
        help="activation recompute in the backward pass: " + ", ".join(RECOMPUTE_GRANULARITIES)
             + " (selective: the core attention; full: whole layers, see recompute_method)"),
    "recompute_method": _s("--recompute-method", megatron="--recompute-method",
                           help="with full recompute: " + ", ".join(RECOMPUTE_METHODS) + " (uniform: groups of "
                                "recompute_num_layers layers; block: the first recompute_num_layers layers of "
                                "each pipeline stage)"),
    "recompute_num_layers": _s("--recompute-num-layers", megatron="--recompute-num-layers",
                               help="with full recompute: the layers per group (uniform) or per stage (block); "
                                    "default 1 (uniform) or all (block)"),
    "recompute_activations": _s(
        "--recompute-activations", megatron="--recompute-activations", switch=True,
        help="Megatron-LM's short form of recompute_granularity selective"),
    "transformer_impl": _s("--transformer-impl", megatron="--transformer-impl",
                           help="the layer implementation: " + ", ".join(TRANSFORMER_IMPLS) + " (megatron-core's "
                                "Transformer Engine spec: fused norm-linear and fused attention; a GPU with the "
                                "gpu extra, pip install -e '.[gpu]')"),
    "mtp_num_layers": _s("--mtp-num-layers", megatron="--mtp-num-layers",
                         help="multi-token-prediction layers to train: the model's own (DeepSeek-V3's and GLM-4.5's "
                              "num_nextn_predict_layers; the default) or 0 to leave them out"),
    "mtp_loss_scaling_factor": _s("--mtp-loss-scaling-factor", megatron="--mtp-loss-scaling-factor",
                                  help="weight of the MTP loss (averaged over the MTP layers) added to the LM loss; "
                                       "logged as mtp_1 loss, mtp_2 loss ..."),
    "peft": _s("--peft", help="parameter-efficient fine-tuning: lora (adapters on the decoder's linears, the base "
                              "frozen; the checkpoints hold the adapters and name the base by path and sha256)"),
    "lora_rank": _s("--lora-rank", help="with --peft lora: the adapters' rank (PEFT's r)"),
    "lora_alpha": _s("--lora-alpha", help="with --peft lora: alpha; the update is scaled by alpha / rank"),
    "lora_dropout": _s("--lora-dropout", help="with --peft lora: dropout on the adapters' input"),
    "lora_target_modules": _s("--lora-target-modules",
                              help="with --peft lora: comma-separated HF projection names (q_proj,v_proj) or "
                                   "megatron-core linears (linear_qkv,linear_proj,linear_fc1,linear_fc2); "
                                   "all-linear (the default) is all four"),
    "use_rslora": _s("--use-rslora", switch=True, help="with --peft lora: rank-stabilised scaling, alpha / sqrt(rank)"),
    "peft_init": _s("--peft-init", help="with --peft lora: start from this Hugging Face PEFT LoRA folder (its rank, "
                                        "alpha and targets) instead of fresh adapters"),
    "sft": _s("--sft", switch=True, help="SFT data from preprocess --sft: loss mask and document boundaries; on a "
                                         "vision-language model also a JSON Lines file of chats with images"),
    "freeze_language_model": _s("--freeze-language-model", megatron="--freeze-LM", switch=True,
                                help="vision-language model: train the vision tower and projector only"),
    "freeze_vision_model": _s("--freeze-vision-model", megatron="--freeze-ViT", switch=True,
                              help="vision-language model: keep the vision encoder (the tower without its "
                                   "projector) fixed"),
    "freeze_vision_projection": _s("--freeze-vision-projection", switch=True,
                                   help="vision-language model: keep the projector (Qwen's patch merger) fixed"),
    "progress": _s("--no-progress", switch=False,
                   help="a progress bar (default: on a terminal); --no-progress prints plain log lines"),
    "keep_last": _s("--keep-last", help="keep only the newest N checkpoints (0: keep all)"),
    "save_optim": _s("--no-save-optim", megatron="--no-save-optim", switch=False,
                     help="save the optimizer state with each checkpoint; --no-save-optim saves the weights only"),
    "extend": _s("--extend", switch=True, help="continue a finished run to a larger budget"),
    "tokenizer_mismatch_ok": _s("--tokenizer-mismatch-ok", switch=True,
                                help="go on with a model whose tokenizer does not fit its config (another model's "
                                     "vocabulary or special-token ids), which is refused otherwise"),
    "force": _s("--force", switch=True, help="train into a --save folder that holds files other than a pai-zoo "
                                             "run (they are kept)"),
    # TensorBoard and W&B (pai_zoo.util.trackers): Megatron-LM's flags, the same spelling in both
    **{name: _s(flag, megatron=flag, help=text) for name, (flag, text) in TRACKER_FLAGS.items()},
}
