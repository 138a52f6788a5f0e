"""Checkpoint conversion on disk: Hugging Face folder <-> Megatron-Core distributed checkpoint.

The Megatron side is pai-zoo's own ``torch_dist`` folder or any checkpoint Megatron-LM wrote (``torch_dist``
or legacy ``torch``, any layout), read from its args by :mod:`pai_zoo.megatron_lm`.

Streams tensor by tensor: a source tensor is read (memory-mapped), transformed by the
family's weight table and written; a fused tensor holds only its parts. Before anything is
written the whole conversion is rehearsed on meta tensors, so a wrong shape or a missing or
unexpected name fails fast. The output goes to a temporary folder beside ``dst`` and is
renamed into place at the end: a failed conversion leaves no partial ``dst``.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field, replace
from pathlib import Path

import torch

from . import hf
from .background import BackgroundWriter
from .checkpoint import (
    CONFIG,
    GENERATION_CONFIG,
    HFCheckpoint,
    SafetensorsWriter,
    is_hf_checkpoint,
    read_config,
    read_safetensors_header,
    tokenizer_files,
)
from .config_map import McoreConfig
from .convert_settings import DEFAULTS, QUANTIZE_CHOICES
from .errors import PaiZooError, no_such_path
from .family import Family
from .fp8_blocks import SCALES_FILE, DequantizedCheckpoint, open_weights, writer_for
from .handle import load
from .lora.export import merge_run, run_to_peft
from .lora.run import is_lora_run
from .lora.settings import LORA_RECORD, LoraError
from .mapping import TO_MCORE, MappingContext
from .mcore import dist_ckpt
from .mcore import megatron_lm_args as mla
from .mcore.heads import sequence_classification_config
from .mcore.parallel_sizes import check_layout
from .megatron_lm import is_megatron_checkpoint, is_megatron_lm_checkpoint, open_checkpoint
from .registry import get_registry
from .util.progress import Progress
from .verification import VERIFY_TOLERANCES, compare_logits, describe_verification, parse_tolerance  # noqa: F401

DTYPES = {"bf16": torch.bfloat16, "fp16": torch.float16, "fp32": torch.float32,
          "bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}


@dataclass
class ConversionReport:
    """What a conversion did: counts, sizes and, with ``verify``, the logits comparison."""

    src: Path
    dst: Path
    to: str
    family: str
    tensors: int = 0
    bytes: int = 0
    seconds: float = 0.0
    verification: dict | None = field(default=None)
    notes: list[str] = field(default_factory=list)  # what the reader assumed or took from elsewhere

    @property
    def ok(self) -> bool:
        return self.verification is None or self.verification["ok"]


def parse_dtype(value) -> torch.dtype | None:
    if value is None or isinstance(value, torch.dtype):
        return value
    try:
        return DTYPES[str(value).lower()]
    except KeyError:
        raise PaiZooError(f"unknown dtype {value!r}; use one of bf16, fp16, fp32") from None


def convert(src, dst, to: str, *, family: str | None = None, tp: int = DEFAULTS.tp, pp: int = DEFAULTS.pp,
            dtype=None, force: bool = False, max_shard_size: str | int = DEFAULTS.max_shard_size, verify: bool = False,
            progress: bool | None = None, tokenizer=None, iteration=None, verify_tolerance=None,
            ep: int = DEFAULTS.ep, etp: int | None = None, quantize: str | None = None,
            no_mtp: bool = False, merge_lora: bool = False) -> ConversionReport:
    """Convert ``src`` to ``dst``: ``to="mcore"`` (HF folder, or a Megatron-LM checkpoint -> pai-zoo's
    Megatron-Core checkpoint with a ``tp``/``pp`` layout) or ``to="hf"`` (Megatron-Core checkpoint, pai-zoo's or
    Megatron-LM's -> HF folder). ``ep``/``etp``: the expert-parallel and expert-tensor-parallel sizes a
    mixture-of-experts checkpoint is laid out for (:func:`check_expert_layout`; ``etp`` defaults to ``tp``).
    For a Megatron-LM source, ``tokenizer`` is a folder whose tokenizer files are
    copied and whose ``config.json`` (the original HF model's) supplies what the args lack; ``iteration`` picks
    a saved iteration. ``quantize="fp8-block"`` (``--to hf``) writes FP8 block-scaled weights as DeepSeek-V3 and
    Qwen3-FP8 publish them (:mod:`pai_zoo.fp8_blocks`), reusing an FP8 source's scales where they still fit; without
    it the weights are written in ``dtype`` (default: the stored one, bf16 for an FP8 source). ``verify``
    compares the logits of both sides on a sample prompt (see :func:`verify_conversion`; ``verify_tolerance``,
    ``(atol, rtol)`` or ``"ATOL[,RTOL]"``, overrides its rule). Multi-token-prediction layers (DeepSeek-V3's and
    GLM-4.5's ``num_nextn_predict_layers``) convert with the rest; ``no_mtp`` leaves them out (a note says what was
    dropped), as does an HF folder whose config counts them but whose files hold none (transformers saves none).
    A LoRA run (``train --peft lora``) converts ``to="hf-peft"`` (its adapters as a PEFT folder) or ``to="hf"`` with
    ``merge_lora`` (its base with the adapters merged)."""
    import time

    src, dst = Path(src), Path(dst)
    if not src.exists():
        raise no_such_path(src, "the checkpoint to convert",
                           hint="give a Hugging Face folder (--to mcore) or a Megatron-Core checkpoint (--to hf)")
    if not src.is_dir():
        raise PaiZooError(f"{src}: not a folder; a checkpoint to convert is a folder "
                          "(a Hugging Face one for --to mcore, a Megatron-Core one for --to hf)")
    if to not in ("mcore", "hf", "hf-peft"):
        raise PaiZooError(f"--to must be 'mcore', 'hf' or 'hf-peft', not {to!r}")
    lora_run = is_lora_run(src)
    if lora_run and not (to == "hf-peft" or (to == "hf" and merge_lora)):
        raise LoraError(f"{src}: a LoRA run holds adapters only; --to hf-peft writes them as a PEFT folder, "
                        "--to hf --merge-lora writes the base with them merged")
    if not lora_run and (to == "hf-peft" or merge_lora):
        raise LoraError(f"{src}: not a LoRA run (no {LORA_RECORD}); --to hf-peft and --merge-lora convert the folder "
                        "that train --peft lora --save wrote")
    if family is not None:
        get_registry().family(family)  # an unknown --family fails before anything is written
    if tp < 1 or pp < 1:
        raise PaiZooError(f"--tp and --pp must be positive (got tp={tp}, pp={pp})")
    if ep < 1 or (etp is not None and etp < 1):
        raise PaiZooError(f"--ep and --etp must be positive (got ep={ep}, etp={etp})")
    if to == "hf" and (ep != 1 or etp is not None):
        raise PaiZooError("--ep/--etp lay out a Megatron-Core checkpoint (--to mcore); a Hugging Face folder has "
                          "no layout, and a Megatron-Core source is read whatever EP/TP/PP layout saved it")
    experts = (ep, tp if etp is None else etp)
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise PaiZooError(f"--quantize {quantize!r} is not known; use one of {', '.join(QUANTIZE_CHOICES)}")
    if quantize is not None and to != "hf":
        raise PaiZooError("--quantize writes a quantized Hugging Face folder (--to hf); a Megatron-Core checkpoint "
                          "holds the dequantized weights (an FP8 source's scales are kept in its hf/ folder)")
    if verify_tolerance is not None:
        verify_tolerance = parse_tolerance(verify_tolerance)  # a bad --verify-tolerance fails before any work
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise no_such_path(tokenizer, "the --tokenizer folder")
    if dst.exists() and not force:
        raise PaiZooError(f"{dst} exists; pass --force to replace it")
    if dst.resolve() == src.resolve():
        raise PaiZooError(f"{dst}: the destination is the source")
    run_note = None
    if to == "hf" and not is_megatron_checkpoint(src) and is_megatron_checkpoint(src / "actor"):
        run_note = (f"{src} is an RL run folder: converting its actor, the trained policy ({src / 'actor'}); "
                    f"convert {src / 'critic'} for the critic")
        src = src / "actor"
    start = time.perf_counter()
    tmp = dst.parent / f".{dst.name}.pai-zoo-tmp-{os.getpid()}"
    if tmp.exists():
        shutil.rmtree(tmp)
    dst.parent.mkdir(parents=True, exist_ok=True)
    try:
        if lora_run:
            notes = run_to_peft(src, tmp) if to == "hf-peft" else merge_run(src, tmp, parse_dtype(dtype),
                                                                              max_shard_size)
            report = ConversionReport(src, dst, to, dist_ckpt.mcore_config_of(src)[0].family, notes=notes)
            written = list(tmp.glob("*.safetensors"))
            report.tensors = sum(sum(not k.startswith("__") for k in read_safetensors_header(f)) for f in written)
            report.bytes = sum(f.stat().st_size for f in written)
        elif to == "mcore" and is_megatron_lm_checkpoint(src):
            report = _megatron_lm_to_mcore(src, tmp, family, tp, pp, parse_dtype(dtype), progress, tokenizer,
                                           iteration, final=dst, experts=experts, no_mtp=no_mtp)
        elif to == "mcore":
            report = _hf_to_mcore(src, tmp, family, tp, pp, parse_dtype(dtype), progress, final=dst, experts=experts,
                                  no_mtp=no_mtp)
        else:
            report = _mcore_to_hf(src, tmp, family, parse_dtype(dtype), max_shard_size, progress, tokenizer,
                                  iteration, quantize, no_mtp)
        _move_into_place(tmp, dst)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    report.src, report.dst, report.seconds = src, dst, time.perf_counter() - start
    if run_note:
        report.notes.insert(0, run_note)
    if verify:
        report.verification = verify_conversion(src, dst, tokenizer=tokenizer, iteration=iteration,
                                                tolerance=verify_tolerance)
    return report


def _move_into_place(tmp: Path, dst: Path) -> None:
    if dst.exists():
        old = dst.parent / f".{dst.name}.pai-zoo-old-{os.getpid()}"
        dst.rename(old)
        tmp.rename(dst)
        shutil.rmtree(old) if old.is_dir() else old.unlink()
    else:
        tmp.rename(dst)


def _family_for(config: dict, where: Path, name: str | None) -> Family:
    registry = get_registry()
    return registry.family(name) if name else registry.family_for_hf_config(config, where=str(where))


# -- HF -> Megatron-Core ------------------------------------------------------------------------
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
    width = int(config.get("moe_ffn_hidden_size") or config["ffn_hidden_size"])
    if width % etp:
        valid = ", ".join(str(n) for n in range(1, min(width, 64) + 1) if width % n == 0)
        raise PaiZooError(f"--etp {etp} does not divide the experts' FFN width {width} (moe_ffn_hidden_size); "
                          f"valid --etp: {valid}")


def _hf_to_mcore(src: Path, out: Path, family_name, tp: int, pp: int, dtype, progress,
                 final: Path | None = None, experts: tuple[int, int] = (1, 1),
                 no_mtp: bool = False) -> ConversionReport:
    if not is_hf_checkpoint(src):
        raise PaiZooError(f"{src}: not a Hugging Face checkpoint folder (no {CONFIG})")
    raw_config = read_config(src)
    family = _family_for(raw_config, src / CONFIG, family_name)
    config = family.to_mcore_config(hf.config_dict(hf.hf_config(family, raw_config)))
    check_layout(config, tp, pp)  # an invalid --tp/--pp names the valid ones
    check_expert_layout(config, *experts)
    source = open_weights(src, dtype)
    try:
        config, dropped, note = mtp_choice(src, family, config, source.names(), no_mtp)
        report = _write_mcore(src, out, family, config, source, tp, pp, dtype, progress, final, experts, dropped)
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
    src: Path, out: Path, family: Family, config: McoreConfig, source: HFCheckpoint, tp, pp, dtype, progress,
    final: Path | None = None, experts: tuple[int, int] = (1, 1), dropped_mtp: int = 0,
):
    """Write ``out`` (renamed to ``final`` afterwards: the folder Megatron-LM's ``--load`` is given).

    The tensors are stored as megatron-core's ``sharded_state_dict`` names them: global tensors, each routed
    expert a slice of its layer's expert axis (the chunk an expert-parallel rank saves for it), so any EP/TP/PP
    layout loads them; ``tp``, ``pp`` and ``experts`` (EP, ETP) are the layout recorded in the args and
    ``pai_zoo.json`` (Megatron-LM's ``--use-checkpoint-args``)."""
    dtype = dtype or _floating_dtype(source)
    padded = config.padded_vocab_size(tp)
    layout = dist_ckpt.layout_of(family, config, dtype, padded)
    table = get_registry().weight_map(family, config)
    ctx = replace(MappingContext.from_config(config, padded_vocab_size=padded).named_as(layout.local_shapes),
                  dropped_mtp_layers=dropped_mtp)
    # Rehearse on meta tensors: names, coverage and shapes are checked before writing.
    for _ in table.iter_convert(TO_MCORE, ctx, source.meta, source.names(), layout.local_shapes):
        pass
    writer = dist_ckpt.DistCheckpointWriter(out / dist_ckpt.RELEASE)
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
    final = Path(final or out).resolve()
    tokenizer_model = str(final / dist_ckpt.HF_DIR) if tokenizer_files(src) else None
    args = mla.megatron_lm_args(config, tp, pp, padded, dtype, tokenizer_model=tokenizer_model)
    if config.get("num_moe_experts"):
        args.expert_model_parallel_size, args.expert_tensor_parallel_size = experts
    writer.finish({"args": args, "checkpoint_version": 3.0, "iteration": 0})
    (out / dist_ckpt.TRACKER).write_text(dist_ckpt.RELEASE)
    dist_ckpt.write_pai_zoo_config(out, config, tp, pp, dtype, padded, experts=experts)
    _copy_hf_side(src, out / dist_ckpt.HF_DIR)
    if isinstance(source, DequantizedCheckpoint):
        from safetensors.torch import save_file

        save_file(source.scales(), str(out / dist_ckpt.HF_DIR / SCALES_FILE))
        report.notes.append(f"FP8 block-scaled source: {len(source.quantized)} weights dequantized to "
                            f"{str(dtype).removeprefix('torch.')}; their scales are kept in "
                            f"{dist_ckpt.HF_DIR}/{SCALES_FILE} (convert --to hf --quantize fp8-block writes them back)")
    mla.write_readme(out, config, args, load_dir=final)
    report.notes.append("Megatron-LM: add " + mla.load_command(final, config, dtype))
    return report


def _floating_dtype(source: HFCheckpoint) -> torch.dtype:
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


# -- Megatron-Core -> HF ------------------------------------------------------------------------
def _mcore_to_hf(src: Path, out: Path, family_name, dtype, max_shard_size, progress, tokenizer=None,
                 iteration=None, quantize: str | None = None, no_mtp: bool = False) -> ConversionReport:
    if not is_megatron_checkpoint(src):
        hint = " (it is a Hugging Face folder: use --to mcore)" if is_hf_checkpoint(src) else ""
        raise PaiZooError(f"{src}: not a Megatron-Core checkpoint folder (no {dist_ckpt.TRACKER}, no release/ or "
                          f"iter_*/ folder){hint}")
    with open_checkpoint(src, family_name, reference=tokenizer, iteration=iteration) as checkpoint:
        if no_mtp:
            checkpoint.drop_mtp()
        return _write_hf(checkpoint, out, dtype or checkpoint.stored_dtype, max_shard_size, progress, tokenizer,
                         quantize)


def _megatron_lm_to_mcore(src: Path, out: Path, family_name, tp, pp, dtype, progress, tokenizer,
                          iteration, final: Path | None = None, experts: tuple[int, int] = (1, 1),
                          no_mtp: bool = False) -> ConversionReport:
    """A Megatron-LM checkpoint re-laid out as pai-zoo's: through a Hugging Face folder inside ``out``."""
    staging = out / ".hf-staging"
    first = _mcore_to_hf(src, staging, family_name, dtype, DEFAULTS.max_shard_size, progress, tokenizer, iteration,
                         no_mtp=no_mtp)
    report = _hf_to_mcore(staging, out, first.family, tp, pp, dtype, progress, final, experts)
    shutil.rmtree(staging)
    report.notes = first.notes + report.notes
    return report


def _write_hf(checkpoint: dist_ckpt.MegatronCheckpoint, out: Path, dtype, max_shard_size, progress,
              tokenizer=None, quantize: str | None = None) -> ConversionReport:
    tied = set(checkpoint.table.tied_outputs(checkpoint.ctx))
    fp8 = _fp8_writer(checkpoint) if quantize == "fp8-block" else None
    plan = [(n, tuple(t.shape), dtype) for n, t in checkpoint.hf_tensors(meta=True) if n not in tied]
    if fp8 is not None:
        plan = [entry for n, shape, d in plan for entry in fp8.plan(n, shape, d)]
    out.mkdir(parents=True)
    writer = SafetensorsWriter(out, plan, max_shard_size)
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
    writer.close()
    bar.close()
    hf_side = _hf_side(checkpoint, tokenizer, report)
    if fp8 is not None:
        report.notes.append(f"FP8 block-scaled: {sum(1 for n, _, d in plan if d == torch.float8_e4m3fn)} weights in "
                            f"float8_e4m3fn with {fp8.scheme.block[0]}x{fp8.scheme.block[1]} block scales"
                            + (" (the source's scales where the weights are unchanged)" if fp8.recorded else ""))
    elif _recorded_fp8(checkpoint):
        report.notes.append(f"the checkpoint came from an FP8 block-scaled folder; written in "
                            f"{str(dtype).removeprefix('torch.')} (--quantize fp8-block writes FP8)")
    _write_hf_configs(hf_side, out, checkpoint.family, checkpoint.config, dtype, checkpoint.head,
                      fp8.scheme.config if fp8 is not None else None)
    return report


def _recorded_fp8(checkpoint) -> bool:
    return (checkpoint.path / dist_ckpt.HF_DIR / SCALES_FILE).is_file()


def _fp8_writer(checkpoint):
    """What ``--quantize fp8-block`` stores as FP8: the source's FP8 weights (and scales) when the checkpoint came
    from an FP8 folder, else every linear weight transformers' FP8 quantizer would convert."""
    with torch.device("meta"):
        skeleton = hf.build_hf_model(checkpoint.family, hf.hf_config_from_mcore(checkpoint.family, checkpoint.config))
    own = checkpoint.path / dist_ckpt.HF_DIR
    names = [n for n, _ in checkpoint.hf_tensors(meta=True)]
    return writer_for(own if own.is_dir() else None, skeleton, names)


def _hf_side(checkpoint: dist_ckpt.MegatronCheckpoint, tokenizer, report: ConversionReport) -> Path | None:
    """The folder with the tokenizer files and generation_config.json that go with the HF output."""
    if tokenizer is not None:
        return Path(tokenizer)
    own = checkpoint.path / dist_ckpt.HF_DIR
    if own.is_dir():
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
    if hf_side is not None and (hf_side / GENERATION_CONFIG).is_file():
        shutil.copy2(hf_side / GENERATION_CONFIG, out / GENERATION_CONFIG)
    else:
        from transformers import GenerationConfig

        GenerationConfig.from_model_config(hf_config).save_pretrained(out)
    for file in tokenizer_files(hf_side) if hf_side is not None else ():
        shutil.copy2(file, out / file.name)


# -- verification -------------------------------------------------------------------------------
SAMPLE_PROMPT_LENGTH = 32

_DTYPE_NAMES = {torch.float32: "fp32", torch.float16: "fp16", torch.bfloat16: "bf16"}
#: coarsest first: the dtype that limits a comparison of two stored dtypes
_COARSEST = ("bf16", "fp16", "fp32")


def _stored_dtype(path: Path, tokenizer=None, iteration=None) -> torch.dtype:
    if is_hf_checkpoint(path):
        source = open_weights(path)
        try:
            return _floating_dtype(source)
        finally:
            source.close()
    with open_checkpoint(path, None, reference=tokenizer, iteration=iteration) as checkpoint:
        return checkpoint.stored_dtype


def verification_dtype(src, dst, tokenizer=None, iteration=None) -> str:
    """The dtype whose tolerance applies to ``src`` vs ``dst`` compared in float32: ``fp32`` when both store
    the same dtype (the same weights), else the coarser of the two (the conversion rounded every weight)."""
    names = set()
    for path, options in ((Path(src), {"tokenizer": tokenizer, "iteration": iteration}), (Path(dst), {})):
        try:
            names.add(_DTYPE_NAMES.get(_stored_dtype(path, **options), "fp32"))
        except (PaiZooError, OSError):  # unreadable here: the strict fp32 rule
            names.add("fp32")
    return "fp32" if len(names) == 1 else next(n for n in _COARSEST if n in names)


def verify_conversion(src, dst, tokenizer=None, iteration=None, tolerance=None, dtype=None) -> dict:
    """Load both sides in float32 (HF with transformers, megatron-core with megatron-core's own
    loader), run a sample prompt, and compare the logits (:func:`compare_logits`: within
    ``atol + rtol * max |logits|``, :data:`VERIFY_TOLERANCES` for ``dtype``, default
    :func:`verification_dtype`; ``tolerance`` = ``(atol, rtol)`` or ``"ATOL[,RTOL]"`` overrides)."""

    src, dst = Path(src), Path(dst)
    hf_side, mcore_side = (src, dst) if is_hf_checkpoint(src) else (dst, src)
    if dtype is None and tolerance is None:
        dtype = verification_dtype(src, dst, tokenizer, iteration)
    reference = load(hf_side, backend="hf", dtype=torch.float32)
    options = {"tokenizer": tokenizer, "iteration": iteration} if mcore_side == src else {}
    candidate = load(mcore_side, backend="mcore", dtype=torch.float32, **options)
    vocab = candidate.vocab_size
    ids = torch.randint(0, vocab, (1, SAMPLE_PROMPT_LENGTH), generator=torch.Generator().manual_seed(0))
    if reference.tokenizer is not None:
        text = "The quick brown fox jumps over the lazy dog. Megatron-Core checkpoints convert both ways."
        encoded = reference.tokenizer.encode(text)[:SAMPLE_PROMPT_LENGTH]
        if encoded and max(encoded) < vocab:
            ids = torch.tensor([encoded])
    return compare_logits(reference.logits(ids), candidate.logits(ids), dtype or "fp32", tolerance)
