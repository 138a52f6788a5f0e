"""Weight rows of the SigLIP vision encoder (:class:`pai_zoo.mcore.siglip.SiglipTower`): transformers'
``SiglipVisionModel`` names (under ``hf_prefix``, e.g. ``vision_tower.vision_model.``) <-> the tower's (under
``mcore_prefix``), one row per tensor (the tower's depth is not the language model's, so no ``{layer}``).

===================================================  ==========================================================
transformers                                          megatron-core (tensor parallelism)
===================================================  ==========================================================
``embeddings.patch_embedding.{weight,bias}``          ``patch_embedding.*`` (replicated)
``embeddings.position_embedding.weight``              ``position_embedding.weight`` (replicated)
``encoder.layers.{i}.layer_norm1.*``                  ``layers.{i}.input_layernorm.*`` (replicated)
``encoder.layers.{i}.self_attn.{q,k,v}_proj.*``       ``layers.{i}.self_attention.linear_qkv.*`` (split by heads)
``encoder.layers.{i}.self_attn.out_proj.weight``      ``layers.{i}.self_attention.linear_proj.weight`` (split by
                                                      columns; its bias replicated)
``encoder.layers.{i}.layer_norm2.*``                  ``layers.{i}.pre_mlp_layernorm.*`` (replicated)
``encoder.layers.{i}.mlp.fc1.*``                      ``layers.{i}.mlp.linear_fc1.*`` (split by rows, bias too)
``encoder.layers.{i}.mlp.fc2.weight``                 ``layers.{i}.mlp.linear_fc2.weight`` (split by columns;
                                                      its bias replicated)
``post_layernorm.*``                                  ``post_layernorm.*`` (replicated)
===================================================  ==========================================================

q/k/v (weights and biases) become megatron-core's per-head grouped ``linear_qkv`` by :class:`TowerQKV`, the
:class:`~pai_zoo.tables.mapping.rows.QKV` row with the tower's own head count. No torch at import.
"""
from __future__ import annotations

from dataclasses import replace

from ...plugin.errors import ConfigTranslationError
from .rows import QKV, Copy

__all__ = ["SIGLIP_ACTIVATIONS", "TowerQKV", "check_siglip", "siglip_parameters", "siglip_rows"]

#: transformers' ``hidden_act`` names -> :data:`pai_zoo.mcore.build.ACTIVATIONS`.
SIGLIP_ACTIVATIONS = {"gelu_pytorch_tanh": "gelu_tanh", "gelu_new": "gelu_tanh", "gelu": "gelu",
                      "quick_gelu": "quick_gelu"}


def check_siglip(settings: dict) -> None:
    """One :class:`~pai_zoo.ConfigTranslationError` line for a SigLIP vision config the tower cannot compute."""
    head = settings.get("vision_use_head", True)  # SiglipVisionConfig's default
    if head:
        raise ConfigTranslationError(f"vision_config.vision_use_head={head}: the SigLIP pooling head is not part of "
                                     "pai-zoo's tower (vision-language models read the patch features); set it "
                                     "to false, as the published Gemma 3 and LLaVA-OneVision configs do")
    act = settings.get("hidden_act", "gelu_pytorch_tanh")
    if act not in SIGLIP_ACTIVATIONS:
        raise ConfigTranslationError(f"vision_config.hidden_act={act!r} is not supported; supported: "
                                     f"{sorted(SIGLIP_ACTIVATIONS)}")
    if settings["hidden_size"] % settings["num_attention_heads"]:
        raise ConfigTranslationError(f"vision_config.hidden_size={settings['hidden_size']} does not divide by "
                                     f"num_attention_heads={settings['num_attention_heads']}")


class TowerQKV(QKV):
    """:class:`QKV` with its own ``(heads, key/value heads, head_dim)``: a vision tower's attention."""

    def __init__(self, hf: str, mcore: str, heads: tuple[int, int, int]):
        super().__init__(hf, mcore)
        self.heads = heads

    def _own(self, ctx):
        heads, groups, head_dim = self.heads
        return replace(ctx, num_attention_heads=heads, num_query_groups=groups, head_dim=head_dim)

    def to_mcore(self, tensors, ctx):
        return super().to_mcore(tensors, self._own(ctx))

    def to_hf(self, tensors, ctx):
        return super().to_hf(tensors, self._own(ctx))


def siglip_rows(settings: dict, hf_prefix: str, mcore_prefix: str, layers: int | None = None) -> list:
    """The rows of a SigLIP encoder with ``settings`` (``SiglipVisionConfig`` as a dict); ``layers``: how many of
    its layers (default all, ``num_hidden_layers``)."""
    heads = settings["num_attention_heads"]
    shape = (heads, heads, settings["hidden_size"] // heads)
    h, m = hf_prefix, mcore_prefix
    rows = [Copy(f"{h}embeddings.patch_embedding.{p}", f"{m}patch_embedding.{p}") for p in ("weight", "bias")]
    rows.append(Copy(f"{h}embeddings.position_embedding.weight", f"{m}position_embedding.weight"))
    for i in range(settings["num_hidden_layers"] if layers is None else layers):
        hl, ml = f"{h}encoder.layers.{i}.", f"{m}layers.{i}."
        for p in ("weight", "bias"):
            rows += [
                Copy(f"{hl}layer_norm1.{p}", f"{ml}input_layernorm.{p}"),
                TowerQKV(hl + "self_attn.{q,k,v}_proj." + p, f"{ml}self_attention.linear_qkv.{p}", shape),
                Copy(f"{hl}self_attn.out_proj.{p}", f"{ml}self_attention.linear_proj.{p}"),
                Copy(f"{hl}layer_norm2.{p}", f"{ml}pre_mlp_layernorm.{p}"),
                Copy(f"{hl}mlp.fc1.{p}", f"{ml}mlp.linear_fc1.{p}"),
                Copy(f"{hl}mlp.fc2.{p}", f"{ml}mlp.linear_fc2.{p}"),
            ]
    rows += [Copy(f"{h}post_layernorm.{p}", f"{m}post_layernorm.{p}") for p in ("weight", "bias")]
    return rows


def siglip_parameters(settings: dict, tp: int = 1) -> int:
    """The tower's parameters on one tensor-parallel rank (no torch; a family's tests check it against the built
    tower)."""
    s = settings
    w, f, c, p = s["hidden_size"], s["intermediate_size"], s.get("num_channels", 3), s["patch_size"]
    layer = 4 * w  # two LayerNorms (replicated)
    layer += (3 * w * w + 3 * w) // tp + w * w // tp + w  # qkv (split bias), proj (replicated bias)
    layer += (f * w + f) // tp + f * w // tp + w  # fc1 (split bias), fc2 (replicated bias)
    embed = c * p * p * w + w + (s["image_size"] // p) ** 2 * w
    return embed + s["num_hidden_layers"] * layer + 2 * w
