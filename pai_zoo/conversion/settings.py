"""The defaults of :func:`pai_zoo.conversion.entry.convert`'s options: one source for the function and
``pai-zoo convert``'s flags (the CLI reads them here, without importing the conversion machinery and torch)."""
from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class ConvertSettings:
    """Layout and output options of a conversion, with their defaults."""

    tp: int = 1  #: tensor-parallel size the Megatron-Core checkpoint is laid out for
    pp: int = 1  #: pipeline-parallel size
    ep: int = 1  #: expert-parallel size (mixture-of-experts models)
    max_shard_size: str = "5GB"  #: largest safetensors shard written by ``to="hf"``


DEFAULTS = ConvertSettings()

#: ``convert --quantize`` choices (:mod:`pai_zoo.formats.encodings.fp8_blocks`, :mod:`pai_zoo.formats.encodings.mxfp4`).
QUANTIZE_CHOICES = ("fp8-block", "mxfp4")
