"""The settings of one ``pai-zoo train`` run: names and defaults of the PAI continued-pretraining
recipe, read from a YAML file and/or flags, and checked before any work starts.

:data:`SETTINGS` is the one table of spellings: each field's pai-zoo flags (the first is the primary
spelling, shown first in ``--help``), Megatron-LM's flag for the same setting, and its meaning. The
flag parser (:mod:`pai_zoo.cli.train`) and the YAML reader both accept every spelling: a YAML key
is a field name or any of its flags without the dashes (``lr``, ``micro_batch_size``, ``data_path``,
``lr_warmup_iters``, ``no_save_optim``...).

The budget is given in tokens (``train_tokens``) or in steps (``train_iters``), the warm-up in tokens
(``warmup_tokens``), in steps (``warmup_iters``) or as a fraction of the run's steps
(``warmup_fraction``); giving two forms of one is an error. Without a warm-up setting the warm-up is
:data:`DEFAULT_WARMUP_FRACTION` of the run's steps (rounded down), so a short run never fails for
it; at the default budget of 50 steps that is the recipe's 5 steps (163,840 tokens).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..formats.peft_adapter import settings_from_peft_config
from ..lora.settings import LoraError, LoraSettings, parse_targets
from ..plugin.errors import PaiZooError, SettingError, no_such_path
from ..util.trackers import TrackerSettings
from ..util.yaml_settings import read_settings_yaml
from .settings import (
    DECAY_STYLES,
    DEFAULT_WARMUP_FRACTION,
    FORMS,
    RECOMPUTE_GRANULARITIES,
    RECOMPUTE_METHODS,
    SETTINGS,
    TRANSFORMER_IMPLS,
)


class TrainConfigError(PaiZooError):
    """Inconsistent or unknown training settings."""


def _key(name: str) -> str:
    """A flag or a YAML key in the field names' spelling: ``--lr-warmup-iters`` -> ``lr_warmup_iters``."""
    return str(name).lstrip("-").replace("-", "_")


def aliases() -> dict[str, tuple[str, bool]]:
    """Every accepted key (a field name, or a flag without its dashes) -> (field, whether it negates)."""
    table = {f.name: (f.name, False) for f in fields(TrainConfig)}
    for name, setting in SETTINGS.items():
        for flag in setting.all_flags:
            table.setdefault(_key(flag), (name, setting.switch is False))
    return table


