"""Hugging Face folder -> pai-zoo's Megatron-Core checkpoint, tensor by tensor.

A source tensor is read (:func:`pai_zoo.formats.open_checkpoint`: memory-mapped, encodings decoded), transformed by
the family's weight table and written (:class:`pai_zoo.formats.mcore_dist.McoreDistWriter`); a fused tensor holds
only its parts. Before anything is written the whole conversion is rehearsed on meta tensors, so a wrong shape or a
missing or unexpected name fails fast.
"""
from __future__ import annotations

import shutil
from dataclasses import replace
from pathlib import Path

import torch

from .. import formats
from ..families.family import Family
from ..families.registry import get_registry
from ..formats.encodings.fp8_blocks import DequantizedCheckpoint
from ..formats.encodings.mxfp4 import SCALES_FILE as MXFP4_SCALES_FILE
from ..formats.encodings.mxfp4 import Mxfp4Checkpoint
from ..formats.hf_folder import CONFIG, GENERATION_CONFIG, read_config, tokenizer_files
from ..formats.mcore_dist import HF_DIR, SCALES_FILE, McoreDistWriter
from ..hf import models as hf
from ..mcore import dist_ckpt
from ..mcore import megatron_lm_args as mla
from ..mcore.biased_experts import biased_experts
from ..mcore.parallel_sizes import check_layout
from ..plugin.config_map import McoreConfig
from ..plugin.errors import PaiZooError
from ..tables.mapping import TO_MCORE, MappingContext
from ..util.background import BackgroundWriter
from ..util.progress import Progress
from .report import ConversionReport


def family_for(config: dict, where: Path, name: str | None) -> Family:
    registry = get_registry()
    return registry.family(name) if name else registry.family_for_hf_config(config, where=str(where))


def check_expert_layout(config: McoreConfig, ep: int, etp: int) -> None:
    """An expert layout the model can have: ``ep`` dividing the routed-expert count (each EP rank holds
    ``num_moe_experts / ep`` experts) and ``etp`` dividing the experts' FFN width; a model without experts takes
    only 1 (``etp``: its ``tp``). Otherwise a :class:`PaiZooError` listing the valid sizes."""
    experts = int(config.get("num_moe_experts") or 0)
    if not experts:
        if ep != 1:
            raise PaiZooError(f"--ep {ep}: family {config.family!r} (this model) has no experts; --ep applies to "
                              "mixture-of-experts models only")
        return
    if experts % ep:
        valid = ", ".join(str(n) for n in range(1, experts + 1) if experts % n == 0)
        raise PaiZooError(f"--ep {ep} does not divide the {experts} routed experts; valid --ep: {valid}")
    if etp != 1 and biased_experts(config):
        raise PaiZooError(f"--etp {etp}: this model's experts have biases, which megatron-core allows only at "
                          "expert-tensor-parallel size 1 (the experts split over --ep ranks); pass --etp 1")
    width = int(config.get("moe_ffn_hidden_size") or config["ffn_hidden_size"])
    if width % etp:
        valid = ", ".join(str(n) for n in range(1, min(width, 64) + 1) if width % n == 0)
        raise PaiZooError(f"--etp {etp} does not divide the experts' FFN width {width} (moe_ffn_hidden_size); "
                          f"valid --etp: {valid}")


def hf_to_mcore(src: Path, writer: McoreDistWriter, family_name, tp: int, pp: int, dtype, progress,
                experts: tuple[int, int] = (1, 1), no_mtp: bool = False) -> ConversionReport:
    """Write the Hugging Face folder ``src`` into ``writer`` (published by the caller)."""
    if formats.detect(src) != "hf":
        raise PaiZooError(f"{src}: not a Hugging Face checkpoint folder (no {CONFIG})")
    raw_config = read_config(src)
    family = family_for(raw_config, src / CONFIG, family_name)
    config = family.to_mcore_config(hf.config_dict(hf.hf_config(family, raw_config)))
    check_layout(config, tp, pp)  # an invalid --tp/--pp names the valid ones
    if experts[1] is None:  # --etp not given: tp, or 1 where megatron-core allows only 1 (biased experts)
        experts = (experts[0], 1 if biased_experts(config) else tp)
    check_expert_layout(config, *experts)
    source = formats.open_checkpoint(src, dtype=dtype, format="hf")
    try:
        config, dropped, note = mtp_choice(src, family, config, source.names(), no_mtp)
        report = _write_mcore(src, writer, family, config, source, tp, pp, dtype, progress, experts, dropped)
    finally:
        source.close()
    if note:
        report.notes.insert(0, note)
    return report


