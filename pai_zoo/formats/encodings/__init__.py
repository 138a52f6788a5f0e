"""Weight encodings: how a Hugging Face folder's ``config.json`` says its weights are stored
(``quantization_config.quant_method``), and the decoder that hands them out as plain tensors.

:func:`decoded` is the one place a reader of a Hugging Face folder meets an encoding: it wraps the folder's reader
in the decoder of the method its config declares, and refuses in one line a method pai-zoo does not read. Each
encoding is a module here with a scheme (``scheme_of``), a decoding reader and, where pai-zoo writes it, an
encoder: :mod:`.fp8_blocks` (block-scaled FP8), :mod:`.mxfp4` (gpt-oss's MXFP4 experts).
"""
from __future__ import annotations

import importlib
from typing import Mapping

from ...plugin.errors import PaiZooError

#: quant_method -> the module of its encoding (imported when a folder declares it: each imports torch).
ENCODINGS = {"fp8": "fp8_blocks", "mxfp4": "mxfp4"}


def encoding(method: str):
    """The module of ``quant_method`` ``method``."""
    return importlib.import_module(f"{__name__}.{ENCODINGS[method]}")


def scheme_of(config: Mapping, where: str = "config.json"):
    """The encoding scheme a ``config.json`` declares (:class:`~.fp8_blocks.BlockFp8` ...), ``None`` without
    ``quantization_config``; an encoding pai-zoo does not read is refused in one line naming the method."""
    quant = config.get("quantization_config")
    if not quant:
        return None
    if not isinstance(quant, Mapping):
        raise PaiZooError(f"{where}: quantization_config is {type(quant).__name__}, not an object")
    method = quant.get("quant_method")
    if method not in ENCODINGS:
        raise PaiZooError(f"{where}: quantization_config quant_method {method!r} is not supported; pai-zoo reads "
                          "block-scaled FP8 (quant_method 'fp8' with weight_block_size [128, 128]) and MXFP4 experts "
                          "(quant_method 'mxfp4'); dequantize the "
                          "model with its own tools first")
    return encoding(method).scheme_of(quant, where)


def decoded(source, config: Mapping, dtype=None, where: str = "config.json"):
    """``source`` (a Hugging Face folder's reader) as plain tensors: wrapped in the decoder of the encoding
    ``config`` declares, handing out ``dtype`` (default: the folder's unquantized dtype); without one, ``source``
    itself, checked to hold no quantized tensor."""
    scheme = scheme_of(config, where)
    if scheme is None:
        _check_unquantized(source, where)
        return source
    return encoding(scheme.method).decoder(source, scheme, dtype, where)


def _check_unquantized(source, where: str) -> None:
    """A folder that declares no encoding holds no 8-bit float tensor; otherwise one line naming one."""
    for name in source.names():
        spec = getattr(source, "spec", None)  # a dtype name from the header: no torch for a plain folder
        dtype = spec(name).dtype if spec is not None else str(source.meta(name).dtype).removeprefix("torch.")
        if dtype.startswith("float8"):
            raise PaiZooError(f"{source.file_of(name)}: {name} is {dtype} but {where} has no quantization_config "
                              "to say how it is scaled")
