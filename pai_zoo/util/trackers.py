"""TensorBoard and Weights & Biases for every command that logs: ``pai-zoo train``, ``pai-zoo rl`` and ``pai-zoo eval``,
with Megatron-LM's flags (``--tensorboard-dir``, ``--tensorboard-log-interval``, ``--wandb-project``,
``--wandb-exp-name``, ``--wandb-save-dir``, ``--wandb-entity``) and scalar names (:func:`scalar_names`: ``lm loss``,
``learning-rate``, ``grad-norm``, ``iteration-time``, ``throughput``, ``batch-size``, ``lm loss validation`` ...).

Nothing here imports ``tensorboard`` or ``wandb`` until a flag asks for it (:meth:`TrackerSettings.check` says, in one
line, which package to install). One rank writes (:func:`is_writer_rank`): the last pipeline stage's first tensor-
and data-parallel rank, as Megatron-LM's last rank does. A resumed run appends at its step: the TensorBoard writer
purges the events a killed run wrote past the step it resumes from (``SummaryWriter(purge_step=)``, which
TensorBoard's reader applies), and W&B resumes the run whose id :data:`TRACKERS_FILE` in the run folder keeps
(``resume="allow"``) from the step after the checkpoint, as metrics.jsonl does (W&B keeps a run's steps increasing:
where it already holds a repeated step it keeps its first values, which pai-zoo's exact resume repeats). Each
TensorBoard log is flushed, so a killed run's curve reaches its last step (W&B's buffer may not survive a SIGKILL).
W&B runs offline with ``WANDB_MODE=offline`` (``wandb sync`` uploads the run folder later).
"""

from __future__ import annotations

import contextlib
import json
import math
import re
import secrets
import sys
from collections.abc import Iterator
from dataclasses import dataclass, fields
from pathlib import Path

from ..plugin.errors import SettingError
from .dist import rank
from .files import write_text_atomic

__all__ = ["TRACKERS_FILE", "TRACKER_FLAGS", "TrackerSettings", "Trackers", "add_tracker_arguments",
           "current_tracking", "is_writer_rank", "scalar_names", "tracking"]

#: the run folder's record of its W&B run (``{"wandb_run_id": ...}``), next to metrics.jsonl
TRACKERS_FILE = "trackers.json"

#: field -> (flag, help): Megatron-LM's flags, also the YAML keys (the field names, or the flags without dashes)
TRACKER_FLAGS = {
    "tensorboard_dir": ("--tensorboard-dir", "write TensorBoard event files into this folder (tensorboard --logdir "
                                             "DIR); needs the tensorboard package"),
    "tensorboard_log_interval": ("--tensorboard-log-interval", "steps between the TensorBoard and W&B scalars "
                                                               "(validation results are always logged)"),
    "wandb_project": ("--wandb-project", "log to this Weights & Biases project (WANDB_MODE=offline: to disk only); "
                                         "needs the wandb package"),
    "wandb_exp_name": ("--wandb-exp-name", "the W&B run's name"),
    "wandb_save_dir": ("--wandb-save-dir", "the folder of W&B's local files (default: SAVE/wandb)"),
    "wandb_entity": ("--wandb-entity", "the W&B entity (team or user) of the project"),
}


@dataclass
class TrackerSettings:
    """Which trackers a run logs to (all off by default); the fields are :data:`TRACKER_FLAGS`' names."""

    tensorboard_dir: str | None = None
    tensorboard_log_interval: int = 1
    wandb_project: str | None = None
    wandb_exp_name: str | None = None
    wandb_save_dir: str | None = None
    wandb_entity: str | None = None

    @classmethod
    def from_mapping(cls, values) -> TrackerSettings:
        """The tracker settings among ``values`` (an argparse namespace or a dict); the rest is ignored."""
        get = values.get if isinstance(values, dict) else (lambda k, d=None: getattr(values, k, d))
        out = cls()
        for f in fields(cls):
            value = get(f.name, None)
            if value not in (None, ""):
                setattr(out, f.name, int(value) if f.name == "tensorboard_log_interval" else str(value))
        return out

    @property
    def enabled(self) -> bool:
        return bool(self.tensorboard_dir or self.wandb_project)

    def check(self) -> None:
        """One line for a bad interval or a missing package, before anything loads."""
        if self.tensorboard_log_interval < 1:
            raise SettingError(f"--tensorboard-log-interval {self.tensorboard_log_interval}: must be at least 1")
        import importlib.util

        for flag, package, given in (("--tensorboard-dir", "tensorboard", self.tensorboard_dir),
                                     ("--wandb-project", "wandb", self.wandb_project)):
            if given and importlib.util.find_spec(package) is None:
                raise SettingError(f"{flag} needs the {package} package, which is not installed: pip install "
                                   f"{package} (or pip install 'pai-zoo[trackers]')")
        if self.tensorboard_dir and Path(self.tensorboard_dir).exists() and not Path(self.tensorboard_dir).is_dir():
            raise SettingError(f"--tensorboard-dir {self.tensorboard_dir}: a file, not a folder")


