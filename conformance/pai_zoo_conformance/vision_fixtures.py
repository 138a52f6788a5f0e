"""What the vision-language families' own tests share: random images, a preset saved as a transformers folder and
loaded by both backends, the positions-and-logits comparison against transformers, and the bit-identical conversion
round trip from a checkpoint with the older ``vision_tower.vision_model.`` names (the CLI round trip is
:func:`pai_zoo_conformance.cli_runs.assert_convert_round_trip`)."""
from __future__ import annotations

import numpy as np
import torch
from PIL import Image

from pai_zoo.conversion.entry import convert
from pai_zoo.models.handle import load


def random_image(seed: int, height: int, width: int) -> Image.Image:
    """An RGB image of uniform noise (the same for the same seed)."""
    return Image.fromarray((np.random.RandomState(seed).rand(height, width, 3) * 255).astype("uint8"))


def save_preset(preset: str, folder, seed: int = 1):
    """The preset's transformers model saved under ``folder`` with its test tokenizer and processor files; the
    ``hf`` handle."""
    hf = load(preset, backend="hf", seed=seed)
    hf.model.save_pretrained(folder)
    hf.family.test_tokenizer(folder)
    return hf


def saved_models(preset: str, tmp_path_factory, seed: int = 1):
    """``(folder, hf handle, mcore handle)``: :func:`save_preset` in a fresh folder, loaded by both backends."""
    folder = tmp_path_factory.mktemp(preset) / "hf"
    save_preset(preset, folder, seed)
    return folder, load(folder, backend="hf"), load(folder, backend="mcore")


def rope_index(hf, input_ids, attention_mask=None, types=None, **grids):
    """transformers' own M-RoPE position ids (``model.model.get_rope_index``) for ``input_ids``; the token types
    (1 image, 2 video) from the family's placeholders unless given."""
    if types is None:
        pad = hf.family.vision.placeholders(hf.mcore_config)
        types = torch.zeros_like(input_ids)
        types[input_ids == pad["image"]], types[input_ids == pad["video"]] = 1, 2
    return hf.model.model.get_rope_index(input_ids, types, attention_mask=attention_mask, **grids)[0]


def assert_agree(hf, mc, input_ids, want_positions, attention_mask=None, tol: float = 1e-4, **vision) -> float:
    """The family's position ids equal ``want_positions`` (transformers' own) and the logits of the two backends
    agree within ``tol`` on the unmasked tokens; the largest difference."""
    grids = {k: v for k, v in vision.items() if k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")}
    got_pos = mc.family.vision.positions(mc.mcore_config, input_ids, attention_mask, **grids)
    keep = torch.ones_like(input_ids, dtype=torch.bool) if attention_mask is None else attention_mask.bool()
    assert torch.equal(got_pos[:, keep], want_positions[:, keep])
    want = hf.logits(input_ids, attention_mask=attention_mask, **vision)
    got = mc.logits(input_ids, attention_mask=attention_mask, **vision)
    delta = (got - want)[keep].abs().max().item()
    assert delta < tol, delta
    assert want[keep].abs().max().item() > 0.1  # not a degenerate comparison
    return delta


def assert_legacy_tower_names_round_trip(state: dict, source, tmp_path) -> None:
    """A checkpoint in ``source`` (its config already there) whose SigLIP tower is saved under the older
    ``vision_tower.vision_model.`` names converts to Megatron-Core and back to ``state`` (today's names), bit
    for bit."""
    from safetensors import safe_open
    from safetensors.torch import save_file

    old = {("vision_tower.vision_model." + k.removeprefix("vision_tower.") if k.startswith("vision_tower.") else k):
           v.contiguous() for k, v in state.items()}
    assert any(k.startswith("vision_tower.vision_model.") for k in old)
    save_file(old, source / "model.safetensors", metadata={"format": "pt"})
    convert(source, tmp_path / "mcore", "mcore")
    convert(tmp_path / "mcore", tmp_path / "back", "hf")
    with safe_open(tmp_path / "back" / "model.safetensors", "pt") as f:
        back = {k: f.get_tensor(k) for k in f.keys()}
    assert sorted(back) == sorted(state)
    assert all(torch.equal(back[k], state[k]) for k in state)
