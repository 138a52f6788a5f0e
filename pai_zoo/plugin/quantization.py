"""The quantization a published checkpoint's ``config.json`` declares, as data (no torch): what the presets of
FP8 releases carry and what :mod:`pai_zoo.formats.encodings.fp8_blocks` writes."""
from __future__ import annotations

__all__ = ["FP8_BLOCK_128"]

#: Block-scaled FP8 as DeepSeek-V3/R1 and the Qwen3 ``-FP8`` releases publish it: float8_e4m3fn weights with
#: float32 inverse scales (``*.weight_scale_inv``) per 128x128 block.
FP8_BLOCK_128 = {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8", "weight_block_size": [128, 128]}
