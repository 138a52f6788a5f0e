"""Pure-torch paths for the GPU kernels of the hybrid layers, used where the kernel package is absent.

* :mod:`.causal_conv` -- ``causal_conv1d``'s depthwise causal convolution and its one-token state update;
* :mod:`.gated_delta` -- ``fla``'s chunked and recurrent gated delta rule (Gated DeltaNet);
* :mod:`.mamba2` -- ``mamba_ssm``'s Mamba-2 chunked scan, its one-token state update and gated RMSNorm.

Each equals transformers' torch fallback for the same model within 1e-5 in float32 (their tests say so).
:func:`install_fallbacks` puts them where megatron-core looks for the kernels, once, and only for a kernel package that
is not installed (``pip install pai-zoo[gpu]`` installs the real ones).
"""
from __future__ import annotations

import functools


@functools.cache
def install_fallbacks() -> None:
    """Give megatron-core's Gated DeltaNet and Mamba mixer modules the torch paths of the kernels they lack."""
    from . import gated_delta, mamba2

    gated_delta.install()
    mamba2.install()
