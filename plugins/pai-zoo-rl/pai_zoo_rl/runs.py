"""What the DPO and GRPO commands share: the flags of a run (its layout, seed, checkpoints) and their checks."""
from __future__ import annotations

from pai_zoo.errors import SettingError


def add_model_arguments(parser, reference_role: str) -> None:
    """``--model`` (the policy), ``--ref-model`` (what the reference is for: ``reference_role``) and ``--save``."""
    a = parser.add_argument
    a("--model", required=True, help="the policy to train: preset, HF folder or Hub id (org/name), or Megatron-Core "
                                    "checkpoint")
    a("--ref-model", help=f"reference model {reference_role} (default: the starting policy, --model)")
    a("--save", required=True, help="output folder: Megatron-Core checkpoints, metrics.jsonl")


def load_reference(spec, policy, tensor_parallel_size: int, seed: int, pipeline_parallel_size: int):
    """The frozen reference model (``spec``), checked to share the policy's tokenizer."""
    from pai_zoo.rl.models import check_same_tokenizer, load_model

    reference = load_model(spec, tensor_parallel_size, seed, pipeline_parallel_size)
    check_same_tokenizer(policy, reference, "policy", "reference model")
    reference.model.eval()
    for p in reference.model.parameters():
        p.requires_grad_(False)
    return reference


def add_run_arguments(parser, defaults: dict) -> None:
    """``--clip-grad``, ``--seed``, ``--save-every``, ``--no-resume``, ``--tp``, ``--pp`` and ``--quiet``."""
    a = parser.add_argument
    a("--clip-grad", "--max-grad-norm", dest="max_grad_norm", metavar="NORM", type=float,
      default=defaults["max_grad_norm"], help="max global gradient norm, as train --clip-grad (0 disables clipping)")
    a("--seed", type=int, default=defaults["seed"], help="random seed (data order, sampling)")
    a("--save-every", type=int, default=defaults["save_every"], help="checkpoint every N steps (0: at the end)")
    a("--no-resume", dest="resume", action="store_false", help="start over even if SAVE holds a checkpoint")
    a("--tp", dest="tensor_parallel_size", type=int, default=defaults["tensor_parallel_size"],
      help="tensor-parallel size (under torchrun; the ranks beyond tp x pp are data-parallel)")
    a("--pp", dest="pipeline_parallel_size", type=int, default=defaults["pipeline_parallel_size"],
      help="pipeline-parallel size (under torchrun)")
    a("--quiet", action="store_true", help="no line per step on the terminal (metrics.jsonl is written all the same)")


def check_run_settings(command: str, s: dict, required: tuple[str, ...]) -> None:
    """The required settings are given and the run's sizes are positive."""
    for key in required:
        if s.get(key) is None or s.get(key) == "":
            raise SettingError(f"{command}: --{key.replace('_', '-')} is required")
    for key, flag in (("tensor_parallel_size", "--tp"), ("pipeline_parallel_size", "--pp")):
        if s[key] < 1:
            raise SettingError(f"{flag} {s[key]}: must be at least 1")
    if s["save_every"] < 0:
        raise SettingError(f"--save-every {s['save_every']}: must be 0 (at the end) or positive")


def add_lora_arguments(parser) -> None:
    """``--peft lora`` and its settings, as ``pai-zoo train`` names them."""
    a = parser.add_argument
    a("--peft", choices=("lora",), help="train LoRA adapters on the frozen policy (train's --peft lora): the run "
                                       "folder is a LoRA run (pai-zoo lora export, pai_zoo.load(BASE, adapter=DIR))")
    a("--lora-rank", type=int, default=8, help="with --peft lora: the adapters' rank (PEFT's r)")
    a("--lora-alpha", type=float, default=16.0, help="with --peft lora: alpha; the update is scaled by alpha / rank")
    a("--lora-dropout", type=float, default=0.0, help="with --peft lora: dropout on the adapters' input")
    a("--lora-target-modules", help="with --peft lora: comma-separated HF projection names (q_proj,v_proj) or "
                                    "megatron-core linear names (default: every linear of the decoder)")
    a("--use-rslora", action="store_true", help="with --peft lora: rank-stabilised scaling, alpha / sqrt(rank)")


