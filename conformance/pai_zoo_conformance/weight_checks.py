"""The weight checks: the family's table covers the model both ways, and the weights round-trip bit for bit, in
memory and through a converted checkpoint on disk."""
from __future__ import annotations

from pathlib import Path

from pai_zoo.tables.mapping import TO_HF, TO_MCORE, MappingContext

from .cases import Case, _fail


def check_mapping_coverage(case: Case) -> None:
    """The table consumes every source tensor once and fills every target once, both ways."""
    from pai_zoo.families.registry import get_registry
    from pai_zoo.models.state_dicts import hf_state_dict, mcore_tensors
    from pai_zoo.plugin.errors import MappingError

    table = get_registry().weight_map(case.family, case.mcore_config)
    ctx = MappingContext.from_config(case.mcore_config)
    hf_names = list(hf_state_dict(case.hf_model, case.mcore_config, case.family))  # checkpoint names (experts split)
    mcore_names = list(mcore_tensors(case.mcore_model))
    try:
        table.check_coverage(TO_MCORE, ctx, hf_names, mcore_names)
        table.check_coverage(TO_HF, ctx, mcore_names, hf_names)
    except MappingError as exc:
        _fail("mapping", str(exc))


def check_weight_round_trip(case: Case) -> float:
    """HF weights -> mcore -> HF are bit-identical. Returns max |delta| (0.0)."""
    from pai_zoo.models.state_dicts import hf_state_dict, hf_to_mcore, mcore_to_hf

    original = hf_state_dict(case.hf_model, case.mcore_config, case.family)
    there = hf_to_mcore(case.family, case.mcore_config, original)
    back = mcore_to_hf(case.family, case.mcore_config, there)
    if set(back) != set(original):
        _fail(
            "weights",
            f"names differ: missing {sorted(set(original) - set(back))}, extra {sorted(set(back) - set(original))}",
        )
    changed = [k for k in original if original[k].shape != back[k].shape or not original[k].equal(back[k])]
    if changed:
        _fail("weights", f"HF -> mcore -> HF changed tensors: {changed}")
    return 0.0


def check_disk_round_trip(case: Case, folder: Path) -> float:
    """HF folder -> Megatron-Core checkpoint -> HF folder: bit-identical tensors, equal config. Returns max
    |delta| (0.0)."""
    import torch
    from safetensors.torch import load_file

    from pai_zoo.conversion.entry import convert
    from pai_zoo.hf import models as hf

    folder = Path(folder)
    case.hf_model.save_pretrained(folder / "hf")
    convert(folder / "hf", folder / "mcore", "mcore")
    convert(folder / "mcore", folder / "hf-again", "hf")

    def tensors(path):
        out = {}
        for file in sorted(Path(path).glob("*.safetensors")):
            out.update(load_file(file))
        return out

    before, after = tensors(folder / "hf"), tensors(folder / "hf-again")
    if before.keys() != after.keys():
        _fail("disk", f"tensor names differ: missing {sorted(before.keys() - after.keys())}, "
                      f"extra {sorted(after.keys() - before.keys())}")
    changed = [k for k in before if before[k].dtype != after[k].dtype or not torch.equal(before[k], after[k])]
    if changed:
        _fail("disk", f"HF -> mcore -> HF on disk changed tensors: {changed}")
    ignore = {"transformers_version", "_name_or_path"}
    configs = [
        {
            k: v
            for k, v in hf.config_dict(hf.hf_config(case.family, _read_json(f / "config.json"))).items()
            if k not in ignore
        }
        for f in (folder / "hf", folder / "hf-again")
    ]
    diff = {k: (configs[0].get(k), configs[1].get(k)) for k in configs[0].keys() | configs[1].keys()
            if configs[0].get(k) != configs[1].get(k)}
    if diff:
        _fail("disk", f"config.json changed (before, after): {diff}")
    return 0.0


def _read_json(path: Path) -> dict:
    import json

    return json.loads(Path(path).read_text())
