"""A Megatron checkpoint (pai-zoo's or Megatron-LM's, any layout) -> a Hugging Face folder, tensor by tensor, in
the stored dtype, another one, FP8 blocks (``--quantize fp8-block``: :mod:`pai_zoo.formats.encodings.fp8_blocks`)
or MXFP4 experts (``--quantize mxfp4``: :mod:`pai_zoo.formats.encodings.mxfp4`).
The folder is written by :class:`pai_zoo.formats.hf_folder.HFFolderWriter`, published by the caller."""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from ..families.family import Family
from ..formats.encodings import mxfp4, scheme_of
from ..formats.encodings.fp8_blocks import writer_for
from ..formats.hf_folder import (
    CONFIG,
    GENERATION_CONFIG,
    HFFolderWriter,
    generation_config_file,
    read_config,
    tokenizer_files,
)
from ..formats.mcore_dist import recorded_scales
from ..hf import models as hf
from ..mcore.heads import sequence_classification_config
from ..models.megatron_checkpoint import MegatronCheckpoint, open_megatron
from ..plugin.config_map import McoreConfig
from ..util.background import BackgroundWriter
from ..util.progress import Progress
from .report import ConversionReport


def mcore_to_hf(src: Path, writer: HFFolderWriter, family_name, dtype, max_shard_size, progress, tokenizer=None,
                iteration=None, quantize: str | None = None, no_mtp: bool = False) -> ConversionReport:
    """Write the Megatron checkpoint ``src`` into ``writer`` (published by the caller)."""
    with open_megatron(src, family_name, reference=tokenizer, iteration=iteration) as checkpoint:
        if no_mtp:
            checkpoint.drop_mtp()
        return _write_hf(checkpoint, writer, dtype or checkpoint.stored_dtype, max_shard_size, progress, tokenizer,
                         quantize)


def _write_hf(checkpoint: MegatronCheckpoint, writer: HFFolderWriter, dtype, max_shard_size, progress,
              tokenizer=None, quantize: str | None = None) -> ConversionReport:
    tied = set(checkpoint.table.tied_outputs(checkpoint.ctx))
    fp8 = _fp8_writer(checkpoint) if quantize == "fp8-block" else _mxfp4_writer(checkpoint) if quantize == "mxfp4" \
        else None
    plan = [(n, tuple(t.shape), dtype) for n, t in checkpoint.hf_tensors(meta=True) if n not in tied]
    if fp8 is not None:
        plan = [entry for n, shape, d in plan for entry in fp8.plan(n, shape, d)]
    out = writer.staging
    writer.plan(plan, max_shard_size)
    bar = Progress("mcore -> hf", writer.total_size, totals={"tensors": len(plan)}, enabled=progress)
    report = ConversionReport(checkpoint.path, out, "hf", checkpoint.family.name, notes=list(checkpoint.notes))
    with BackgroundWriter() as background:
        for name, tensor in checkpoint.hf_tensors():
            if name in tied:
                continue
            tensor = tensor.to(dtype)
            for part, data in fp8.encode(name, tensor) if fp8 is not None else ((name, tensor),):
                background.submit(writer.write, part, data)
                nbytes = data.numel() * data.element_size()
                report.tensors, report.bytes = report.tensors + 1, report.bytes + nbytes
                bar.update(nbytes)
            del tensor
    writer.finish()
    bar.close()
    hf_side = _hf_side(checkpoint, tokenizer, report)
    if isinstance(fp8, mxfp4.Mxfp4Writer):
        report.notes.append(f"MXFP4: {sum(1 for n, _, _ in plan if n.endswith(mxfp4.BLOCKS_SUFFIX))} expert weights "
                            "as *_blocks and *_scales"
                            + (" (the source's scales where the weights are unchanged)" if fp8.recorded else ""))
    elif fp8 is not None:
        report.notes.append(f"FP8 block-scaled: {sum(1 for n, _, d in plan if d == torch.float8_e4m3fn)} weights in "
                            f"float8_e4m3fn with {fp8.scheme.block[0]}x{fp8.scheme.block[1]} block scales"
                            + (" (the source's scales where the weights are unchanged)" if fp8.recorded else ""))
    elif mxfp4.recorded_scales(checkpoint.path) is not None:
        report.notes.append(f"the checkpoint came from an MXFP4 folder; written in "
                            f"{str(dtype).removeprefix('torch.')} (--quantize mxfp4 writes MXFP4)")
    elif _recorded_fp8(checkpoint):
        report.notes.append(f"the checkpoint came from an FP8 block-scaled folder; written in "
                            f"{str(dtype).removeprefix('torch.')} (--quantize fp8-block writes FP8)")
    _write_hf_configs(hf_side, out, checkpoint.family, checkpoint.config, dtype, checkpoint.head,
                      fp8.scheme.config if fp8 is not None else None)
    return report


