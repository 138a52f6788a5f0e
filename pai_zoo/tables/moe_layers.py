"""Where a mixture-of-experts model's MoE layers are: the config rules that turn a family's dense-layer keys into
megatron-core's ``moe_layer_freq`` (one 1 or 0 per layer) and back, losslessly: :class:`SparseStep` (Qwen-MoE),
:class:`FirstKDense` (GLM-4.5, DeepSeek), :class:`MoeLayerRange` (ERNIE-4.5) and :class:`EveryLayerMoe` (Mixtral).
:func:`pai_zoo.tables.layouts.moe_config_rules` takes one of them."""
from __future__ import annotations

from typing import Any

from ..plugin.config_map import FAMILY_KEY_PREFIX, Rule
from ..plugin.errors import ConfigTranslationError
from ..plugin.megatron_args import layer_pattern

__all__ = ["EveryLayerMoe", "FirstKDense", "MoeLayerRange", "SparseStep", "moe_pattern", "remembered"]


def remembered(arch: dict, key: str) -> Any:
    """The HF value of ``key`` a rule kept in the arch (``family.<key>``), or None."""
    return arch.get(FAMILY_KEY_PREFIX + key)


def moe_pattern(arch: dict) -> list[int]:
    """megatron's ``moe_layer_freq`` of ``arch`` as one 1 (MoE) or 0 (dense) per layer."""
    return layer_pattern(arch.get("moe_layer_freq", 1), arch["num_layers"])


class SparseStep(Rule):
    """Qwen-MoE's dense layers: layer ``i`` is a MoE layer when ``(i + 1) % decoder_sparse_step == 0`` and ``i``
    is not in ``mlp_only_layers`` -> megatron's ``moe_layer_freq`` (1: every layer; else a 1/0 list). The HF
    values are kept and written back while they still give the pattern; a changed pattern is written as
    ``decoder_sparse_step`` 1 with its dense layers in ``mlp_only_layers``."""

    hf_keys = ("decoder_sparse_step", "mlp_only_layers")

    @staticmethod
    def _pattern(step: int, dense: list, layers: int) -> list[int]:
        return [int(i not in dense and (i + 1) % step == 0) for i in range(layers)]

    def to_mcore(self, hf: dict, arch: dict) -> None:
        step, dense = hf.get("decoder_sparse_step", 1) or 1, list(hf.get("mlp_only_layers") or [])
        pattern = self._pattern(int(step), dense, arch["num_layers"])
        if not any(pattern):
            raise ConfigTranslationError(f"decoder_sparse_step={step}, mlp_only_layers={dense}: no layer is a "
                                         "mixture of experts (a dense model: use the dense family)")
        arch["moe_layer_freq"] = 1 if all(pattern) else pattern
        for key in self.hf_keys:
            if key in hf:
                arch[FAMILY_KEY_PREFIX + key] = hf[key]

    def to_hf(self, arch: dict, hf: dict) -> None:
        layers = arch["num_layers"]
        pattern = moe_pattern(arch)
        step = remembered(arch, "decoder_sparse_step") or 1
        dense = remembered(arch, "mlp_only_layers")
        if self._pattern(int(step), list(dense or []), layers) == pattern:
            hf["decoder_sparse_step"] = step
            hf["mlp_only_layers"] = [] if dense is None else dense
            return
        hf["decoder_sparse_step"], hf["mlp_only_layers"] = 1, [i for i, v in enumerate(pattern) if not v]

    def describe(self) -> str:
        return "decoder_sparse_step, mlp_only_layers -> moe_layer_freq (dense layers among MoE layers)"


class FirstKDense(Rule):
    """GLM-4.5 / DeepSeek: the first ``first_k_dense_replace`` layers are dense, the rest MoE -> megatron's
    ``moe_layer_freq`` (1, or a list of k zeros then ones). Back: the leading zeros (any other pattern is refused)."""

    def __init__(self, key: str = "first_k_dense_replace"):
        self.key = key
        self.hf_keys = (key,)

    def to_mcore(self, hf: dict, arch: dict) -> None:
        layers, k = arch["num_layers"], int(hf.get(self.key) or 0)
        if k >= layers:
            raise ConfigTranslationError(f"{self.key}={k} of {layers} layers: no layer is a mixture of experts")
        arch["moe_layer_freq"] = 1 if k == 0 else [0] * k + [1] * (layers - k)
        if hf.get(self.key, 0) is None:
            arch[FAMILY_KEY_PREFIX + self.key] = None

    def to_hf(self, arch: dict, hf: dict) -> None:
        pattern = moe_pattern(arch)
        k = pattern.index(1) if 1 in pattern else len(pattern)
        if pattern != [0] * k + [1] * (len(pattern) - k):
            raise ConfigTranslationError(f"moe_layer_freq={arch.get('moe_layer_freq')}: this family's dense layers "
                                         f"are the first {self.key} layers only")
        hf[self.key] = None if (FAMILY_KEY_PREFIX + self.key) in arch and k == 0 else k

    def describe(self) -> str:
        return f"{self.key} -> moe_layer_freq (the first k layers dense)"


