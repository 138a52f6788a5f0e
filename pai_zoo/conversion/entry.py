"""Checkpoint conversion on disk: Hugging Face folder <-> Megatron-Core distributed checkpoint.

The Megatron side is pai-zoo's own ``torch_dist`` folder or any checkpoint Megatron-LM wrote (``torch_dist``
or legacy ``torch``, any layout), read from its args. Which format ``src`` is, and every read and write, is
:mod:`pai_zoo.formats`': :mod:`.to_mcore` and :mod:`.to_hf` stream tensor by tensor through the family's weight
table into a format's writer, which stages the folder beside ``dst`` and publishes it whole at the end, so a failed
conversion leaves no partial ``dst``. :mod:`.verify` compares the two sides' logits (``--verify``); a LoRA run
converts through :mod:`.lora_export`.
"""
from __future__ import annotations

import shutil
from pathlib import Path

from .. import formats
from ..families.registry import get_registry
from ..formats import mcore_dist, training_run
from ..formats.base import FolderWriter, weight_files_in
from ..formats.hf_folder import HFFolderWriter, read_safetensors_header
from ..formats.mcore_dist import McoreDistWriter
from ..formats.megatron_folder import TRACKER
from ..lora.settings import LoraError
from ..models.verification import describe_verification, parse_tolerance
from ..plugin.errors import PaiZooError, no_such_path
from ..util.outputs import check_output
from .lora_export import merge_run, run_to_peft
from .report import ConversionReport, parse_dtype
from .settings import DEFAULTS, QUANTIZE_CHOICES
from .to_hf import mcore_to_hf
from .to_mcore import check_expert_layout, hf_to_mcore, mtp_choice
from .verify import verify_conversion

__all__ = ["ConversionReport", "check_expert_layout", "convert", "describe_verification", "mtp_choice",
           "verify_conversion"]