def _recorded_fp8(checkpoint) -> bool:
    return recorded_scales(checkpoint.path) is not None


def _fp8_writer(checkpoint):
    """What ``--quantize fp8-block`` stores as FP8: the source's FP8 weights (and scales) when the checkpoint came
    from an FP8 folder, else every linear weight transformers' FP8 quantizer would convert."""
    with torch.device("meta"):
        skeleton = hf.build_hf_model(checkpoint.family, hf.hf_config_from_mcore(checkpoint.family, checkpoint.config))
    scheme = _source_scheme(checkpoint)
    scheme = scheme if scheme is not None and scheme.method == "fp8" else None
    names = [n for n, _ in checkpoint.hf_tensors(meta=True)]
    return writer_for(scheme, recorded_scales(checkpoint.path) if scheme is not None else None, skeleton, names)


def _source_scheme(checkpoint):
    """The encoding scheme the checkpoint's source folder declared (its ``hf/config.json``), if any."""
    own = checkpoint.hf_side()
    return scheme_of(read_config(own), str(own / CONFIG)) if own is not None and (own / CONFIG).is_file() else None


def _mxfp4_writer(checkpoint):
    """What ``--quantize mxfp4`` stores as MXFP4: the source's MXFP4 weights (and scales) when the checkpoint came
    from an MXFP4 folder, else every routed expert's gate_up_proj and down_proj."""
    scheme = _source_scheme(checkpoint)
    scheme = scheme if scheme is not None and scheme.method == mxfp4.METHOD else None
    names = [n for n, _ in checkpoint.hf_tensors(meta=True)]
    return mxfp4.writer_for(scheme, mxfp4.recorded_scales(checkpoint.path) if scheme is not None else None, names)


def _hf_side(checkpoint: MegatronCheckpoint, tokenizer, report: ConversionReport) -> Path | None:
    """The folder with the tokenizer files and generation_config.json that go with the HF output."""
    if tokenizer is not None:
        return Path(tokenizer)
    own = checkpoint.hf_side()
    if own is not None:
        return own
    description = getattr(checkpoint, "description", None)
    model = description.args.get("tokenizer_model") if description else None
    if model and Path(model).is_dir():
        report.notes.append(f"tokenizer: copied from {model} (args.tokenizer_model)")
        return Path(model)
    report.notes.append(f"warning: the Hugging Face output has no tokenizer: the checkpoint records none "
                        f"(args.tokenizer_model={model!r}); pass --tokenizer DIR to copy one")
    return None


def _write_hf_configs(hf_side: Path | None, out: Path, family: Family, config: McoreConfig, dtype: torch.dtype,
                      head: dict | None = None, quantization: dict | None = None) -> None:
    hf_config = hf.hf_config_from_mcore(family, config)
    hf_config.dtype = dtype
    if quantization is not None:
        hf_config.quantization_config = dict(quantization)
    elif hasattr(hf_config, "quantization_config"):  # an FP8 source's, carried in hf_extra: not these weights'
        del hf_config.quantization_config
    if not getattr(hf_config, "architectures", None):
        hf_config.architectures = [family.hf_architectures[0]] if family.hf_architectures else None
    if head:  # a reward model: *ForSequenceClassification with score.weight

        sequence_classification_config(hf_config, head)
    hf_config.save_pretrained(out)
    if hf_side is not None and generation_config_file(hf_side) is not None:
        shutil.copy2(generation_config_file(hf_side), out / GENERATION_CONFIG)
    else:
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(hf_config).save_pretrained(out)
    for file in tokenizer_files(hf_side) if hf_side is not None else ():
        shutil.copy2(file, out / file.name)