class MoeLayerRange(Rule):
    """ERNIE-4.5's dense layers: layer ``i`` is a MoE layer when ``start <= i <= end`` and ``(i + 1) % interval
    == 0`` (``end`` -1: the last layer) -> megatron's ``moe_layer_freq``. The HF values are kept and written back
    while they still give the pattern; another pattern is written as its first and last MoE layer with the one
    interval that gives it, or refused."""

    def __init__(self, start: str = "moe_layer_start_index", end: str = "moe_layer_end_index",
                 interval: str = "moe_layer_interval"):
        self.start, self.end, self.interval = start, end, interval
        self.hf_keys = (start, end, interval)

    @staticmethod
    def pattern(start: int, end: int, interval: int, layers: int) -> list[int]:
        end = layers - 1 if end == -1 else end
        return [int(start <= i <= end and (i + 1) % interval == 0) for i in range(layers)]

    def _values(self, values: dict, defaults: tuple[int, int, int]) -> tuple[int, int, int]:
        got = [values.get(key) for key in self.hf_keys]
        got = [default if v is None else v for v, default in zip(got, defaults)]
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in got) or got[2] < 1:
            raise ConfigTranslationError(f"{self.start}, {self.end}, {self.interval} = {got}: whole layer indices "
                                         f"({self.end} -1: the last layer) and an interval of 1 or more")
        return got[0], got[1], got[2]

    def to_mcore(self, hf: dict, arch: dict) -> None:
        start, end, interval = self._values(hf, (1, -1, 1))  # transformers' defaults
        pattern = self.pattern(start, end, interval, arch["num_layers"])
        if not any(pattern):
            raise ConfigTranslationError(f"{self.start}={start}, {self.end}={end}, {self.interval}={interval}: no "
                                         f"layer of {arch['num_layers']} is a mixture of experts (a dense model: use "
                                         "the dense family)")
        arch["moe_layer_freq"] = 1 if all(pattern) else pattern
        for key in self.hf_keys:
            if key in hf:
                arch[FAMILY_KEY_PREFIX + key] = hf[key]

    def to_hf(self, arch: dict, hf: dict) -> None:
        layers, pattern = arch["num_layers"], moe_pattern(arch)
        kept = {key: remembered(arch, key) for key in self.hf_keys}
        start, end, interval = self._values(kept, (1, -1, 1))
        if self.pattern(start, end, interval, layers) != pattern:
            moe = [i for i, v in enumerate(pattern) if v]
            start, end = moe[0], moe[-1]
            found = [k for k in range(1, layers + 1) if self.pattern(start, end, k, layers) == pattern]
            if not found:
                raise ConfigTranslationError(
                    f"moe_layer_freq={arch.get('moe_layer_freq')}: this family's MoE layers are every "
                    f"{self.interval}-th layer from {self.start} to {self.end}, which gives no such pattern")
            interval = found[0]
        hf[self.start], hf[self.end], hf[self.interval] = start, end, interval

    def describe(self) -> str:
        return f"{self.start}, {self.end}, {self.interval} -> moe_layer_freq (every interval-th layer in the range)"


class EveryLayerMoe(Rule):
    """No dense layers (Mixtral): ``moe_layer_freq`` must stay 1 on the way back."""

    def to_mcore(self, hf: dict, arch: dict) -> None:
        arch["moe_layer_freq"] = 1

    def to_hf(self, arch: dict, hf: dict) -> None:
        if any(v == 0 for v in moe_pattern(arch)):
            raise ConfigTranslationError(f"moe_layer_freq={arch.get('moe_layer_freq')}: every layer of this family "
                                         "is a mixture of experts")

    def describe(self) -> str:
        return "every layer a mixture of experts (moe_layer_freq 1)"
