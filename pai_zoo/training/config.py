"""The settings of one ``pai-zoo train`` run: names and defaults of the PAI continued-pretraining
recipe, read from a YAML file and/or flags, and checked before any work starts."""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field, fields
from pathlib import Path
from typing import Any

from ..errors import PaiZooError, no_such_path


class TrainConfigError(PaiZooError):
    """Inconsistent or unknown training settings."""


@dataclass
class TrainConfig:
    """Everything a training run needs. Token budgets become steps by
    ``steps = tokens // (global_batch_size * sequence_length)``."""

    model: str = ""                 #: preset, Hugging Face folder or Megatron-Core checkpoint
    data: list[str] = field(default_factory=list)  #: ``PREFIX`` or ``WEIGHT PREFIX WEIGHT PREFIX ...``
    save: str = ""                  #: output folder (checkpoints, metrics.jsonl)
    batch_size: int = 1             #: samples per data-parallel rank per micro-step
    global_batch_size: int = 32     #: samples per optimizer step across all ranks
    learning_rate: float = 5e-5     #: peak learning rate
    min_learning_rate: float = 5e-6  #: floor of the cosine decay
    sequence_length: int = 1024     #: tokens per sample
    pad_length: int = 128           #: SFT: pad each sequence up to a multiple of this
    save_interval: int = 1000       #: steps between checkpoints
    train_tokens: int = 1638400     #: total tokens
    warmup_tokens: int = 163840     #: tokens of linear warm-up
    weight_decay: float = 0.1
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_eps: float = 1e-8
    clip_grad: float = 1.0          #: max global gradient norm (0 disables clipping)
    seed: int = 1234
    split: str = "99,1,0"           #: train,validation,test weights of the documents
    eval_interval: int = 0          #: steps between evaluations (0: never)
    eval_iters: int = 10            #: global batches per evaluation
    log_interval: int = 1           #: steps between log lines
    tensor_parallel_size: int = 1
    pipeline_parallel_size: int = 1
    bf16: bool = False              #: bfloat16 parameters with fp32 main weights (GPU)
    sft: bool = False               #: SFT data: loss mask and document boundaries from preprocess --sft
    progress: bool | None = None    #: progress bar (default: on a terminal)
    keep_last: int = 0              #: keep only the newest N checkpoints (0: keep all)
    save_optim: bool = True         #: save the optimizer state with each checkpoint (False: weights only)
    extend: bool = False            #: continue a finished run to a larger train_tokens budget

    # ---- derived quantities -------------------------------------------------------------
    @property
    def tokens_per_step(self) -> int:
        return self.global_batch_size * self.sequence_length

    @property
    def train_steps(self) -> int:
        return self.train_tokens // self.tokens_per_step

    @property
    def warmup_steps(self) -> int:
        return self.warmup_tokens // self.tokens_per_step

    def data_parallel_size(self, world_size: int) -> int:
        model_parallel = self.tensor_parallel_size * self.pipeline_parallel_size
        if world_size % model_parallel:
            raise TrainConfigError(
                f"{world_size} processes cannot hold tensor_parallel_size={self.tensor_parallel_size} x "
                f"pipeline_parallel_size={self.pipeline_parallel_size}")
        return world_size // model_parallel

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

    # ---- checks -----------------------------------------------------------------------
    def validate(self, world_size: int = 1, max_positions: int | None = None) -> None:
        """Raise :class:`TrainConfigError` for settings that cannot run, before any work starts."""
        if not self.model:
            raise TrainConfigError(
                "no model: give --model (a preset, a Hugging Face folder or a Megatron-Core checkpoint)"
            )
        if not self.save:
            raise TrainConfigError("no output folder: give --save DIR")
        positive = ("batch_size", "global_batch_size", "sequence_length", "save_interval", "train_tokens",
                    "tensor_parallel_size", "pipeline_parallel_size", "pad_length", "log_interval")
        for name in positive:
            if getattr(self, name) <= 0:
                raise TrainConfigError(f"{name} must be positive, not {getattr(self, name)}")
        for name in ("warmup_tokens", "eval_interval", "eval_iters", "weight_decay", "clip_grad", "keep_last"):
            if getattr(self, name) < 0:
                raise TrainConfigError(f"{name} must not be negative, not {getattr(self, name)}")
        if not 0 <= self.min_learning_rate <= self.learning_rate:
            raise TrainConfigError(f"min_learning_rate {self.min_learning_rate} must be between 0 and "
                                   f"learning_rate {self.learning_rate}")
        dp = self.data_parallel_size(world_size)
        if self.global_batch_size % (self.batch_size * dp):
            raise TrainConfigError(
                f"global_batch_size {self.global_batch_size} is not divisible by batch_size {self.batch_size} x "
                f"data-parallel size {dp}")
        if self.train_steps == 0:
            raise TrainConfigError(
                f"train_tokens {self.train_tokens} is less than one step of global_batch_size x sequence_length = "
                f"{self.tokens_per_step} tokens: zero training steps")
        if self.warmup_steps > self.train_steps:
            raise TrainConfigError(f"warmup_tokens {self.warmup_tokens} ({self.warmup_steps} steps) exceed "
                                   f"train_tokens {self.train_tokens} ({self.train_steps} steps)")
        if max_positions is not None and self.sequence_length > max_positions:
            raise TrainConfigError(f"sequence_length {self.sequence_length} is longer than the model's "
                                   f"{max_positions} positions (max_position_embeddings)")
        self.split_weights()
        self.data_blend()

    # ---- reading ----------------------------------------------------------------------
    @classmethod
    def from_mapping(cls, values: dict[str, Any], where: str = "settings") -> TrainConfig:
        known = {f.name: f for f in fields(cls)}
        unknown = sorted(set(values) - set(known))
        if unknown:
            raise TrainConfigError(
                f"{where}: unknown setting(s) {', '.join(unknown)}; known: {', '.join(sorted(known))}"
            )
        config = cls()
        for name, value in values.items():
            setattr(config, name, _coerce(known[name], value, where))
        return config

    @classmethod
    def load(cls, path=None, overrides: dict[str, Any] | None = None) -> TrainConfig:
        """Settings from a YAML file (optional) with ``overrides`` (flags) on top."""
        values: dict[str, Any] = {}
        if path is not None:
            values = _read_yaml(Path(path))
        values.update({k: v for k, v in (overrides or {}).items() if v is not None})
        return cls.from_mapping(values, str(path) if path else "flags")

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


def _read_yaml(path: Path) -> dict[str, Any]:
    import yaml

    try:
        values = yaml.safe_load(path.read_text())
    except FileNotFoundError:
        raise no_such_path(path, "the YAML file of training settings") from None
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f"{path}:{mark.line + 1}" if mark else str(path)
        raise TrainConfigError(f"{where}: not valid YAML ({getattr(e, 'problem', e)})") from None
    if values is None:
        return {}
    if not isinstance(values, dict):
        raise TrainConfigError(f"{path}: expected a mapping of settings, found {type(values).__name__}")
    return {str(k).replace("-", "_"): v for k, v in values.items()}


def _coerce(f: dataclasses.Field, value: Any, where: str) -> Any:
    kind = f.type if isinstance(f.type, str) else getattr(f.type, "__name__", str(f.type))
    try:
        if kind.startswith("list"):
            return [str(v) for v in value] if isinstance(value, (list, tuple)) else str(value).split()
        if kind.startswith("bool"):
            if value is None or isinstance(value, bool):
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
    except (TypeError, ValueError):
        raise TrainConfigError(f"{where}: {f.name} = {value!r} is not a valid {kind}") from None