@dataclass
class TrainConfig:
    """Everything a training run needs. Token budgets become steps by
    ``steps = tokens // (global_batch_size * sequence_length)``; :data:`SETTINGS` gives each field's
    flags, Megatron-LM's name and meaning (``docs/configuration.md`` is generated from both)."""

    model: str = ""
    revision: str | None = None
    data: list[str] = field(default_factory=list)
    save: str = ""
    batch_size: int = 1
    global_batch_size: int = 32
    learning_rate: float = 5e-5
    min_learning_rate: float = 5e-6
    lr_decay_style: str = "cosine"
    sequence_length: int = 1024
    pad_length: int = 128
    save_interval: int = 1000
    train_tokens: int = 1638400
    train_iters: int | None = None
    warmup_tokens: int | None = None
    warmup_iters: int | None = None
    warmup_fraction: float = DEFAULT_WARMUP_FRACTION
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0
    seed: int = 1234
    split: str = "99,1,0"
    eval_interval: int = 0
    eval_iters: int = 10
    log_interval: int = 1
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    context_parallel_size: int = 1
    virtual_pipeline_model_parallel_size: int | None = None
    expert_model_parallel_size: int = 1
    sequence_parallel: bool = False
    use_distributed_optimizer: bool = False
    overlap_grad_reduce: bool = False
    overlap_param_gather: bool = False
    recompute_granularity: str | None = None
    recompute_method: str | None = None
    recompute_num_layers: int | None = None
    bf16: bool = False
    recompute_activations: bool = False
    transformer_impl: str = "local"
    sft: bool = False
    progress: bool | None = None
    keep_last: int = 0
    save_optim: bool = True
    extend: bool = False
    tokenizer_mismatch_ok: bool = False
    force: bool = False
    mtp_num_layers: int | None = None
    mtp_loss_scaling_factor: float = 0.1
    peft: str | None = None
    lora_rank: int = 8
    lora_alpha: float = 16.0
    lora_dropout: float = 0.0
    lora_target_modules: str | None = None
    use_rslora: bool = False
    peft_init: str | None = None
    freeze_language_model: bool = False
    freeze_vision_model: bool = False
    freeze_vision_projection: bool = False
    tensorboard_dir: str | None = None  # TensorBoard and W&B (pai_zoo.util.trackers.TrackerSettings' fields)
    tensorboard_log_interval: int = 1
    wandb_project: str | None = None
    wandb_exp_name: str | None = None
    wandb_save_dir: str | None = None
    wandb_entity: str | None = None

    # ---- derived quantities -------------------------------------------------------------
    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.sequence_length

    @property
    def train_steps(self) -> int:
        """The run's optimizer steps: ``train_iters``, else ``train_tokens // tokens_per_step``."""
        if self.train_iters is not None:
            return self.train_iters
        return self.train_tokens // self.tokens_per_step

    @property
    def warmup_steps(self) -> int:
        """Steps of linear warm-up: ``warmup_iters``, else ``warmup_tokens // tokens_per_step``, else
        ``warmup_fraction`` of :attr:`train_steps`, rounded down."""
        if self.warmup_iters is not None:
            return self.warmup_iters
        if self.warmup_tokens is not None:
            return self.warmup_tokens // self.tokens_per_step
        return int(self.warmup_fraction * self.train_steps + 1e-9)

    def data_parallel_size(self, world_size: int) -> int:
        model_parallel = self.tensor_parallel_size * self.pipeline_parallel_size * self.context_parallel_size
        if world_size % model_parallel:
            cp = f" x context_parallel_size={self.context_parallel_size}" if self.context_parallel_size > 1 else ""
            raise TrainConfigError(
                f"{world_size} processes cannot hold tensor_parallel_size={self.tensor_parallel_size} x "
                f"pipeline_parallel_size={self.pipeline_parallel_size}{cp}")
        return world_size // model_parallel

    @property
    def recompute(self) -> str | None:
        """The recompute granularity in force: ``recompute_granularity``, else ``selective`` for
        ``recompute_activations`` (Megatron-LM's short form), else None."""
        return self.recompute_granularity or ("selective" if self.recompute_activations else None)

    def recompute_overrides(self, num_layers: int | None = None) -> dict[str, Any]:
        """The ``TransformerConfig`` fields of the recompute settings (megatron-core's recompute in
        ``TransformerBlock``); ``num_layers``: the model's, for block's default (every layer of a stage)."""
        granularity = self.recompute
        if granularity is None:
            return {}
        if granularity == "selective":
            return {"recompute_granularity": "selective"}
        method = self.recompute_method or "uniform"
        count = self.recompute_num_layers
        if count is None:
            count = 1 if method == "uniform" or num_layers is None else num_layers // (
                self.pipeline_parallel_size * (self.virtual_pipeline_model_parallel_size or 1))
        return {"recompute_granularity": "full", "recompute_method": method, "recompute_num_layers": count}

    def microbatches(self, world_size: int) -> int:
        """Gradient-accumulation steps per optimizer step."""
        return self.global_batch_size // (self.batch_size * self.data_parallel_size(world_size))

    def split_weights(self) -> list[float]:
        try:
            weights = [float(x) for x in self.split.replace("/", ",").split(",")]
        except ValueError:
            weights = []
        if len(weights) != 3 or any(w < 0 for w in weights) or weights[0] <= 0:
            raise TrainConfigError(f"split {self.split!r}: expected three non-negative weights 'train,valid,test' "
                                   "with train > 0, such as '99,1,0'")
        return weights

    def data_blend(self) -> tuple[list[str], list[float] | None]:
        """``data`` as Megatron's ``--data-path``: prefixes alone, or weight/prefix pairs."""
        items = [str(x) for x in self.data]
        if not items:
            raise TrainConfigError("no training data: give --data PREFIX (a preprocess output prefix)")
        def is_number(s):
            try:
                float(s)
                return True
            except ValueError:
                return False
        if not is_number(items[0]):
            return items, None
        if len(items) % 2 or not all(is_number(w) for w in items[0::2]):
            raise TrainConfigError(f"--data {' '.join(items)}: expected PREFIX... or WEIGHT PREFIX [WEIGHT PREFIX ...]")
        return items[1::2], [float(w) for w in items[0::2]]

    # ---- how the user spelled a setting --------------------------------------------------
    def given(self, name: str) -> str:
        """Setting ``name`` as the user gave it, for an error message: ``--lr-warmup-iters 20``,
        ``lr_warmup_iters: 20 (run.yaml)``, or ``warmup_fraction 0.1 (the default)``."""
        value = getattr(self, name)
        value = " ".join(map(str, value)) if isinstance(value, list) else value
        spelled = self.__dict__.get("_spelled", {}).get(name)
        if spelled is None:
            return f"{name} {value}" + (" (the default)" if value == _DEFAULTS.get(name) else "")
        key, where = spelled
        return f"{key} {value}" if key.startswith("--") else f"{key}: {value} ({where})"

    def _is_given(self, name: str) -> bool:
        return name in self.__dict__.get("_spelled", {}) or getattr(self, name) != _DEFAULTS.get(name)

    def _budget(self) -> str:
        if self.train_iters is not None:
            return self.given("train_iters")
        return f"{self.given('train_tokens')} / {self.tokens_per_step} tokens per step"

    # ---- checks -----------------------------------------------------------------------
    def check_required(self) -> None:
        """``--model`` and ``--save`` are given (flags or YAML)."""
        if not self.model:
            raise TrainConfigError("--model is required: the model to start from (a preset, a Hugging Face folder "
                                   "or a Megatron checkpoint), as a flag or `model:` in the YAML file")
        if not self.save:
            raise TrainConfigError("--save is required: the output folder (checkpoints, metrics.jsonl), as a flag "
                                   "or `save:` in the YAML file")

    def validate(self, world_size: int = 1, max_positions: int | None = None) -> None:
        """Raise :class:`TrainConfigError` for settings that cannot run, before any work starts."""
        self.check_settings(world_size, gpu=None)
        if max_positions is not None and self.sequence_length > max_positions:
            raise TrainConfigError(f"sequence_length {self.sequence_length} is longer than the model's "
                                   f"{max_positions} positions (max_position_embeddings)")

    def check_settings(self, world_size: int = 1, gpu: bool | None = True) -> None:
        """Every check that needs neither the model nor torch (``pai-zoo train`` runs it before anything is
        imported or loaded; :meth:`validate` adds the model's): ranges, forms, the batch arithmetic, the split, the
        data blend, the scale settings (``gpu`` as in :meth:`_check_scale`; True: assume GPUs, checked later)."""
        self.check_required()
        for what, group in FORMS.items():
            given = [name for name in group if self._is_given(name)]
            if len(given) > 1:
                raise TrainConfigError(f"{self.given(given[0])} and {self.given(given[1])} both give the {what}; "
                                       f"give one of {', '.join(SETTINGS[n].flags[0] for n in group)}")
        positive = ["batch_size", "global_batch_size", "sequence_length", "save_interval",
                    "tensor_parallel_size", "pipeline_parallel_size", "context_parallel_size",
                    "expert_model_parallel_size", "pad_length", "log_interval", "tensorboard_log_interval"]
        positive.append("train_tokens" if self.train_iters is None else "train_iters")
        for name in positive:
            if getattr(self, name) <= 0:
                raise TrainConfigError(f"{name} must be positive, not {getattr(self, name)} ({self.given(name)})")
        for name in ("warmup_tokens", "warmup_iters", "eval_interval", "eval_iters", "weight_decay", "clip_grad",
                     "keep_last", "mtp_num_layers", "mtp_loss_scaling_factor"):
            if getattr(self, name) is not None and getattr(self, name) < 0:
                raise TrainConfigError(f"{name} must not be negative, not {getattr(self, name)} ({self.given(name)})")
        if not 0 <= self.warmup_fraction < 1:
            raise TrainConfigError(f"{self.given('warmup_fraction')}: the warm-up fraction must be at least 0 and "
                                   "below 1 (the warm-up must end before the run does)")
        if self.lr_decay_style not in DECAY_STYLES:
            raise TrainConfigError(f"{self.given('lr_decay_style')}: unknown decay style; "
                                   f"expected {', '.join(DECAY_STYLES)}")
        if not self.learning_rate >= 0:  # not >=: NaN too (0 is a run that must not move the weights)
            raise TrainConfigError(f"{self.given('learning_rate')}: the learning rate must not be negative")
        if not 0 <= self.min_learning_rate <= self.learning_rate:
            raise TrainConfigError(f"{self.given('min_learning_rate')} must be between 0 and "
                                   f"{self.given('learning_rate')}")
        if not 0 <= self.seed < 2**32:
            raise TrainConfigError(f"{self.given('seed')}: must be a seed from 0 to 2**32 - 1")
        for name in ("adam_beta1", "adam_beta2"):
            if not 0 <= getattr(self, name) < 1:
                raise TrainConfigError(f"{self.given(name)}: must be at least 0 and below 1")
        if not self.adam_eps > 0:
            raise TrainConfigError(f"{self.given('adam_eps')}: must be positive")
        dp = self.data_parallel_size(world_size)
        if self.global_batch_size % (self.batch_size * dp):
            raise TrainConfigError(
                f"{self.given('global_batch_size')} is not divisible by batch_size {self.batch_size} x "
                f"data-parallel size {dp}")
        if self.train_steps == 0:
            raise TrainConfigError(
                f"{self.given('train_tokens')} is less than one step of global_batch_size x sequence_length = "
                f"{self.tokens_per_step} tokens: zero training steps; raise it or give --train-iters")
        warm, steps = self.warmup_steps, self.train_steps
        if warm >= steps and warm > 0:
            form = next((n for n in ("warmup_iters", "warmup_tokens") if getattr(self, n) is not None),
                        "warmup_fraction")
            what = self.given(form) + ("" if form == "warmup_iters" else f" ({warm} steps)")
            raise TrainConfigError(
                f"{what} {'exceeds' if warm > steps else 'is as long as'} the run's {steps} steps ({self._budget()}); "
                f"lower it below {steps} steps (or give --warmup-fraction), or lengthen the run")
        self._check_scale(dp, gpu=gpu)
        self.split_weights()
        self.data_blend()
        self.trackers().check()  # the tensorboard / wandb package a flag needs, before anything loads

    def _check_scale(self, dp: int, gpu: bool | None = None) -> None:
        """The scale settings (parallelism, distributed optimizer, recompute, implementation) that cannot
        work together, refused with the reason before any work; the checks that need the model are
        :meth:`check_model`. ``gpu``: whether the run has GPUs (default: whether this machine has; a plan
        is for GPUs)."""
        g = self.given
        choices = {"recompute_granularity": RECOMPUTE_GRANULARITIES, "recompute_method": RECOMPUTE_METHODS,
                   "transformer_impl": TRANSFORMER_IMPLS}
        for name, allowed in choices.items():
            value = getattr(self, name)
            if value is not None and value not in allowed:
                raise TrainConfigError(f"{g(name)}: unknown value; expected one of {', '.join(allowed)}")
        if self.sequence_parallel and self.tensor_parallel_size == 1:
            raise TrainConfigError(f"{g('sequence_parallel')} needs tensor_parallel_size > 1 (megatron-core splits "
                                   "the sequence over the tensor-parallel ranks; with one there is nothing to split); "
                                   "add --tp N or leave --sequence-parallel out")
        vpp = self.virtual_pipeline_model_parallel_size
        if vpp is not None:
            if vpp < 1:
                raise TrainConfigError(f"{g('virtual_pipeline_model_parallel_size')} must be positive")
            if vpp > 1 and self.pipeline_parallel_size == 1:
                raise TrainConfigError(f"{g('virtual_pipeline_model_parallel_size')} needs pipeline_parallel_size > 1 "
                                       "(the interleaved schedule splits each pipeline rank's layers into chunks)")
            micro, pp = self.global_batch_size // (self.batch_size * dp), self.pipeline_parallel_size
            if vpp > 1 and micro % pp:
                raise TrainConfigError(f"{g('virtual_pipeline_model_parallel_size')}: megatron-core's interleaved "
                                       f"schedule needs the micro-batches per step ({micro} = global batch "
                                       f"{self.global_batch_size} / (batch_size {self.batch_size} x data-parallel "
                                       f"{dp})) to be a multiple of pipeline_parallel_size {pp}")
        if self.overlap_param_gather and not self.use_distributed_optimizer:
            raise TrainConfigError(f"{g('overlap_param_gather')} needs --use-distributed-optimizer (the "
                                   "parameters it gathers are the distributed optimizer's shards)")
        if self.recompute_activations and self.recompute_granularity not in (None, "selective"):
            raise TrainConfigError(f"{g('recompute_activations')} (selective recompute) and "
                                   f"{g('recompute_granularity')} disagree; give one of them")
        if self.recompute != "full":
            for name in ("recompute_method", "recompute_num_layers"):
                if getattr(self, name) is not None:
                    raise TrainConfigError(f"{g(name)} applies to recompute_granularity full only; add "
                                           "--recompute-granularity full or leave it out")
        if self.recompute_num_layers is not None and self.recompute_num_layers < 1:
            raise TrainConfigError(f"{g('recompute_num_layers')} must be positive")
        self.check_implementation(gpu)
        ep = self.expert_model_parallel_size
        if ep > 1 and (dp * self.context_parallel_size) % ep:
            raise TrainConfigError(f"{g('expert_model_parallel_size')} must divide data-parallel x context-parallel "
                                   f"size {dp * self.context_parallel_size} (megatron-core carves the expert ranks "
                                   "out of them)")

    def trackers(self) -> TrackerSettings:
        """The run's TensorBoard and W&B settings."""
        return TrackerSettings.from_mapping(vars(self))

    def check_implementation(self, gpu: bool | None = None) -> None:
        """Context parallelism and Transformer Engine, refused where they cannot run (the CPU, the local spec)
        before anything else is checked; ``gpu`` as in :meth:`_check_scale`."""
        g = self.given
        te = self.transformer_impl == "transformer_engine"
        if self.context_parallel_size <= 1 and not te:
            return  # nothing to refuse, and no torch imported to look for a GPU
        has_gpu = _has_gpu() if gpu is None else gpu
        if self.context_parallel_size > 1 and not (te and has_gpu):
            why = "this machine has no GPU" if te else "the local layer spec's attention cannot split a sequence"
            raise TrainConfigError(f"{g('context_parallel_size')}: megatron-core's context parallelism needs "
                                   f"Transformer Engine's attention on GPUs ({why}); give --transformer-impl "
                                   "transformer_engine on a GPU machine, or leave --context-parallel-size out")
        if te and gpu is None:
            missing = "a GPU" if not has_gpu else ("Transformer Engine" if not _has_te() else None)
            if missing:
                raise TrainConfigError(f"{g('transformer_impl')} needs {missing} (install the gpu extra on a GPU "
                                       "machine: pip install -e '.[gpu]'); on the CPU use --transformer-impl local")

    def lora_settings(self):
        """The run's :class:`~pai_zoo.lora.settings.LoraSettings` (``--peft lora``; with ``--peft-init`` the PEFT
        folder's), or None for full training. A LoRA flag without ``--peft lora`` is refused."""
        lora_flags = ("lora_rank", "lora_alpha", "lora_dropout", "lora_target_modules", "use_rslora", "peft_init")
        if self.peft is None:
            given = [self.given(n) for n in lora_flags if self._is_given(n)]
            if given:
                raise TrainConfigError(f"{given[0]}: a LoRA setting without --peft lora (add --peft lora)")
            return None
        if self.peft != "lora":
            raise TrainConfigError(f"{self.given('peft')}: unknown method; pai-zoo trains --peft lora")
        if self.peft_init is not None:
            if not Path(self.peft_init).is_dir():
                raise no_such_path(self.peft_init, "the --peft-init PEFT adapter folder")
            try:
                init = settings_from_peft_config(self.peft_init)
            except LoraError as e:
                raise TrainConfigError(f"{self.given('peft_init')}: {e}") from None
            clash = [self.given(n) for n, v in (("lora_rank", init.rank), ("lora_alpha", init.alpha),
                                                  ("lora_dropout", init.dropout), ("use_rslora", init.use_rslora))
                     if n in self.__dict__.get("_spelled", {}) and getattr(self, n) != v]
            if clash:
                raise TrainConfigError(f"{clash[0]}: differs from {self.peft_init}'s adapter_config.json "
                                       f"(r={init.rank}, lora_alpha={init.alpha}, lora_dropout={init.dropout}, "
                                       f"use_rslora={init.use_rslora}); leave it out with --peft-init")
            return init
        try:
            return LoraSettings(rank=self.lora_rank, alpha=self.lora_alpha, dropout=self.lora_dropout,
                                targets=parse_targets(self.lora_target_modules), use_rslora=self.use_rslora)
        except SettingError as e:
            name = str(e).split(" ")[1]
            field_name = {"rank": "lora_rank", "alpha": "lora_alpha", "dropout": "lora_dropout"}.get(name)
            raise TrainConfigError(f"{self.given(field_name) if field_name else 'lora'}: {e}") from None

    def check_mtp(self, model_layers: int) -> int:
        """The multi-token-prediction layers the run trains, for a model holding ``model_layers`` of them
        (``num_nextn_predict_layers``): all of them unless ``mtp_num_layers`` is 0 (none); any other count is
        refused, since adding untrained MTP layers to a model is not supported."""
        if self.mtp_num_layers is None:
            return model_layers
        if self.mtp_num_layers not in (0, model_layers):
            fix = (f"give {model_layers} to train them or 0 to leave them out" if model_layers
                   else "give 0 or leave the setting out")
            raise TrainConfigError(f"{self.given('mtp_num_layers')}: the model has {model_layers or 'no'} MTP "
                                   f"layer(s) (num_nextn_predict_layers); {fix} (adding new MTP layers is not "
                                   "supported)")
        return self.mtp_num_layers

    def check_model(self, num_layers: int, num_moe_experts: int | None = None) -> None:
        """The checks of :meth:`validate` that need the model: the virtual pipeline's layer split, the
        recompute layer count and the expert count."""
        g = self.given
        pp, vpp = self.pipeline_parallel_size, self.virtual_pipeline_model_parallel_size or 1
        if vpp > 1 and num_layers % (pp * vpp):
            valid = [v for v in range(2, num_layers // pp + 1) if num_layers % (pp * v) == 0]
            raise TrainConfigError(f"{g('virtual_pipeline_model_parallel_size')}: the model's {num_layers} layers do "
                                   f"not divide into pipeline_parallel_size {pp} x {vpp} chunks; valid sizes: "
                                   f"{', '.join(map(str, valid)) or 'none for this pipeline size'}")
        if self.recompute == "full" and self.recompute_num_layers is not None:
            per_chunk = num_layers // (pp * vpp)
            if self.recompute_num_layers > per_chunk:
                raise TrainConfigError(f"{g('recompute_num_layers')} is more than the {per_chunk} layers of each "
                                       "pipeline chunk")
        if num_moe_experts and self.tensor_parallel_size > 1 and not self.sequence_parallel:
            raise TrainConfigError(f"{g('tensor_parallel_size')} on a mixture of experts needs --sequence-parallel: "
                                   "megatron-core's MoE layer trains under tensor parallelism only with the sequence "
                                   "split over the ranks; add --sequence-parallel")
        ep = self.expert_model_parallel_size
        if ep > 1 and (not num_moe_experts or num_moe_experts % ep):
            what = f"its {num_moe_experts} experts" if num_moe_experts else "no experts (not a MoE model)"
            raise TrainConfigError(f"{g('expert_model_parallel_size')}: the model has {what}, which do not split "
                                   f"over {ep} expert-parallel ranks")

    # ---- reading ----------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: dict[str, Any], where: str = "settings") -> TrainConfig:
        """Settings from one mapping whose keys are field names, flags (``--lr``) or flags without their
        dashes (``lr``, ``micro_batch_size``); see :data:`SETTINGS`."""
        return cls._build(_resolve(values, where))

    @classmethod
    def load(cls, path=None, overrides: dict[str, Any] | None = None) -> TrainConfig:
        """Settings from a YAML file (optional) with ``overrides`` (flags; None values are left out) on top.
        A flag of one form of the budget or warm-up replaces the file's other forms of it."""
        given = {}
        if path is not None:
            values = read_settings_yaml(path, TrainConfigError, "the YAML file of training settings")
            given = _resolve(values, str(path))
        flags = _resolve({k: v for k, v in (overrides or {}).items() if v is not None}, "flags")
        for name in flags:
            for group in FORMS.values():
                if name in group:
                    for other in group:
                        given.pop(other, None)
        return cls._build({**given, **flags})

    @classmethod
    def _build(cls, values: dict[str, tuple[Any, str, str]]) -> TrainConfig:
        config = cls()
        for name, (value, _, _) in values.items():
            setattr(config, name, value)
        config._spelled = {name: (key, where) for name, (_, key, where) in values.items()}
        return config

    def to_dict(self) -> dict[str, Any]:
        """The fields, with ``train_tokens`` and ``warmup_tokens`` the run's budget and warm-up in tokens
        whatever form they were given in (so a resumed run compares them as numbers)."""
        values = dataclasses.asdict(self)
        if self.train_iters is not None:
            values["train_tokens"] = self.train_steps * self.tokens_per_step
        if self.warmup_tokens is None:
            values["warmup_tokens"] = self.warmup_steps * self.tokens_per_step
        return values


def _has_gpu() -> bool:
    import torch

    return torch.cuda.is_available()


def _has_te() -> bool:
    import importlib.util

    return importlib.util.find_spec("transformer_engine") is not None


_DEFAULTS = {f.name: f.default for f in fields(TrainConfig) if f.default is not dataclasses.MISSING}


def _resolve(values: dict[str, Any], where: str) -> dict[str, tuple[Any, str, str]]:
    """``{key: value}`` in any spelling -> ``{field: (coerced value, key as given, where)}``."""
    table = aliases()
    known = {f.name: f for f in fields(TrainConfig)}
    out: dict[str, tuple[Any, str, str]] = {}
    unknown = []
    at = "" if where == "flags" else f"{where}: "
    for key, value in values.items():
        key = str(key)
        if _key(key) not in table:
            unknown.append(key)
            continue
        name, negated = table[_key(key)]
        if name in out and out[name][1] != key:
            raise TrainConfigError(f"{at}{out[name][1]} and {key} both set {name}; give one of them")
        value = _coerce(known[name], value, where, key)
        out[name] = (not value if negated and value is not None else value, key, where)
    if unknown:
        raise TrainConfigError(
            f"{at}unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))} "
            "(or a flag's name, such as lr, micro_batch_size or data_path: see docs/configuration.md)"
        )
    for what, group in FORMS.items():
        both = [key for name, (_, key, _) in out.items() if name in group]
        if len(both) > 1:
            raise TrainConfigError(f"{at}{both[0]} and {both[1]} both give the {what}; give one of them")
    return out


def _coerce(f: dataclasses.Field, value: Any, where: str, key: str | None = None) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    optional = kind.endswith("| None")
    kind = kind.split("|")[0].strip()
    key = key or f.name
    try:
        if value is None and optional:
            return None
        if kind.startswith("list"):
            return [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value).split()
        if kind == "bool":
            if isinstance(value, bool):
                return value
            if str(value).lower() in ("1", "true", "yes", "on"):
                return True
            if str(value).lower() in ("0", "false", "no", "off"):
                return False
            raise ValueError(value)
        if kind == "int":
            number = float(value)
            if number != int(number):
                raise ValueError(value)
            return int(number)
        if kind == "float":
            return float(value)
        return str(value)
    except (TypeError, ValueError, OverflowError):
        if key.startswith("--"):
            raise TrainConfigError(f"{key} {value}: not a valid {kind}") from None
        raise TrainConfigError(f"{where}: {key} = {value!r} is not a valid {kind}") from None
