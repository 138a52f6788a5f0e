"""Where an HF folder keeps its multi-token-prediction layers (:class:`MtpLayout`, :data:`MTP_LAYOUT`), which the
table engine maps with the table's own ``{layer}`` rows."""
from __future__ import annotations

from dataclasses import dataclass

from ...plugin.errors import MappingError
from .context import MappingContext


@dataclass(frozen=True)
class MtpLayout:
    """Where an HF folder keeps its multi-token-prediction layers (DeepSeek-V3's layer 61, GLM-4.5's layer after
    the last): HF layer ``num_layers + i`` is megatron-core's ``mtp.layers.{i}``. ``rows``: (HF suffix, megatron-core
    suffix) of the MTP module's own tensors; ``shared``: (HF suffix, the HF name of the main tensor it copies:
    ``"embedding"`` or ``"output"``, found from the table's :class:`Vocab` and :class:`Output` rows)."""

    hf_layer: str = "model.layers.{layer}."
    mcore_layer: str = "decoder.layers.{layer}."
    rows: tuple[tuple[str, str], ...] = (
        ("enorm.weight", "enorm.weight"),
        ("hnorm.weight", "hnorm.weight"),
        ("eh_proj.weight", "eh_proj.weight"),
        ("shared_head.norm.weight", "final_layernorm.weight"),
    )
    shared: tuple[tuple[str, str], ...] = (("embed_tokens.weight", "embedding"), ("shared_head.head.weight", "output"))

    def hf_prefix(self, ctx: MappingContext, i: int) -> str:
        return self.hf_layer.replace("{layer}", str(ctx.num_layers + i))

    @staticmethod
    def mcore_prefix(i: int) -> str:
        return f"mtp.layers.{i}."

    def rename(self, name: str, ctx: MappingContext, i: int) -> str:
        """A ``{layer}`` row's name for MTP layer ``i``: its HF layer ``num_layers + i``, its megatron-core
        transformer layer ``mtp.layers.{i}.transformer_layer``."""
        if name.startswith(self.hf_layer):
            return self.hf_prefix(ctx, i) + name[len(self.hf_layer):]
        if name.startswith(self.mcore_layer):
            return f"{self.mcore_prefix(i)}{ctx.mtp_inner}." + name[len(self.mcore_layer):]
        raise MappingError(f"table error: {name!r} is a {{layer}} name outside {self.hf_layer!r} and "
                           f"{self.mcore_layer!r}, so the multi-token-prediction layers cannot reuse it")


#: The layout DeepSeek-V3/R1 and GLM-4.5 publish.
MTP_LAYOUT = MtpLayout()