def convert(src, dst, to: str, *, family: str | None = None, tp: int = DEFAULTS.tp, pp: int = DEFAULTS.pp,
            dtype=None, force: bool = False, max_shard_size: str | int = DEFAULTS.max_shard_size, verify: bool = False,
            progress: bool | None = None, tokenizer=None, iteration=None, verify_tolerance=None,
            ep: int = DEFAULTS.ep, etp: int | None = None, quantize: str | None = None,
            no_mtp: bool = False, merge_lora: bool = False) -> ConversionReport:
    """Convert ``src`` to ``dst``: ``to="mcore"`` (HF folder, or a Megatron-LM checkpoint -> pai-zoo's Megatron-Core
    checkpoint with a ``tp``/``pp`` layout) or ``to="hf"`` (Megatron-Core checkpoint, pai-zoo's or Megatron-LM's ->
    HF folder). ``ep``/``etp``: the expert-parallel and expert-tensor-parallel sizes a mixture-of-experts checkpoint
    is laid out for (:func:`check_expert_layout`; ``etp`` defaults to ``tp``, 1 for experts with biases). For a
    Megatron-LM source, ``tokenizer`` is a folder whose tokenizer files are copied and whose ``config.json`` (the
    original HF model's) supplies what the args lack; ``iteration`` picks a saved iteration.
    ``quantize="fp8-block"`` (``--to hf``) writes FP8 block-scaled weights as DeepSeek-V3 and Qwen3-FP8 publish them
    (:mod:`pai_zoo.formats.encodings.fp8_blocks`), reusing an FP8 source's scales where they still fit;
    ``quantize="mxfp4"`` writes gpt-oss's MXFP4 experts (:mod:`pai_zoo.formats.encodings.mxfp4`); without it
    the weights are written in ``dtype`` (default: the stored one, bf16 for an FP8 source). ``verify`` compares the
    logits of both sides on a sample prompt (see :func:`verify_conversion`; ``verify_tolerance``, ``(atol, rtol)``
    or ``"ATOL[,RTOL]"``, overrides its rule). Multi-token-prediction layers (DeepSeek-V3's and GLM-4.5's
    ``num_nextn_predict_layers``) convert with the rest; ``no_mtp`` leaves them out (a note says what was dropped),
    as does an HF folder whose config counts them but whose files hold none (transformers saves none). A LoRA run
    (``train --peft lora``) converts ``to="hf-peft"`` (its adapters as a PEFT folder) or ``to="hf"`` with
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
    kind = _format_of(src, iteration)
    lora_run = kind == "lora-run"
    if lora_run and not (to == "hf-peft" or (to == "hf" and merge_lora)):
        raise LoraError(f"{src}: a LoRA run holds adapters only; --to hf-peft writes them as a PEFT folder, "
                        "--to hf --merge-lora writes the base with them merged")
    if not lora_run and (to == "hf-peft" or merge_lora):
        raise LoraError(f"{src}: not a LoRA run (no {training_run.LORA_RECORD}); --to hf-peft and --merge-lora "
                        "convert the folder "
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
    experts = (ep, etp)  # etp None: tp, or 1 for biased experts (hf_to_mcore)
    if quantize is not None and quantize not in QUANTIZE_CHOICES:
        raise PaiZooError(f"--quantize {quantize!r} is not known; use one of {', '.join(QUANTIZE_CHOICES)}")
    if quantize is not None and to != "hf":
        raise PaiZooError("--quantize writes a quantized Hugging Face folder (--to hf); a Megatron-Core checkpoint "
                          "holds the dequantized weights (an FP8 source's scales are kept in its hf/ folder)")
    if verify_tolerance is not None:
        verify_tolerance = parse_tolerance(verify_tolerance)  # a bad --verify-tolerance fails before any work
    if tokenizer is not None and not Path(tokenizer).is_dir():
        raise no_such_path(tokenizer, "the --tokenizer folder")
    if dst.resolve() == src.resolve():
        raise PaiZooError(f"{dst}: the destination is the source")
    # exists without --force, not writable, too little free space: refused before anything is read
    check_output(dst, force=force, kind="folder", flag="DST",
                 need_bytes=_estimated_bytes(src, kind) if dtype is None and quantize is None else None)
    run_note = None
    if to == "hf" and kind == "rl-run":
        run_note = (f"{src} is an RL run folder: converting its actor, the trained policy ({src / 'actor'}); "
                    f"convert {src / 'critic'} for the critic")
        src = training_run.rl_model(src)
        kind = _format_of(src, iteration)
    if to == "hf" and kind not in formats.MEGATRON_LM + formats.PAI_ZOO_MCORE and not lora_run:
        hint = " (it is a Hugging Face folder: use --to mcore)" if kind == "hf" else ""
        raise PaiZooError(f"{src}: not a Megatron-Core checkpoint folder (no {TRACKER}, no release/ or "
                          f"iter_*/ folder){hint}")
    start = time.perf_counter()
    writer = (HFFolderWriter if to == "hf" and not lora_run else McoreDistWriter if to == "mcore"
              else FolderWriter)(dst, force=True)
    try:
        if lora_run:
            shutil.rmtree(writer.staging)  # the LoRA exports create their folder
            notes = (run_to_peft(src, writer.staging) if to == "hf-peft"
                     else merge_run(src, writer.staging, parse_dtype(dtype), max_shard_size))
            report = ConversionReport(src, dst, to, mcore_dist.mcore_config_of(src)[0].family, notes=notes)
            written = list(writer.staging.glob("*.safetensors"))
            report.tensors = sum(sum(not k.startswith("__") for k in read_safetensors_header(f)) for f in written)
            report.bytes = sum(f.stat().st_size for f in written)
        elif to == "mcore" and kind in formats.MEGATRON_LM:
            report = _megatron_lm_to_mcore(src, writer, family, tp, pp, parse_dtype(dtype), progress, tokenizer,
                                           iteration, experts=experts, no_mtp=no_mtp)
        elif to == "mcore":
            report = hf_to_mcore(src, writer, family, tp, pp, parse_dtype(dtype), progress, experts=experts,
                                 no_mtp=no_mtp)
        else:
            report = mcore_to_hf(src, writer, family, parse_dtype(dtype), max_shard_size, progress, tokenizer,
                                 iteration, quantize, no_mtp)
        writer.close()
    except BaseException as exc:
        error = writer.fail(exc)  # the staging folder removed; a full disk is one line naming the mount point
        if error is not None:
            raise error from exc
        raise
    report.src, report.dst, report.seconds = src, dst, time.perf_counter() - start
    if run_note:
        report.notes.insert(0, run_note)
    if verify:
        report.verification = verify_conversion(src, dst, tokenizer=tokenizer, iteration=iteration,
                                                tolerance=verify_tolerance)
    return report


def _estimated_bytes(src: Path, kind: str | None) -> int | None:
    """The bytes a conversion of ``src`` writes at least (its weight files), where they are easy to find: a
    Hugging Face folder's, or pai-zoo's ``release/`` iteration; None otherwise."""
    folder = src if kind == "hf" else src / mcore_dist.RELEASE if kind in formats.PAI_ZOO_MCORE else None
    if folder is None or not folder.is_dir():
        return None
    files = weight_files_in(folder)
    files = [f for f in files if f.suffix == ".safetensors"] or files  # not also a folder's pytorch_model.bin
    return sum(f.stat().st_size for f in files)


def _format_of(path: Path, iteration=None) -> str | None:
    """The format :func:`pai_zoo.formats.detect` finds, ``None`` where none fits (the callers say what they need);
    a damaged folder of a known format raises that format's error."""
    try:
        return formats.detect(path, iteration=iteration)
    except formats.UnknownFormatError:
        return None


def _megatron_lm_to_mcore(src: Path, writer: McoreDistWriter, family_name, tp, pp, dtype, progress, tokenizer,
                          iteration, experts: tuple[int, int] = (1, 1), no_mtp: bool = False) -> ConversionReport:
    """A Megatron-LM checkpoint re-laid out as pai-zoo's: through a Hugging Face folder staged beside it."""
    # inside the checkpoint's own staging folder: a killed run leaves nothing the next run does not remove
    staging = HFFolderWriter(writer.staging / ".hf-staging", force=True)
    try:
        first = mcore_to_hf(src, staging, family_name, dtype, DEFAULTS.max_shard_size, progress, tokenizer,
                            iteration, no_mtp=no_mtp)
        folder = staging.close()
        report = hf_to_mcore(folder, writer, first.family, tp, pp, dtype, progress, experts)
    finally:
        staging.abort()
        shutil.rmtree(staging.dst, ignore_errors=True)
    report.notes = first.notes + report.notes
    return report
