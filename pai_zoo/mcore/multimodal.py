"""Vision-language models on megatron-core: a ``GPTModel`` whose first pipeline stage holds the family's vision
tower (:class:`pai_zoo.vision.VisionSpec`) and writes its embeddings over the placeholder tokens.

The language model is megatron-core's own ``GPTModel`` (M-RoPE through its ``position_embedding_type="mrope"``);
the forward takes transformers' argument names (``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``,
``video_grid_thw``). Placement follows transformers' ``masked_scatter``: the tower's rows fill the placeholders in
batch-major order (row 0's placeholders, then row 1's ...).
"""
from __future__ import annotations

from ..plugin.errors import PaiZooError
from .deepstack import install as install_deepstack
from .deepstack import levels_of, set_levels
from .image_attention import model_mask

__all__ = ["attach_vision_tower", "place_features", "vision_language_class"]


def place_features(embeddings, input_ids, token_id: int, features, what: str):
    """``embeddings`` ``[s, b, h]`` with the rows of ``features`` ``[n, h]`` at the positions where ``input_ids``
    ``[b, s]`` is ``token_id``, in batch-major order; a count mismatch is one clear error."""
    mask = input_ids == token_id
    count = int(mask.sum())
    if count != features.shape[0]:
        raise PaiZooError(f"{what}: the prompt holds {count} placeholder tokens (id {token_id}) but the "
                          f"{what} give {features.shape[0]} embeddings; give as many {what} as the prompt names, "
                          "processed by the model's own processor")
    batch_major = embeddings.transpose(0, 1)
    out = batch_major.masked_scatter(mask.unsqueeze(-1), features.to(embeddings.dtype))
    return out.transpose(0, 1).contiguous()


def vision_language_class(base: type) -> type:
    """A subclass of ``base`` (``GPTModel`` or a family's subclass) whose forward accepts the vision inputs."""

    class VisionLanguageModel(base):
        """``base`` with the family's vision tower (``vision_model``, first pipeline stage only)."""

        vision_spec = None  # set by attach_vision_tower
        vision_config = None

        def forward(self, input_ids, position_ids, attention_mask, decoder_input=None, labels=None,
                    pixel_values=None, image_grid_thw=None, pixel_values_videos=None, video_grid_thw=None,
                    second_per_grid_ts=None, **kwargs):
            if getattr(self, "mrope_section", None) is not None and position_ids is not None \
                    and position_ids.dim() == 2:  # text positions: the same on M-RoPE's three axes
                position_ids = position_ids.unsqueeze(0).expand(3, -1, -1)
            spec = self.vision_spec
            extra = {k: kwargs.pop(k) for k in spec.inputs if k in kwargs}  # the family's own processor outputs
            extra = {k: v for k, v in extra.items() if v is not None}
            pixels = pixel_values is not None or pixel_values_videos is not None
            if pixels and decoder_input is None and self.pre_process:
                ids = spec.placeholders(self.vision_config)
                decoder_input = self.embedding(input_ids=input_ids, position_ids=None)
                deep = []  # (placeholder id, DeepStack levels) per modality (pai_zoo.mcore.deepstack)
                for name, pix, grid in (("image", pixel_values, image_grid_thw),
                                        ("video", pixel_values_videos, video_grid_thw)):
                    if pix is None:
                        continue
                    if grid is None and spec.grids:
                        raise PaiZooError(f"{name}: pixel values without their grid ({name}_grid_thw)")
                    dtype = next(self.vision_model.parameters()).dtype
                    # without grids the tower learns the modality from its name (LLaVA pools video frames)
                    features = self.vision_model(pix.to(dtype), grid, **extra, **({} if spec.grids else
                                                                                  {"modality": name}))
                    if isinstance(features, tuple):  # (features, per-layer extras): VisionSpec.deepstack's
                        features, levels = features
                        deep.append((ids[name], levels))
                    decoder_input = place_features(decoder_input, input_ids, ids[name], features, f"{name}s")
                if deep:
                    set_levels(self, levels_of(decoder_input, input_ids, deep))
            # image blocks attending bidirectionally (VisionSpec.bidirectional), on every stage
            attention_mask = model_mask(spec, self.vision_config, input_ids, attention_mask)
            try:
                return super().forward(input_ids, position_ids, attention_mask, decoder_input=decoder_input,
                                       labels=labels, **kwargs)
            finally:
                set_levels(self, None)

    VisionLanguageModel.__name__ = VisionLanguageModel.__qualname__ = f"VisionLanguage{base.__name__}"
    return VisionLanguageModel


def attach_vision_tower(model, family, config, tconfig) -> None:
    """Give ``model`` (built from :func:`vision_language_class`) the family's tower on the first stage."""
    model.vision_spec, model.vision_config = family.vision, config
    if model.pre_process:
        model.vision_model = family.vision.tower(config, tconfig)
        if family.vision.deepstack is not None and family.vision.deepstack(config):
            install_deepstack(model, len(family.vision.deepstack(config)))