def add_tracker_arguments(parser, skip=()) -> None:
    """Add :data:`TRACKER_FLAGS` to an argparse parser (``dest``: the field names; ``skip``: fields it has)."""
    group = parser.add_argument_group("TensorBoard and Weights & Biases (Megatron-LM's flags)")
    for name, (flag, text) in TRACKER_FLAGS.items():
        if name in skip:
            continue
        kind = int if name == "tensorboard_log_interval" else str
        group.add_argument(flag, dest=name, type=kind, metavar=name.split("_", 1)[1].upper(),
                           default=None, help=text + (" (default: 1)" if kind is int else ""))


def is_writer_rank() -> bool:
    """Whether this process writes the trackers: under megatron-core's parallel state the last pipeline stage's
    tensor-parallel rank 0 of data-parallel (and context-parallel) rank 0, which holds the reduced loss; else global
    rank 0."""
    ps = sys.modules.get("megatron.core.parallel_state")
    if ps is not None and ps.model_parallel_is_initialized():
        return bool(ps.is_pipeline_last_stage(ignore_virtual=True) and ps.get_tensor_model_parallel_rank() == 0
                    and ps.get_data_parallel_rank(with_context_parallel=True) == 0)
    return rank() == 0


#: metrics.jsonl keys -> Megatron-LM's scalar names (``loss`` is the run's loss name, ``lm loss`` in ``train``)
NAMES = {"lr": "learning-rate", "grad_norm": "grad-norm", "step_time": "iteration-time",
         "tokens_per_s": "tokens-per-second", "train_tokens_per_s": "train-tokens-per-second",
         "target_tokens": "target-tokens", "response_length": "response-length"}
#: keys that are no curve (wall-clock seconds since the start; the step is the x axis)
SKIPPED = ("step", "seconds")
_MTP = re.compile(r"^mtp_(\d+)_loss$")


def scalar_names(record: dict, loss: str = "lm loss") -> dict[str, float]:
    """A metrics.jsonl record as tracker scalars: ``loss`` -> ``loss`` (``lm loss``), ``lr`` -> ``learning-rate``,
    ``grad_norm`` -> ``grad-norm``, ``step_time`` -> ``iteration-time``, ``tokens_per_s`` -> ``tokens-per-second``,
    ``mtp_1_loss`` -> ``mtp_1 loss`` (megatron-core's), ``eval_loss`` -> ``lm loss validation``, ``eval_ppl`` ->
    ``lm loss validation ppl``, ``eval_X`` -> ``X validation``; other numbers keep their names (``reward``,
    ``kl``, ``rewards/chosen``, ``mfu`` ...)."""
    out = {}
    for key, value in record.items():
        if key in SKIPPED or isinstance(value, bool) or not isinstance(value, (int, float)):
            continue
        if key.startswith("eval_"):
            rest = key[len("eval_"):]
            name = f"{loss} validation ppl" if rest == "ppl" else f"{_name(rest, loss)} validation"
        else:
            name = _name(key, loss)
        out[name] = float(value)
    return out


def _name(key: str, loss: str) -> str:
    if key == "loss":
        return loss
    mtp = _MTP.match(key)
    return f"mtp_{mtp.group(1)} loss" if mtp else NAMES.get(key, key)


