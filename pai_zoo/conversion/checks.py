"""What ``pai-zoo convert`` refuses before it imports torch or megatron-core or reads a tensor: the source, the flags
that go together, the ``--tokenizer`` folder and the destination (:func:`pai_zoo.util.outputs.check_output`: exists
without ``--force``, not writable, too little free space). :func:`pai_zoo.conversion.entry.convert` runs it first;
the CLI runs it before it imports the conversion."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from .. import formats
from ..families.registry import get_registry
from ..formats import training_run
from ..formats.base import weight_files_in
from ..formats.megatron_folder import RELEASE, TRACKER
from ..lora.settings import LoraError
from ..models.verification import parse_tolerance
from ..plugin.errors import PaiZooError, no_such_path
from ..util.outputs import check_output
from .settings import QUANTIZE_CHOICES


@dataclass
class Request:
    """A checked conversion: the source (an RL run's actor for ``--to hf``), its format, whether it is a LoRA run,
    the tolerance of ``--verify`` as numbers, and a note to print first (or None)."""

    src: Path
    dst: Path
    kind: str | None
    lora_run: bool
    verify_tolerance: tuple[float, float] | None
    run_note: str | None


def check_request(src, dst, to: str, *, family=None, tp: int = 1, pp: int = 1, dtype=None, force: bool = False,
                  tokenizer=None, iteration=None, verify_tolerance=None, ep: int = 1, etp: int | None = None,
                  quantize: str | None = None, merge_lora: bool = False) -> Request:
    """Everything :func:`~pai_zoo.conversion.entry.convert` refuses before any work, in the order it does; its
    arguments as for it."""
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
    return Request(src, dst, kind, lora_run, verify_tolerance, run_note)


def _estimated_bytes(src: Path, kind: str | None) -> int | None:
    """The bytes a conversion of ``src`` writes at least (its weight files), where they are easy to find: a
    Hugging Face folder's, or pai-zoo's ``release/`` iteration; None otherwise."""
    folder = src if kind == "hf" else src / RELEASE if kind in formats.PAI_ZOO_MCORE else None
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
