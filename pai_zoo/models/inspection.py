"""``inspect``: what a checkpoint folder holds, whoever wrote it (Hugging Face, pai-zoo, Megatron-LM), and what a
conversion of it would need. Every file's size is checked against its index or metadata first
(:func:`pai_zoo.formats.integrity.verify_checkpoint`: a truncated or missing file is an error naming it), and the
tokenizer against the config (:func:`pai_zoo.models.tokenizer_fit.folder_misfit`); otherwise it reads headers, args
and shapes only, never the tensors' data, unless ``deep`` (every tensor read and checked finite)."""
from __future__ import annotations

import math
from pathlib import Path

from .. import formats
from ..families.registry import get_registry
from ..formats.hf_folder import CONFIG, read_config, tokenizer_files
from ..formats.integrity import deep_check, verify_checkpoint
from ..formats.megatron_folder import HF_DIR, TRACKER
from ..hf.config_cache import full_config_dict
from ..plugin.errors import PaiZooError, no_such_path
from ..tables.layer_kinds import layers_line
from ..tables.mapping import MappingContext
from ..tokenizers.fit import TokenizerMismatchError, tokenizer_side
from ..tokenizers.names import TokenizerRef
from ..util.hub import hub_paths
from . import inspection_fast
from .inspection_report import SHOWN, Inspection, _architecture, _vision_line
from .tokenizer_fit import fit_notes, folder_misfit

__all__ = ["SHOWN", "Inspection", "inspect_checkpoint"]


def inspect_checkpoint(path, *, family: str | None = None, tokenizer=None, iteration=None, deep: bool = False,
                       tokenizer_mismatch_ok: bool = False, revision: str | None = None) -> Inspection:
    """Describe the checkpoint folder ``path``; ``family``, ``tokenizer`` and ``iteration`` as for ``convert``.
    Its files are checked against their indexes and metadata first (``deep``: every tensor read and checked
    finite); a tokenizer that does not fit the config is a
    :class:`~pai_zoo.tokenizers.fit.TokenizerMismatchError` unless ``tokenizer_mismatch_ok``. A Hugging Face Hub
    id (``"org/name"``) is its snapshot in the Hugging Face cache at ``revision`` (:mod:`pai_zoo.util.hub`)."""
    path, tokenizer = hub_paths(revision, path, tokenizer=tokenizer)
    path = Path(path)
    if not path.exists():
        raise no_such_path(path, "the checkpoint to inspect")
    try:
        kind = formats.detect(path, iteration=iteration)
    except formats.UnknownFormatError:
        kind = None
    if kind == "rl-run":
        path, kind = path / "actor", formats.detect(path / "actor", iteration=iteration)
    if kind not in formats.PAI_ZOO_MCORE + formats.MEGATRON_LM + ("hf",):
        raise PaiZooError(f"{path}: not a checkpoint folder: no {CONFIG} (Hugging Face) and no "
                          f"{TRACKER}, release/ or iter_*/ (Megatron)")
    verified = verify_checkpoint(path, kind, iteration)  # before anything is described: a missing file is named
    if kind == "hf":
        report, fit = _hf(path, family)
    else:
        report, fit = (inspection_fast.fast_megatron(path, kind, family, tokenizer, iteration)  # without torch
                       or _megatron(path, family, tokenizer, iteration))
    report.tokenizer = _tokenizer_line(path, fit, tokenizer_mismatch_ok)
    if deep:
        verified.tensors = deep_check(path, kind, iteration)
    report.verified = verified.line()
    return report


def _tokenizer_line(path: Path, fit, ok: bool) -> str | None:
    """``fit``: (tokenizer folder, family, vocab_size, config folder, given) or None (no tokenizer files)."""
    if fit is None:
        return None
    folder, family, vocab_size, config_folder, given = fit
    tokenizer = TokenizerRef(str(folder), family.name).load()
    line = folder_misfit(tokenizer, str(path), vocab_size, config_folder, given=given)
    if line is None:
        notes = "".join(f"; note: {n}" for n in fit_notes(tokenizer, vocab_size, config_folder))
        return f"{tokenizer_side(tokenizer)}: fits the model (vocab_size {vocab_size}){notes}"
    if not ok:
        raise TokenizerMismatchError(line)
    return "DOES NOT FIT: " + line.split(": ", 1)[1].rsplit("; a tokenizer of another model?", 1)[0]


