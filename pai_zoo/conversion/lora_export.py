"""A LoRA run out to Hugging Face: as a PEFT adapter folder (``convert RUN --to hf-peft``) or merged into its base
(``convert RUN --to hf --merge-lora``: ``W + scaling * B @ A`` per adapted projection, what PEFT's
``merge_and_unload`` computes). Both work on full adapters read from the run's checkpoint, whatever TP/PP layout
trained it, in HF names: no model is built."""
from __future__ import annotations

import shutil
from pathlib import Path

from .. import formats
from ..families.registry import get_registry
from ..formats.hf_folder import GENERATION_CONFIG, SafetensorsWriter, read_config, tokenizer_files, write_config
from ..formats.mcore_dist import HF_DIR, mcore_config_of
from ..formats.peft_adapter import write_peft_adapter
from ..hf.models import hf_config_from_mcore
from ..lora.run import check_base, read_record, run_adapters
from ..lora.settings import LoraError, LoraSettings
from ..lora.targets import lora_targets, to_hf_form
from ..models.megatron_checkpoint import open_megatron
from ..tables.mapping import MappingContext


def hf_adapters_of_run(run) -> tuple[LoraSettings, dict, dict]:
    """``(settings, adapters in HF form, record)`` of a LoRA run's latest checkpoint."""
    record = read_record(run)
    config, _ = mcore_config_of(run)
    family = get_registry().family(config.family)
    targets = lora_targets(get_registry().weight_map(family, config))
    adapters = to_hf_form(run_adapters(run), targets, config, MappingContext.from_config(config))
    return LoraSettings.from_dict(record["settings"]), adapters, record


def run_to_peft(run, out: Path) -> list[str]:
    """Write ``run``'s adapters as a PEFT folder at ``out``; returns notes."""
    settings, adapters, record = hf_adapters_of_run(run)
    family = get_registry().family(mcore_config_of(run)[0].family)
    write_peft_adapter(out, settings, adapters, base=record["base"]["path"], family=family)
    for file in tokenizer_files(Path(run) / HF_DIR):  # PEFT folders often carry the tokenizer: it does no harm
        shutil.copy2(file, out / file.name)
    return [f"{len(adapters)} adapted projections ({', '.join(sorted({n.rsplit('.', 1)[-1] for n in adapters}))}), "
            f"rank {settings.rank}, alpha {settings.alpha:g}; base {record['base']['path']}"]


def _base_tensors(base: Path, kind: str):
    """``(plan, stream, close)``: the base's HF tensors' ``(name, shape, dtype)`` and ``(name, tensor)`` pairs,
    one at a time (an FP8 base dequantized, a megatron-core base through its family's table)."""
    if kind == "hf":
        weights = formats.open_checkpoint(base, format="hf")
        plan = [(n, tuple(weights.meta(n).shape), weights.meta(n).dtype) for n in weights.names()]
        return plan, ((n, weights.get(n)) for n in weights.names()), weights.close
    checkpoint = open_megatron(base)
    tied = set(checkpoint.table.tied_outputs(checkpoint.ctx))
    plan = [(n, tuple(t.shape), checkpoint.stored_dtype) for n, t in checkpoint.hf_tensors(meta=True) if n not in tied]
    return plan, ((n, t) for n, t in checkpoint.hf_tensors() if n not in tied), checkpoint.close


def merge_run(run, out: Path, dtype=None, max_shard_size="5GB") -> list[str]:
    """Write ``run``'s base with its adapters merged, as an HF folder at ``out`` (a new folder): each adapted
    weight ``W + scaling * B @ A`` in float32, then in ``dtype`` (default: the base's). Returns notes."""
    settings, adapters, record = hf_adapters_of_run(run)
    base, kind = Path(record["base"]["path"]), record["base"]["kind"]
    check_base(record, base, run)
    plan, stream, close = _base_tensors(base, kind)
    try:
        modules = {f"{m}.weight": m for m in adapters}
        names = {n for n, _, _ in plan}
        missing = sorted(set(modules) - names)
        if missing:
            raise LoraError(f"{base}: has no {missing[0]} for the adapter of {modules[missing[0]]}")
        plan = [(n, shape, dtype if (dtype is not None and d.is_floating_point) else d) for n, shape, d in plan]
        out.mkdir(parents=True)
        writer = SafetensorsWriter(out, plan, max_shard_size)
        wanted = {n: d for n, _, d in plan}
        for name, tensor in stream:
            if name in modules:
                a, b = adapters[modules[name]]
                tensor = tensor.float() + settings.scaling * (b.float() @ a.float())
            writer.write(name, tensor.to(wanted[name]))
        writer.close()
    finally:
        close()
    stored = {str(d).removeprefix("torch.") for n, _, d in plan if n in modules}
    if kind == "hf":
        config = read_config(base)
        config.pop("quantization_config", None)  # the merged weights are plain
        config["dtype"] = stored.pop() if len(stored) == 1 else config.get("dtype")
        write_config(out, config)
    else:
        config, _ = mcore_config_of(base)
        hf_config = hf_config_from_mcore(get_registry().family(config.family), config)
        hf_config.save_pretrained(out)
    side = base if kind == "hf" else base / HF_DIR
    for file in [*tokenizer_files(side), side / GENERATION_CONFIG]:
        if file.is_file() and not (out / file.name).exists():
            shutil.copy2(file, out / file.name)
    return [f"merged {len(adapters)} adapted projections (scaling {settings.scaling:g}) into the weights of {base}"]
