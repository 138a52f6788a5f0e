"""L7, conversion: ``pai-zoo convert`` (:mod:`.entry`: :func:`convert`), Hugging Face -> Megatron-Core
(:mod:`.to_mcore`) and back (:mod:`.to_hf`), ``--verify`` (:mod:`.verify`), and a LoRA run out to PEFT or merged
(:mod:`.lora_export`). Every file is read and written through :mod:`pai_zoo.formats`.

``pai_zoo.conversion.convert`` and the other names the module ``pai_zoo.conversion`` had before it became this
package are importable from it as before, on first use (they import torch; :mod:`.settings` does not).
"""
from __future__ import annotations

import importlib

#: Name -> the module of this package that defines it (the names of the former ``pai_zoo.conversion`` module).
_NAMES = {"convert": "entry", "check_expert_layout": "to_mcore", "mtp_choice": "to_mcore",
          "ConversionReport": "report", "parse_dtype": "report", "DTYPES": "report",
          "verify_conversion": "verify", "verification_dtype": "verify", "describe_verification": "verify",
          "VERIFY_TOLERANCES": "verify", "compare_logits": "verify", "SAMPLE_PROMPT_LENGTH": "verify"}

__all__ = sorted(_NAMES)


def __getattr__(name: str):
    if name in _NAMES:
        return getattr(importlib.import_module(f"{__name__}.{_NAMES[name]}"), name)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
