"""What a table runs against: the two directions (:data:`TO_MCORE`, :data:`TO_HF`) and the model's shape facts
(:class:`MappingContext`: heads, vocabulary, which layers are mixture-of-experts, how many MTP layers)."""
from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Iterable

from ...plugin.errors import MappingError

TO_MCORE = "to_mcore"
TO_HF = "to_hf"
DIRECTIONS = (TO_MCORE, TO_HF)


@dataclass(frozen=True)
class MappingContext:
    """The shape facts a table needs, taken from the megatron-core config."""

    num_layers: int
    num_attention_heads: int
    num_query_groups: int
    head_dim: int
    vocab_size: int
    padded_vocab_size: int
    tied_embeddings: bool
    num_experts: int = 0  # routed experts per MoE layer (megatron's num_moe_experts); 0 without MoE
    moe_layers: tuple[int, ...] | None = None  # the MoE layers' indices; None: every layer (with experts)
    mtp_layers: int = 0  # multi-token-prediction layers the megatron-core model holds (megatron's mtp_num_layers)
    dropped_mtp_layers: int = 0  # MTP layers an HF folder holds that the model leaves out (--no-mtp)
    # an MTP layer's transformer layer: mtp.layers.{i}.transformer_layer (megatron-core 0.16), mtp_model_layer (0.19)
    mtp_inner: str = "transformer_layer"
    # the Gated DeltaNet layers' indices (megatron's linear_attention_freq); the rest are full-attention layers
    linear_attention_layers: tuple[int, ...] = ()

    def named_as(self, mcore_names: Iterable[str]) -> "MappingContext":
        """This context with the MTP layers' inner name that ``mcore_names`` (a megatron-core model's or
        checkpoint's tensor names) use."""
        for name in mcore_names:
            if name.startswith("mtp.layers."):
                inner = name.split(".")[3]
                if inner in MTP_INNER_NAMES:
                    return replace(self, mtp_inner=inner)
        return self

    def is_moe_layer(self, layer: int) -> bool:
        return self.num_experts > 0 and (self.moe_layers is None or layer in self.moe_layers)

    def is_layer_of(self, layer: int, kind: str | None) -> bool:
        """Whether layer ``layer`` is of :attr:`Row.layer_kind` ``kind`` (``None``: every layer is)."""
        if kind is None:
            return True
        if isinstance(kind, tuple):  # explicit layers
            return layer in kind
        if kind in ATTENTION_KINDS:
            return (layer in self.linear_attention_layers) == (kind == "linear_attention")
        return self.is_moe_layer(layer) == (kind == "moe")

    def layers_of(self, kind: str | None) -> list[int]:
        """The layers a row of ``layer_kind`` ``kind`` expands for (``None``: all)."""
        if kind is None:
            return list(range(self.num_layers))
        if isinstance(kind, tuple):  # explicit layers (a Mamba hybrid pattern's kind: pai_zoo.plugin.hybrid)
            return [i for i in kind if i < self.num_layers]
        if kind not in LAYER_KINDS:
            raise MappingError(f"table error: layer_kind {kind!r} is not one of {LAYER_KINDS}")
        return [i for i in range(self.num_layers) if self.is_layer_of(i, kind)]

    @classmethod
    def from_config(
        cls, config, tensor_parallel_size: int = 1, padded_vocab_size: int | None = None, mtp: bool = True
    ) -> "MappingContext":
        """Build from a :class:`~pai_zoo.plugin.config_map.McoreConfig`; the padded vocabulary follows
        Megatron's rule for ``tensor_parallel_size`` unless given (a checkpoint's own). ``mtp=False``: the model
        holds none of the config's multi-token-prediction layers (built without them), whose tensors the
        checkpoint may hold (:attr:`dropped_mtp_layers`)."""
        layers = int(config.get("mtp_num_layers") or 0)
        return cls(
            num_layers=config.num_layers,
            num_attention_heads=config.num_attention_heads,
            num_query_groups=config.num_query_groups,
            head_dim=config.kv_channels,
            vocab_size=config["vocab_size"],
            padded_vocab_size=padded_vocab_size or config.padded_vocab_size(tensor_parallel_size),
            tied_embeddings=config.tied_embeddings,
            num_experts=int(config.get("num_moe_experts") or 0),
            moe_layers=moe_layer_indices(config.get("moe_layer_freq", 1), config.num_layers),
            mtp_layers=layers if mtp else 0,
            dropped_mtp_layers=0 if mtp else layers,
            linear_attention_layers=linear_attention_indices(config),
        )

    @property
    def mtp_kind(self) -> str:
        """The layer kind of an MTP layer's transformer layer: that of the last decoder layer, as megatron-core's
        ``get_gpt_mtp_block_spec`` builds it."""
        return "moe" if self.is_moe_layer(self.num_layers - 1) else "dense"


#: :attr:`Row.layer_kind` values of the token mixer: rows of the Gated DeltaNet layers only, or of the full-attention
#: layers only (megatron's ``linear_attention_freq``; :data:`MappingContext.linear_attention_layers`).
ATTENTION_KINDS = ("linear_attention", "full_attention")
#: :attr:`Row.layer_kind` values: rows of the mixture-of-experts layers only, or of the dense layers only; or
#: :data:`ATTENTION_KINDS`.
LAYER_KINDS = ("moe", "dense", *ATTENTION_KINDS)


def linear_attention_indices(config) -> tuple[int, ...]:
    """The Gated DeltaNet layers of a config (``experimental_attention_variant`` ``gated_delta_net`` with
    ``linear_attention_freq``: an int ``f``, every ``f``-th layer full attention; a list, 1 per linear layer)."""
    if config.get("experimental_attention_variant") != "gated_delta_net":
        return ()
    layers, freq = int(config.get("num_layers")), config.get("linear_attention_freq")
    if isinstance(freq, (list, tuple)):
        if len(freq) != layers:
            raise MappingError(f"linear_attention_freq has {len(freq)} entries for {layers} layers")
        return tuple(i for i, v in enumerate(freq) if v)
    return tuple(i for i in range(layers) if (i + 1) % int(freq or 1))


def moe_layer_indices(freq, num_layers: int) -> tuple[int, ...] | None:
    """The MoE layers of megatron's ``moe_layer_freq`` (an int ``f``: layers ``i % f == 0``; a list: one 1/0 per
    layer), ``None`` when every layer is one."""
    if isinstance(freq, (list, tuple)):
        if len(freq) != num_layers:
            raise MappingError(f"moe_layer_freq has {len(freq)} entries for {num_layers} layers")
        layers = tuple(i for i, v in enumerate(freq) if v)
    else:
        layers = tuple(i for i in range(num_layers) if i % int(freq or 1) == 0)
    return None if len(layers) == num_layers else layers


#: The names megatron-core gives an MTP layer's transformer layer: 0.16's, then 0.19's.
MTP_INNER_NAMES = ("transformer_layer", "mtp_model_layer")