def mtp_choice(src: Path, family: Family, config: McoreConfig, names, no_mtp: bool):
    """``(config, dropped MTP layers, note)``: the config's multi-token-prediction layers are converted unless
    ``no_mtp`` or the folder holds none of their tensors; then the config loses them and the note says so."""
    layers = int(config.get("mtp_num_layers") or 0)
    if not layers:
        return config, 0, None
    table = get_registry().weight_map(family, config)
    ctx = MappingContext.from_config(config)
    names = list(names)
    if table.mtp_layers_held(ctx, names) and not no_mtp:
        return config, 0, None
    held = table.mtp_names(ctx, range(layers)) & set(names)
    first, last = table.mtp.hf_prefix(ctx, 0), table.mtp.hf_prefix(ctx, layers - 1)
    where = f"{first}*" if layers == 1 else f"{first}* .. {last}*"
    if no_mtp:
        note = (f"--no-mtp: left out {layers} multi-token-prediction layer(s) ({where}: {len(held)} tensors); "
                "the checkpoint has no MTP layers and converts back with num_nextn_predict_layers 0")
    else:
        note = (f"note: config.json counts {layers} multi-token-prediction layer(s) (num_nextn_predict_layers) but "
                f"{src} holds no {where} tensors (transformers saves none): converted without them")
    return config.without_mtp(), layers, note


def _write_mcore(
    src: Path, writer: McoreDistWriter, family: Family, config: McoreConfig, source, tp, pp, dtype, progress,
    experts: tuple[int, int] = (1, 1), dropped_mtp: int = 0,
):
    """Write the checkpoint into ``writer`` (whose destination is the folder Megatron-LM's ``--load`` is given).

    The tensors are stored as megatron-core's ``sharded_state_dict`` names them: global tensors, each routed
    expert a slice of its layer's expert axis (the chunk an expert-parallel rank saves for it), so any EP/TP/PP
    layout loads them; ``tp``, ``pp`` and ``experts`` (EP, ETP) are the layout recorded in the args and
    ``pai_zoo.json`` (Megatron-LM's ``--use-checkpoint-args``)."""
    dtype = dtype or floating_dtype(source)
    padded = config.padded_vocab_size(tp)
    layout = dist_ckpt.layout_of(family, config, dtype, padded)
    table = get_registry().weight_map(family, config)
    ctx = replace(MappingContext.from_config(config, padded_vocab_size=padded).named_as(layout.local_shapes),
                  dropped_mtp_layers=dropped_mtp)
    # Rehearse on meta tensors: names, coverage and shapes are checked before writing.
    for _ in table.iter_convert(TO_MCORE, ctx, source.meta, source.names(), layout.local_shapes):
        pass
    writer.plan(layout.by_local)
    out = writer.staging
    total = sum(source.nbytes(n) for n in source.names())
    bar = Progress("hf -> mcore", total, totals={"tensors": len(layout.local_shapes)}, enabled=progress)
    report = ConversionReport(src, out, "mcore", family.name)
    with BackgroundWriter() as background:
        for name, tensor in table.iter_convert(TO_MCORE, ctx, source.get, source.names(), layout.local_shapes):
            tensor = tensor.to(dtype)
            for chunk in layout.by_local[name]:
                background.submit(writer.write_chunk, chunk, tensor[chunk.local_slice])
            nbytes = tensor.numel() * tensor.element_size()
            report.tensors, report.bytes = report.tensors + 1, report.bytes + nbytes
            bar.update(nbytes)
            del tensor
    bar.close()
    for key, obj in layout.objects.items():
        writer.write_object(key, obj)
    final = writer.dst.resolve()
    tokenizer_model = str(final / HF_DIR) if tokenizer_files(src) else None
    args = mla.megatron_lm_args(config, tp, pp, padded, dtype, tokenizer_model=tokenizer_model)
    if config.get("num_moe_experts"):
        args.expert_model_parallel_size, args.expert_tensor_parallel_size = experts
    writer.describe({"args": args, "checkpoint_version": 3.0, "iteration": 0}, config, tp, pp, dtype, padded,
                    experts=experts)
    _copy_hf_side(src, out / HF_DIR)
    if isinstance(source, DequantizedCheckpoint):
        from safetensors.torch import save_file

        save_file(source.scales(), str(out / HF_DIR / SCALES_FILE))
        report.notes.append(f"FP8 block-scaled source: {len(source.quantized)} weights dequantized to "
                            f"{str(dtype).removeprefix('torch.')}; their scales are kept in "
                            f"{HF_DIR}/{SCALES_FILE} (convert --to hf --quantize fp8-block writes them back)")
    if isinstance(source, Mxfp4Checkpoint):
        from safetensors.torch import save_file

        save_file(source.scales(), str(out / HF_DIR / MXFP4_SCALES_FILE))
        report.notes.append(f"MXFP4 source: {len(source.quantized)} expert weights dequantized to "
                            f"{str(dtype).removeprefix('torch.')}; their scales are kept in "
                            f"{HF_DIR}/{MXFP4_SCALES_FILE} (convert --to hf --quantize mxfp4 writes them back)")
    mla.write_readme(out, config, args, load_dir=final)
    report.notes.append("Megatron-LM: add " + mla.load_command(final, config, dtype))
    return report


def floating_dtype(source) -> torch.dtype:
    for name in source.names():
        t = source.meta(name)
        if t.is_floating_point():
            return t.dtype
    return torch.float32


def _copy_hf_side(src: Path, dst: Path) -> None:
    """config.json, generation_config.json and the tokenizer files."""
    dst.mkdir(parents=True, exist_ok=True)
    for file in [src / CONFIG, src / GENERATION_CONFIG, *tokenizer_files(src)]:
        if file.is_file():
            shutil.copy2(file, dst / file.name)