class Trackers:
    """The run's TensorBoard writer and W&B run, open on the writing rank (elsewhere every call does nothing).

    ``run_dir``: the run folder (W&B's run id is kept there, and its files go to ``run_dir/wandb`` unless
    ``wandb_save_dir`` says otherwise; None: a new W&B run each time, its files where W&B puts them by default);
    ``resumed_step``: the step a resumed run continues after (None: a new run); ``config``: the run's settings for
    W&B; ``loss``: the name of the record's ``loss``; ``writes``: whether this rank writes (default
    :func:`is_writer_rank`)."""

    def __init__(self, settings: TrackerSettings | None, run_dir=None, resumed_step: int | None = None,
                 config: dict | None = None, loss: str = "lm loss", writes: bool | None = None):
        self.settings = settings or TrackerSettings()
        self.loss, self.tb, self.wandb = loss, None, None
        self.run_dir = None if run_dir is None else Path(run_dir)
        if not self.settings.enabled or not (is_writer_rank() if writes is None else writes):
            return
        self.settings.check()
        if self.settings.tensorboard_dir:
            self.tb = _tensorboard_writer(self.settings.tensorboard_dir, resumed_step)
        if self.settings.wandb_project:
            self.wandb = self._wandb_run(resumed_step, config)

    @property
    def active(self) -> bool:
        return self.tb is not None or self.wandb is not None

    def _wandb_run(self, resumed_step, config):
        try:
            import wandb
        except ImportError:  # check() found it: a broken install
            raise SettingError("--wandb-project: the wandb package cannot be imported; pip install wandb") from None
        s, record = self.settings, self._record()
        run_id = (record.get("wandb_run_id") if resumed_step is not None else None) or secrets.token_hex(4)
        folder = Path(s.wandb_save_dir) if s.wandb_save_dir else (self.run_dir / "wandb" if self.run_dir else None)
        if folder is not None:  # else W&B's own default: $WANDB_DIR or the working folder
            folder.mkdir(parents=True, exist_ok=True)
        run = wandb.init(project=s.wandb_project, entity=s.wandb_entity, name=s.wandb_exp_name,
                         dir=None if folder is None else str(folder), id=run_id, resume="allow",
                         config=_plain(config or {}))
        if self.run_dir is not None and record.get("wandb_run_id") != run_id:
            self._write_record({**record, "wandb_run_id": run_id})
        return run

    def _record(self) -> dict:
        path = None if self.run_dir is None else self.run_dir / TRACKERS_FILE
        try:
            return json.loads(path.read_text(encoding="utf-8")) if path is not None and path.is_file() else {}
        except (OSError, ValueError):
            return {}

    def _write_record(self, record: dict) -> None:
        self.run_dir.mkdir(parents=True, exist_ok=True)
        write_text_atomic(self.run_dir / TRACKERS_FILE, json.dumps(record) + "\n")

    def log(self, record: dict, extra: dict | None = None, always: bool = False) -> None:
        """Log a metrics record (with its ``step``) at the step; ``extra``: scalars under their own names. Records
        off the ``tensorboard_log_interval`` are skipped unless they hold validation results (``eval_*``) or
        ``always``."""
        if not self.active:
            return
        step = int(record["step"])
        evaluated = always or any(k.startswith("eval_") for k in record)
        if step % self.settings.tensorboard_log_interval and not evaluated:
            return
        scalars = {**scalar_names(record, self.loss), **(extra or {})}
        if self.tb is not None:
            for name, value in scalars.items():
                self.tb.add_scalar(name, value, step)
            self.tb.flush()
        if self.wandb is not None:
            self.wandb.log(scalars, step=step)

    def close(self) -> None:
        if self.tb is not None:
            self.tb.close()
            self.tb = None
        if self.wandb is not None:
            self.wandb.finish()
            self.wandb = None


def _tensorboard_writer(folder, resumed_step):
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ImportError:  # check() found the package: a broken install or an old one
        raise SettingError("--tensorboard-dir: torch.utils.tensorboard cannot import tensorboard; pip install -U "
                           "tensorboard") from None
    # a resumed run: the events at and after its first new step (a killed run's, written after its checkpoint) are
    # purged when TensorBoard reads the folder
    return SummaryWriter(log_dir=str(folder), purge_step=None if resumed_step is None else resumed_step + 1)


def _plain(values: dict) -> dict:
    """JSON-able settings for W&B's config."""
    out = {}
    for key, value in values.items():
        if isinstance(value, float) and not math.isfinite(value):
            value = str(value)
        out[key] = value if isinstance(value, (str, int, float, bool, list)) or value is None else str(value)
    return out


_current: list[tuple[TrackerSettings, str, dict]] = []


@contextlib.contextmanager
def tracking(settings: TrackerSettings, loss: str = "loss", config: dict | None = None) -> Iterator[None]:
    """Within the block, every :class:`~pai_zoo.util.metrics.MetricsLog` also logs to ``settings``' trackers, the
    records' ``loss`` named ``loss`` and ``config`` the W&B run's config (``pai-zoo rl NAME`` wraps a trainer's run
    in it: ``dpo loss``)."""
    _current.append((settings, loss, config or {}))
    try:
        yield
    finally:
        _current.pop()


def current_tracking() -> tuple[TrackerSettings, str, dict] | None:
    """The innermost :func:`tracking` block's settings, loss name and config, or None outside one."""
    return _current[-1] if _current else None

