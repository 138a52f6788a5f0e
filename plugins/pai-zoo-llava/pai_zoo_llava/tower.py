"""LLaVA-OneVision's vision side on megatron-core: the shared SigLIP tower (:class:`pai_zoo.mcore.siglip.SiglipTower`,
``vision_feature_layer``'s hidden state, no ``post_layernorm``), the projector (``linear_1 -> act -> linear_2``),
``image_newline`` and the AnyRes packing (:mod:`pai_zoo_llava.anyres`).

``forward(pixel_values, grid=None, *, image_sizes=None, batch_num_images=None, modality=None)`` returns one row per
placeholder token: for images (``pixel_values`` ``[images, tiles, c, H, W]`` as the processor pads them, or
``[tiles, c, H, W]``) the packed AnyRes tokens of each image in order; for videos (``[videos, frames, c, H, W]``)
each video's frames pooled 2 x 2 and one newline. Which of the two a call carries: ``modality`` where the core
names it, else images exactly when ``image_sizes`` describes ``pixel_values`` (one size per image, the padded tile
count the largest of the images').

Tensor parallelism: the SigLIP layers split as the tower's docstring says; the projector and ``image_newline`` are
small and replicated on every tensor-parallel rank.
"""
from __future__ import annotations

import torch
from torch import nn

from pai_zoo.config_map import McoreConfig
from pai_zoo.errors import PaiZooError
from pai_zoo.vision import VISION_KEY

from .anyres import pack_image, pool_frames, tiles_per_image
from .config import PROJECTOR_ACTS, llava_settings


class Projector(nn.Module):
    """transformers' ``LlavaOnevisionMultiModalProjector``: ``linear_1 -> act -> linear_2``."""

    def __init__(self, width: int, hidden: int, act: str, bias: bool, dtype):
        super().__init__()
        from pai_zoo.mcore.build import ACTIVATIONS

        self.linear_1 = nn.Linear(width, hidden, bias=bias, dtype=dtype)
        self.act = ACTIVATIONS[PROJECTOR_ACTS[act]]
        self.linear_2 = nn.Linear(hidden, hidden, bias=bias, dtype=dtype)

    def forward(self, x):
        return self.linear_2(self.act(self.linear_1(x)))


class Newline(nn.Module):
    """``image_newline`` (one vector of the language model's width) as a module, for the replicated checkpoint."""

    def __init__(self, hidden: int, dtype):
        super().__init__()
        self.weight = nn.Parameter(torch.zeros(hidden, dtype=dtype))


class LlavaOnevisionTower(nn.Module):
    """See the module docstring."""

    def __init__(self, config: McoreConfig, lm_config):
        super().__init__()
        from pai_zoo.mcore.siglip import SiglipTower

        s = self.settings = llava_settings(config)
        dtype = lm_config.params_dtype
        self.siglip = SiglipTower(config[VISION_KEY], lm_config, feature_layer=s["vision_feature_layer"],
                                  post_norm=False)
        hidden = config["hidden_size"]
        self.projector = Projector(s["width"], hidden, s["projector_hidden_act"], s["multimodal_projector_bias"],
                                   dtype)
        self.image_newline = Newline(hidden, dtype)

    def features(self, pixels):
        """``[n, c, H, W]`` -> projected patch features ``[n, side**2, hidden]``."""
        return self.projector(self.siglip(pixels))

    def _is_image(self, pixel_values, image_sizes, batch_num_images) -> bool:
        if image_sizes is None:
            return False
        if pixel_values.dim() == 4:
            return True
        counts = tiles_per_image(image_sizes, batch_num_images, self.settings["image_grid_pinpoints"],
                                 self.settings["tile"])
        return pixel_values.shape[0] == len(counts) and pixel_values.shape[1] == max(counts)

    def forward(self, pixel_values, grid=None, *, image_sizes=None, batch_num_images=None, modality=None, **_):
        s = self.settings
        image = modality == "image" if modality is not None else self._is_image(pixel_values, image_sizes,
                                                                               batch_num_images)
        if not image:
            if pixel_values.dim() != 5:
                raise PaiZooError(f"pixel_values_videos of shape {tuple(pixel_values.shape)}: expected [videos, "
                                  "frames, channels, height, width], as the model's video processor returns them")
            videos, frames = pixel_values.shape[:2]
            feats = pool_frames(self.features(pixel_values.flatten(0, 1)), s["side"])
            feats = feats.reshape(videos, -1, feats.shape[-1])
            newline = self.image_newline.weight.to(feats)[None, None].expand(videos, 1, -1)
            return torch.cat([feats, newline], dim=1).flatten(0, 1)
        if image_sizes is None:
            raise PaiZooError("images without image_sizes: give the processor's image_sizes (and batch_num_images) "
                              "with pixel_values")
        sizes = torch.as_tensor(image_sizes).tolist()
        counts = tiles_per_image(sizes, None if batch_num_images is None else torch.as_tensor(batch_num_images)
                                 .tolist(), s["image_grid_pinpoints"], s["tile"])
        if pixel_values.dim() == 5:  # [images, padded tiles, c, H, W]: each image's own tiles
            pixel_values = torch.cat([p[:n] for p, n in zip(pixel_values, counts)], dim=0)
        if pixel_values.shape[0] != sum(counts):
            raise PaiZooError(f"pixel_values hold {pixel_values.shape[0]} tiles, image_sizes and batch_num_images "
                              f"call for {sum(counts)}: pass them as the model's processor returned them")
        feats = torch.split(self.features(pixel_values), counts, dim=0)
        newline = self.image_newline.weight
        return torch.cat([pack_image(f, size, s, newline) for f, size in zip(feats, sizes)], dim=0)

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """The SigLIP tower's own; the projector and ``image_newline`` replicated over tensor parallelism."""
        from megatron.core import parallel_state
        from megatron.core.transformer.utils import sharded_state_dict_default

        tp_group = parallel_state.get_tensor_model_parallel_group()
        out = dict(self.siglip.sharded_state_dict(f"{prefix}siglip.", sharded_offsets, metadata))
        for name in ("projector", "image_newline"):
            out.update(sharded_state_dict_default(getattr(self, name), f"{prefix}{name}.", sharded_offsets,
                                                  metadata, tp_group=tp_group))
        return out