LORA_DEFAULTS = {"peft": None, "lora_rank": 8, "lora_alpha": 16.0, "lora_dropout": 0.0, "lora_target_modules": None,
                 "use_rslora": False}


def lora_settings(s: dict):
    """The run's :class:`~pai_zoo.lora.settings.LoraSettings` under ``--peft lora``, else None (a LoRA setting
    without ``--peft lora`` is refused)."""
    from pai_zoo.lora.settings import LoraSettings, parse_targets

    if s.get("peft") is None:
        given = [k for k, v in LORA_DEFAULTS.items() if k != "peft" and s.get(k, v) != v]
        if given:
            raise SettingError(f"--{given[0].replace('_', '-')}: a LoRA setting without --peft lora (add --peft lora)")
        return None
    return LoraSettings(rank=s["lora_rank"], alpha=s["lora_alpha"], dropout=s["lora_dropout"],
                        targets=parse_targets(s["lora_target_modules"]), use_rslora=s["use_rslora"])


def check_lora_base(handle, settings) -> None:
    """LoRA adapts a base checkpoint folder, which its run names (checked before anything is written)."""
    if settings is not None and handle.checkpoint is None:
        raise SettingError("--peft lora adapts a base checkpoint folder (Hugging Face or Megatron-Core), not a "
                           "preset's random weights; give --model FOLDER")


def attach_lora(handle, settings, seed: int) -> None:
    """Freeze the policy and give it the adapters, drawn from ``seed`` (a resumed run then loads its own)."""
    from pai_zoo.lora.adapters import add_lora

    check_lora_base(handle, settings)
    add_lora(handle.model, handle.family, handle.mcore_config, settings, seed=seed)


def write_lora_record(handle, settings, save) -> None:
    """``SAVE/lora.json`` (rank 0, once, with the first checkpoint): it makes the run folder a LoRA run of the base
    ``handle`` was loaded from, as ``pai-zoo train --peft lora`` writes it."""
    from pathlib import Path

    from pai_zoo.formats.mcore_dist import is_mcore_checkpoint
    from pai_zoo.lora import run as lora_run
    from pai_zoo.lora.targets import lora_targets, select
    from pai_zoo.registry import get_registry
    from pai_zoo.util.dist import is_rank0

    if not is_rank0() or lora_run.is_lora_run(save):
        return
    chosen = select(lora_targets(get_registry().weight_map(handle.family, handle.mcore_config)), settings.targets,
                    handle.family.name)
    targets = sorted({t.leaves[i] for t, idx in chosen.items() for i in idx})
    base = Path(handle.checkpoint)
    Path(save).mkdir(parents=True, exist_ok=True)
    lora_run.write_record(Path(save), settings, base, "mcore" if is_mcore_checkpoint(base) else "hf", targets)


def step_slice(items: list, seed: int, step: int, size: int) -> list:
    """Step ``step``'s ``size`` items: epochs of ``len(items) // size`` steps, each a shuffle of ``items`` drawn from
    ``seed`` and the epoch (so a resumed run takes what the first would have)."""
    import random

    epoch, k = divmod(step, len(items) // size)
    order = list(items)
    random.Random(seed * 1_000_003 + epoch).shuffle(order)
    return order[k * size:(k + 1) * size]


def save_policy(handle, optimizer, save, step: int, lora) -> None:
    """Checkpoint ``step`` of the policy (its adapters only under LoRA, with ``lora.json`` the first time)."""
    from pai_zoo.rl.checkpoint import save_model

    if lora is not None:
        write_lora_record(handle, lora, save)
    save_model(save, handle, handle.model, optimizer, step, state={"step": step})
