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
from ..formats import mcore_dist
from ..formats.base import FolderWriter
from ..formats.hf_folder import HFFolderWriter, read_safetensors_header
from ..formats.mcore_dist import McoreDistWriter
from ..models.verification import describe_verification
from ..util.hub import hub_paths
from .checks import check_request
from .lora_export import merge_run, run_to_peft
from .report import ConversionReport, parse_dtype
from .settings import DEFAULTS
from .to_hf import mcore_to_hf
from .to_mcore import check_expert_layout, hf_to_mcore, mtp_choice
from .verify import verify_conversion

__all__ = ["ConversionReport", "check_expert_layout", "convert", "describe_verification", "mtp_choice",
           "verify_conversion"]


def convert(src, dst, to: str, *, family: str | None = None, tp: int = DEFAULTS.tp, pp: int = DEFAULTS.pp,
            dtype=None, force: bool = False, max_shard_size: str | int = DEFAULTS.max_shard_size, verify: bool = False,
            progress: bool | None = None, tokenizer=None, iteration=None, verify_tolerance=None,
            ep: int = DEFAULTS.ep, etp: int | None = None, quantize: str | None = None,
            no_mtp: bool = False, merge_lora: bool = False, revision: str | None = None) -> ConversionReport:
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
    ``merge_lora`` (its base with the adapters merged). ``src`` (and ``tokenizer``) may be a Hugging Face Hub id,
    ``"org/name"``: its snapshot in the Hugging Face cache, downloaded when missing, at ``revision``
    (:mod:`pai_zoo.util.hub`)."""
    import time

    src, tokenizer = hub_paths(revision, src, tokenizer=tokenizer)

    request = check_request(src, dst, to, family=family, tp=tp, pp=pp, dtype=dtype, force=force, tokenizer=tokenizer,
                            iteration=iteration, verify_tolerance=verify_tolerance, ep=ep, etp=etp, quantize=quantize,
                            merge_lora=merge_lora)  # refused before any work
    src, dst, kind, lora_run = request.src, request.dst, request.kind, request.lora_run
    verify_tolerance, run_note = request.verify_tolerance, request.run_note
    experts = (ep, etp)  # etp None: tp, or 1 for biased experts (hf_to_mcore)
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
