"""The checks of pai-zoo's tools on a family: ``pai-zoo inspect`` of its Hugging Face folder, ``pai-zoo train --plan``
and the Megatron-LM ``args`` both ways (architecture -> args -> architecture: equal, or every difference named by
a caveat, :func:`pai_zoo.mcore.megatron_lm_args.megatron_lm_caveats`). Cheap: no model is built beyond the case's."""
from __future__ import annotations

from pathlib import Path

from .cases import Case, _fail

#: Keys of an architecture that are training settings or implementation switches, not carried by Megatron-LM's
#: architecture fields (tests/test_megatron_lm_args.py's list, plus the expert implementation switches).
NOT_ARCH = ("vocab_size", "attention_dropout", "hidden_dropout", "moe_grouped_gemm", "moe_token_dispatcher_type")


#: How far the plan's parameter count may be from the model's (a memory estimate: it counts the Llama-shaped
#: layer, not a family's extra norms, e.g. Gemma-2's post norms, a few hundred parameters on a tiny preset).
PLAN_RTOL = 0.01


def _parameters(model) -> int:
    """The tensors a saved folder holds: the state dict's, a tied tensor once (persistent buffers included)."""
    seen, count = set(), 0
    for tensor in model.state_dict().values():
        key = (tensor.data_ptr(), tuple(tensor.shape))
        if key not in seen:
            seen.add(key)
            count += tensor.numel()
    return count


#: Keys a caveat names by what they do rather than by name.
_NAMED_BY = {"activation_func": ("MLP", "activation"), "gated_linear_unit": ("MLP", "swiglu")}


def _named(key: str, caveats: list[str]) -> bool:
    short = key.split(".", 1)[-1]
    words = (key, short, *_NAMED_BY.get(key, ()))
    return any(word in caveat for caveat in caveats for word in words)


def _lost(ours, theirs) -> bool:
    """A difference that is one: an absent key and a false/zero/None value mean the same."""
    return not (ours in (None, False, 0) and theirs in (None, False, 0))


def check_inspect(case: Case, folder: Path) -> int:
    """``inspect`` of the case's saved Hugging Face folder names the family and counts the model's parameters.
    Returns the count."""
    from pai_zoo.models.inspection import inspect_checkpoint

    folder = Path(folder)
    case.hf_model.save_pretrained(folder)
    try:
        report = inspect_checkpoint(folder)
        lines = report.lines()
    except Exception as exc:  # noqa: BLE001 - any failure of the tool is the finding
        _fail("inspect", f"{case.preset}: pai-zoo inspect failed: {type(exc).__name__}: {exc}")
    if report.family != case.family.name:
        _fail("inspect", f"{case.preset}: inspect names family {report.family!r}, not {case.family.name!r}")
    expected = _parameters(case.hf_model)
    if report.parameters != expected:
        _fail("inspect", f"{case.preset}: inspect counts {report.parameters:,} parameters, the transformers model "
                         f"has {expected:,}")
    if not any(line.startswith("architecture:") for line in lines):
        _fail("inspect", f"{case.preset}: inspect shows no architecture")
    return report.parameters


def check_plan(case: Case) -> int | None:
    """What ``pai-zoo train --model PRESET --plan`` computes (:func:`pai_zoo.training.plan.make_plan`, one GPU, the
    default settings) runs, and its parameter count is the megatron-core model's (within :data:`PLAN_RTOL`). A
    mixture of experts: ``--plan`` refuses it (it counts dense models only), nothing to check; returns None. Else
    the plan's count less the model's."""
    from pai_zoo.training.config import TrainConfig
    from pai_zoo.training.plan import make_plan, plan_lines

    if case.mcore_config.get("num_moe_experts"):
        return None
    try:
        plan = make_plan(case.mcore_config, TrainConfig(model=case.preset), 1)
        plan_lines(plan)
    except Exception as exc:  # noqa: BLE001 - any failure of the tool is the finding
        _fail("plan", f"{case.preset}: train --plan failed: {type(exc).__name__}: {exc}")
    built = sum(p.numel() for p in case.mcore_model.parameters())
    if abs(plan.parameters_per_rank - built) > PLAN_RTOL * built:
        _fail("plan", f"{case.preset}: train --plan counts {plan.parameters_per_rank:,} parameters, the "
                      f"megatron-core model has {built:,}")
    return plan.parameters_per_rank - built


def check_megatron_args(case: Case) -> list[str]:
    """The Megatron-LM ``args`` of the case's architecture read back (with the family's own args rules) give the
    architecture again, but for what a caveat names; the family claims them when it claims Megatron-LM checkpoints.
    Returns the caveats."""
    import torch

    from pai_zoo.families.registry import get_registry
    from pai_zoo.mcore import megatron_lm_args as mla
    from pai_zoo.plugin import megatron_args
    from pai_zoo.plugin.errors import PaiZooError

    config, family = case.mcore_config, case.family
    try:
        caveats = mla.megatron_lm_caveats(config)
        args = vars(mla.megatron_lm_args(config, 1, 1, None, torch.float32))
        back = megatron_args.arch_from_args(args, f"{case.preset}'s args", family.megatron_lm_rules)
    except PaiZooError as exc:
        _fail("megatron-lm args", f"{case.preset}: {exc}")
    arch = dict(config.arch)
    if arch.get("ffn_hidden_size") is None:  # what its absence means to megatron-core and Megatron-LM alike
        arch["ffn_hidden_size"] = 4 * arch["hidden_size"]
    keys = [k for k in arch if k not in NOT_ARCH]
    unnamed = []
    for key in sorted(set(megatron_args.differences(arch, back, keys=keys))
                      | set(megatron_args.differences(back, arch))):
        ours, theirs = arch.get(key), back.get(key)
        if _lost(ours, theirs) and not _named(key, caveats):
            unnamed.append(f"{key}: {ours!r} -> {'<absent>' if key not in back else repr(theirs)}")
    if unnamed:
        _fail("megatron-lm args", f"{case.preset}: architecture -> Megatron-LM args -> architecture changes "
                                  f"{'; '.join(unnamed)}, and no caveat names it (caveats: {caveats or 'none'})")
    if family.megatron_args and not caveats:
        claimed = [f.name for f in get_registry().families_for_megatron_args(back)]
        if family.name not in claimed:
            _fail("megatron-lm args", f"{case.preset}: its args are claimed by {claimed or 'no family'}, not by "
                                      f"{family.name!r} (Family.megatron_args)")
    return caveats
