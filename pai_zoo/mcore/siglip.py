"""The SigLIP vision encoder (transformers' ``SiglipVisionModel`` without its pooling head) on megatron-core, for
vision-language families whose tower it is (Gemma 3, LLaVA-OneVision): :class:`SiglipTower`.

``forward(pixel_values [n, c, H, W]) -> [n, patches, width]``: a ``Conv2d`` patch embedding (stride = kernel =
``patch_size``), learned position embeddings (one per patch of an ``image_size`` square; no interpolation, as
transformers' default), ``num_hidden_layers`` megatron-core ``TransformerLayer`` s (the local GPT layer spec:
LayerNorm, attention with q/k/v biases, ``fc1 -> gelu_pytorch_tanh -> fc2``; bidirectional: no mask), then
optionally ``post_layernorm``. ``feature_layer`` picks the layer whose output is returned as transformers'
``hidden_states[feature_layer]`` does (0: the embeddings, -1: the last layer); ``post_norm`` applies
``post_layernorm`` to it (transformers' ``last_hidden_state`` is ``feature_layer=-1, post_norm=True``). Every
layer and ``post_layernorm`` are built whichever are used, so a checkpoint's tensors all have a place.

Tensor parallelism: the layers are split as the language model's are (``linear_qkv`` and ``linear_fc1`` by
columns, their biases too; ``linear_proj`` and ``linear_fc2`` by rows, their biases and the LayerNorms
replicated); the patch embedding, the position embeddings and ``post_layernorm`` are replicated on every
tensor-parallel rank. The attention head count must divide by the tensor-parallel size.
Weight rows, the config check and the parameter count: :mod:`pai_zoo.tables.mapping.siglip_rows`.
"""
from __future__ import annotations

from torch import nn

from ..plugin.config_map import McoreConfig
from ..plugin.errors import PaiZooError
from ..tables.mapping.siglip_rows import SIGLIP_ACTIVATIONS, check_siglip
from .build import transformer_config

__all__ = ["SiglipTower"]

def _transformer_config(s: dict, lm_config):
    arch = {
        "num_layers": s["num_hidden_layers"], "hidden_size": s["hidden_size"],
        "num_attention_heads": s["num_attention_heads"], "ffn_hidden_size": s["intermediate_size"],
        "kv_channels": s["hidden_size"] // s["num_attention_heads"], "add_bias_linear": True,
        "add_qkv_bias": True, "layernorm_epsilon": s.get("layer_norm_eps", 1e-6),
        "activation_func": SIGLIP_ACTIVATIONS[s.get("hidden_act", "gelu_pytorch_tanh")],
        "normalization": "LayerNorm", "gated_linear_unit": False,
    }
    return transformer_config(McoreConfig(family="siglip", arch=arch), lm_config.params_dtype,
                              tensor_model_parallel_size=lm_config.tensor_model_parallel_size,
                              pipeline_model_parallel_size=1, sequence_parallel=False)


class SiglipTower(nn.Module):
    """SigLIP's vision encoder (see the module docstring). ``settings``: transformers' ``SiglipVisionConfig`` as a
    dict; ``lm_config``: the language model's ``TransformerConfig`` (tensor-parallel size, dtype)."""

    def __init__(self, settings: dict, lm_config, *, feature_layer: int = -1, post_norm: bool = True):
        super().__init__()
        from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
        from megatron.core.transformer.enums import AttnMaskType
        from megatron.core.transformer.spec_utils import build_module

        s = self.settings = dict(settings)
        check_siglip(s)
        depth = s["num_hidden_layers"]
        if not -(depth + 1) <= feature_layer <= depth:
            raise PaiZooError(f"SigLIP feature_layer {feature_layer} is outside the tower's hidden states "
                              f"(0..{depth}, or -{depth + 1}..-1)")
        self.feature_layer, self.post_norm = feature_layer % (depth + 1), post_norm
        width, patch = s["hidden_size"], s["patch_size"]
        self.image_size, self.grid = s["image_size"], s["image_size"] // patch
        config = self.config = _transformer_config(s, lm_config)
        spec = get_gpt_layer_local_spec(normalization="LayerNorm")
        spec.submodules.self_attention.params = {"attn_mask_type": AttnMaskType.padding}  # bidirectional, no mask
        dtype = lm_config.params_dtype
        self.patch_embedding = nn.Conv2d(s.get("num_channels", 3), width, kernel_size=patch, stride=patch,
                                         dtype=dtype)
        self.position_embedding = nn.Embedding(self.grid ** 2, width, dtype=dtype)
        self.layers = nn.ModuleList([build_module(spec, config=config, layer_number=i + 1) for i in range(depth)])
        self.post_layernorm = nn.LayerNorm(width, eps=s.get("layer_norm_eps", 1e-6), dtype=dtype)

    def forward(self, pixel_values):
        n, _, height, width = pixel_values.shape
        if (height, width) != (self.image_size, self.image_size):
            raise PaiZooError(f"SigLIP tower: images of {height} x {width} pixels; this tower reads "
                              f"{self.image_size} x {self.image_size} (the model's processor resizes them)")
        hidden = self.patch_embedding(pixel_values.to(self.patch_embedding.weight.dtype)).flatten(2).transpose(1, 2)
        hidden = hidden + self.position_embedding.weight[None]
        hidden = hidden.transpose(0, 1).contiguous()  # [patches, n, width]: megatron-core's [s, b, h]
        for layer in self.layers[: self.feature_layer]:
            out = layer(hidden, attention_mask=None)
            hidden = out[0] if isinstance(out, tuple) else out
        hidden = hidden.transpose(0, 1)
        return self.post_layernorm(hidden) if self.post_norm else hidden

    def sharded_state_dict(self, prefix: str = "", sharded_offsets: tuple = (), metadata: dict | None = None):
        """megatron-core's layers shard themselves (``layers.{i}.``); the embeddings and ``post_layernorm`` are
        replicated over tensor parallelism."""
        from megatron.core import parallel_state
        from megatron.core.transformer.utils import sharded_state_dict_default

        tp_group = parallel_state.get_tensor_model_parallel_group()  # replica ids per TP rank (see Qwen's tower)
        out = {}
        for i, layer in enumerate(self.layers):
            out.update(layer.sharded_state_dict(f"{prefix}layers.{i}.", sharded_offsets, metadata))
        for name in ("patch_embedding", "position_embedding", "post_layernorm"):
            out.update(sharded_state_dict_default(getattr(self, name), f"{prefix}{name}.", sharded_offsets,
                                                  metadata, tp_group=tp_group))
        return out