def _hf(path: Path, family_name: str | None) -> tuple[Inspection, tuple | None]:
    registry = get_registry()
    raw = read_config(path)
    family = registry.family(family_name) if family_name else registry.family_for_hf_config(raw, str(path / CONFIG))
    config = family.to_mcore_config(full_config_dict(family, raw))  # cached: transformers only the first time
    decoded = formats.open_checkpoint(path, format="hf")  # an encoding's decoder checks it, reading headers only
    weights = getattr(decoded, "source", decoded)  # the tensors as stored
    quantization = None
    try:
        if decoded is not weights:
            scheme = decoded.scheme
            scales = set(decoded.quantized.values())
            quantization = (f"FP8 block-scaled: {len(decoded.quantized)} weights float8_e4m3fn with "
                            f"{scheme.block[0]}x{scheme.block[1]} blocks of float32 weight_scale_inv "
                            f"(quant_method fp8); they read as {str(decoded.out_dtype).removeprefix('torch.')}")
        else:
            scales = set()
        metas = [weights.spec(n) for n in weights.names() if n not in scales]  # from the headers: no torch
        names = list(weights.names())
    finally:
        decoded.close()
    dtypes = sorted({str(m.dtype).removeprefix("torch.") for m in metas})
    needs = [] if tokenizer_files(path) else ["the folder has no tokenizer files: `preprocess` and `generate` "
                                              "need --tokenizer DIR"]
    mtp = _hf_mtp(family, config, names, needs)
    tower = None
    if family.vision is not None:  # the HF names the table maps onto the tower's
        table = registry.weight_map(family, config)
        prefix, projector = family.vision.tower_prefix, family.vision.projector_prefix
        rows = [r for r in table.rows if any(m.startswith(prefix) for m in r.mcore)]
        hf_tower = {h for r in rows for h in r.hf}
        hf_projector = {h for r in rows for h in r.hf if projector and any(m.startswith(projector) for m in r.mcore)}
        by_name = dict(zip([n for n in names if n not in scales], metas))
        tower = _vision_line(family, sum(by_name[n].numel() for n in hf_tower if n in by_name),
                             sum(by_name[n].numel() for n in hf_projector if n in by_name))
    fit = (path, family, config["vocab_size"], path, False) if tokenizer_files(path) else None
    return Inspection(path, f"Hugging Face ({weights.storage})", family.name, sum(m.numel() for m in metas),
                      "/".join(dtypes), architecture=_architecture(config.arch), needs=needs,
                      quantization=quantization, mtp=mtp, vision=tower, layers=layers_line(config.arch)), fit


def _hf_mtp(family, config, names, needs: list[str]) -> str | None:
    """What the HF folder holds of the config's multi-token-prediction layers (a conversion need if none)."""
    layers = int(config.get("mtp_num_layers") or 0)
    if not layers:
        return None
    table = get_registry().weight_map(family, config)
    ctx = MappingContext.from_config(config)
    held = table.mtp_layers_held(ctx, names)
    first = table.mtp.hf_prefix(ctx, 0)
    if not held:
        needs.append(f"config.json counts {layers} MTP layer(s) but the folder holds no {first}* tensors: convert "
                     "leaves them out")
        return f"{layers} in config.json, none in the files"
    count = sum(1 for n in names if n.startswith(tuple(table.mtp.hf_prefix(ctx, i) for i in range(held))))
    return f"{held} ({first}*{'' if held == 1 else ' ...'}: {count} tensors -> mtp.layers.*)"


def _megatron(path: Path, family: str | None, tokenizer, iteration) -> tuple[Inspection, tuple | None]:
    from .megatron_checkpoint import open_megatron  # megatron-core: only for a Megatron checkpoint

    with open_megatron(path, family, reference=tokenizer, iteration=iteration) as checkpoint:
        description = getattr(checkpoint, "description", None)
        layout = checkpoint.layout
        parameters = sum(math.prod(s) for s in layout.local_shapes.values())
        record = checkpoint.record
        if description is None:
            fmt, it = "torch_dist (written by pai-zoo)", None
            shape = {"tensor_parallel": record.get("tensor_parallel"),
                     "pipeline_parallel": record.get("pipeline_parallel")}
        else:
            fmt = f"{description.iteration.format} (written by Megatron-LM: no pai_zoo.json, read from its args)"
            it, shape = description.iteration.iteration, description.layout
        needs = [n.removeprefix("note: ") for n in checkpoint.notes]
        if description is not None and tokenizer is None and description.derived.reference is None:
            needs.append("the checkpoint records no tokenizer folder: pass --tokenizer DIR (the original HF folder) "
                         "to copy its tokenizer and take the fields Megatron does not store")
        layers = int(checkpoint.config.get("mtp_num_layers") or 0)
        mtp = None
        if layers:
            count = sum(1 for n in layout.local_shapes if n.startswith("mtp."))
            mtp = f"{layers} (mtp.layers.*: {count} tensors)"
        spec = checkpoint.family.vision
        vision = None
        if spec is not None:
            shapes = layout.local_shapes
            vision = _vision_line(checkpoint.family, sum(math.prod(s) for n, s in shapes.items()
                                                        if n.startswith(spec.tower_prefix)),
                                  sum(math.prod(s) for n, s in shapes.items()
                                      if spec.projector_prefix and n.startswith(spec.projector_prefix)))
        files = Path(tokenizer) if tokenizer else (
            path / HF_DIR if description is None else description.derived.reference)
        fit = None
        if files is not None and Path(files).is_dir() and tokenizer_files(files):
            fit = (Path(files), checkpoint.family, checkpoint.config["vocab_size"], Path(files),
                   description is not None)
        return Inspection(path, fmt, checkpoint.family.name, parameters,
                          str(checkpoint.stored_dtype).removeprefix("torch."), it, shape,
                          _architecture(checkpoint.config.arch), needs, mtp=mtp, vision=vision,
                          layers=layers_line(checkpoint.config.arch)), fit
