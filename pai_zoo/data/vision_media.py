"""The images and videos of a vision-language prompt or SFT record, through the checkpoint's own transformers
processors, for generation (:mod:`pai_zoo.generation.images`) and training (:mod:`pai_zoo.data.vision_sft`).

* An image: a file PIL opens (:func:`pai_zoo.vision.read_image`).
* A video: a folder of frames (its image files, sorted by name) or a video file, decoded by transformers'
  ``load_video`` with the first decoder installed (torchcodec, PyAV, decord, OpenCV); without one a video file is
  refused in one line naming what to install, and a folder of frames still works.

:class:`VisionProcessor` runs the checkpoint's image processor (``preprocessor_config.json``) on a prompt's images
and its video processor (``video_preprocessor_config.json``) on its videos, keeping every output the family reads
(:func:`pai_zoo.vision.accepted_inputs`: ``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``,
``video_grid_thw`` and the family's own :attr:`~pai_zoo.vision.VisionSpec.inputs`). transformers' video processors
need torchvision; where it is missing and the image processor is a patch processor of Qwen2-VL's kind (it has
``temporal_patch_size``), the frames go through the image processor at the video processor's settings and are
regrouped into the video processor's layout (:func:`frames_as_video`): the same patches wherever the frames already
have the processor's size (PIL resizes where torchvision would). ``second_per_grid_ts`` is made as transformers'
Qwen2.5-VL processor makes it (``temporal_patch_size / fps``, fps 24 for frames without a rate) for families whose
tower config has ``tokens_per_second``.

:func:`expand_media` repeats each image and video placeholder as often as the tower gives rows for it
(:attr:`~pai_zoo.vision.VisionSpec.tokens`), the loss mask 0 on the repeats.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ..plugin.errors import PaiZooError
from ..plugin.vision import accepted_inputs, read_image

__all__ = ["FRAME_SUFFIXES", "VisionProcessor", "count_runs", "expand_media", "frames_as_video", "read_video"]

#: The files of a frames folder, in name order.
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff")
#: transformers' ``load_video`` backends, in the order tried: (backend, module, pip package).
DECODERS = (("torchcodec", "torchcodec", "torchcodec"), ("pyav", "av", "av"), ("decord", "decord", "decord"),
            ("opencv", "cv2", "opencv-python"))
#: The frame rate transformers assumes for frames given without one (``VideoMetadata.sampled_fps``).
DEFAULT_FPS = 24.0


class Video:
    """A video's frames (PIL images or an array ``[t, h, w, 3]``) and its sampled frame rate (None: unknown)."""

    def __init__(self, frames, fps: float | None, source: str):
        self.frames, self.fps, self.source = frames, fps, source

    def __len__(self) -> int:
        return len(self.frames)


def _decoder():
    import importlib.util

    return next((backend for backend, module, _ in DECODERS if importlib.util.find_spec(module) is not None), None)


def read_video(path, where: str = "video") -> Video:
    """The frames of ``path``: a folder of image files (sorted by name) or a video file (transformers'
    ``load_video``); a :class:`Video` or a list of PIL frames as it is. One :class:`~pai_zoo.PaiZooError` line for a
    missing path, an empty folder, an unreadable frame or a file without a decoder."""
    if isinstance(path, Video):
        return path
    if isinstance(path, (list, tuple)):
        return Video([read_image(f, where) for f in path], None, where)
    path = Path(path)
    if path.is_dir():
        files = sorted(f for f in path.iterdir() if f.is_file() and f.suffix.lower() in FRAME_SUFFIXES)
        if not files:
            raise PaiZooError(f"{where}: {path}: a folder of frames holds no image files "
                              f"({', '.join(FRAME_SUFFIXES)})")
        return Video([read_image(f, where) for f in files], None, str(path))
    if not path.is_file():
        raise PaiZooError(f"{where}: {path}: no such video file or folder of frames")
    backend = _decoder()
    if backend is None:
        raise PaiZooError(f"{where}: {path}: no video decoder is installed to read a video file: pip install av "
                          "(or torchcodec, decord, opencv-python), or give a folder of its frames")
    from transformers.video_utils import load_video

    try:
        frames, metadata = load_video(str(path), backend=backend)
    except Exception as exc:  # noqa: BLE001 - the decoder's own error, one line
        raise PaiZooError(f"{where}: {path}: {backend} cannot read it ({type(exc).__name__}: {exc})") from None
    return Video(frames, getattr(metadata, "fps", None), str(path))


def count_runs(ids: Sequence[int], token: int) -> int:
    """How many runs of ``token`` ``ids`` holds (one unexpanded placeholder, or an expanded run, per item)."""
    return sum(1 for i, t in enumerate(ids) if t == token and (i == 0 or ids[i - 1] != token))


def expand_media(spec, config, ids: list[int], grids: dict, mask: list[int] | None = None):
    """``ids`` (and its loss ``mask``, 0 on the repeats) with each run of a placeholder (``spec.placeholders``:
    image, video) repeated :attr:`~pai_zoo.vision.VisionSpec.tokens` times for its grid row (``grids[kind]``, in
    order). The caller has checked that runs and grid rows are as many."""
    tokens = spec.placeholders(config)
    kinds = {tokens[k]: iter(g.tolist()) for k, g in grids.items() if g is not None and k in tokens}
    mask = list(mask) if mask is not None else [0] * len(ids)
    out, out_mask = [], []
    for i, (t, m) in enumerate(zip(ids, mask)):
        if t in kinds:
            if i > 0 and ids[i - 1] == t:
                continue  # an already expanded run: counted once
            count = spec.tokens(config, next(kinds[t]))
            out += [t] * count
            out_mask += [0] * count
        else:
            out.append(t)
            out_mask.append(m)
    return out, out_mask


def frames_as_video(image_processor, frames, settings: dict) -> dict:
    """A video's ``pixel_values_videos`` ``[t * h * w, c * tp * p * p]`` and ``video_grid_thw`` ``[1, 3]`` made by a
    Qwen2-VL-style patch image processor (``temporal_patch_size``) from its frames, at the video processor's
    ``settings``: each frame's patches (the image processor repeats a frame ``tp`` times) regrouped so that patch
    ``j`` of the temporal axis holds frame ``tp * k + j``, the last frame repeated up to a multiple of ``tp``, as
    transformers' video processor lays them out."""
    import torch

    tp = int(settings.get("temporal_patch_size", image_processor.temporal_patch_size))
    frames = list(frames) + [frames[-1]] * (-len(frames) % tp)
    keys = ("size", "patch_size", "merge_size", "temporal_patch_size", "image_mean", "image_std", "do_resize",
            "do_rescale", "rescale_factor", "do_normalize", "resample", "do_convert_rgb")
    out = image_processor(images=frames, return_tensors="pt", **{k: settings[k] for k in keys if k in settings})
    grid = out["image_grid_thw"]
    if len({tuple(g) for g in grid.tolist()}) != 1:
        raise PaiZooError("a video's frames must have one size; these resize to different grids")
    patches = out["pixel_values"].reshape(len(frames), -1, 3, tp, out["pixel_values"].shape[-1] // (3 * tp))
    grouped = torch.stack([patches[k::tp, :, :, 0] for k in range(tp)], dim=3)  # [t, n, c, tp, p*p]
    _, h, w = grid[0].tolist()
    return {"pixel_values_videos": grouped.reshape(len(frames) // tp * h * w, -1),
            "video_grid_thw": torch.tensor([[len(frames) // tp, h, w]])}


class VisionProcessor:
    """The checkpoint's image and video processors (loaded from ``folder`` when first needed) for a family
    (``spec``, ``hf_config`` the transformers config). ``__call__(images, videos)`` gives the inputs of one prompt."""

    def __init__(self, folder, spec, hf_config=None, where: str = "model"):
        self.folder = None if folder is None else Path(folder)
        self.spec, self.hf_config, self.where = spec, hf_config, where
        self._images = self._videos = None
        self.keep = set(accepted_inputs(spec))

    def _file(self, name: str, what: str) -> Path:
        if self.folder is None or not (self.folder / name).is_file():
            raise PaiZooError(f"{self.folder or self.where}: no {name}: {what} need the checkpoint's own processor "
                              "(convert the published folder, which has it)")
        return self.folder / name

    def image_processor(self):
        if self._images is None:
            self._file("preprocessor_config.json", "images")
            from transformers import AutoImageProcessor

            self._images = AutoImageProcessor.from_pretrained(self.folder)
        return self._images

    def video_processor(self):
        """transformers' video processor of the checkpoint, or ``None`` where it cannot load without torchvision
        and the image processor can stand in (:func:`frames_as_video`)."""
        if self._videos is None:
            settings = self._file("video_preprocessor_config.json", "videos")
            try:
                from transformers import AutoVideoProcessor

                self._videos = AutoVideoProcessor.from_pretrained(self.folder)
            except ImportError as exc:  # torchvision missing
                if not hasattr(self.image_processor(), "temporal_patch_size"):
                    raise PaiZooError(f"{self.folder}: the checkpoint's video processor cannot load ({exc}); "
                                      "pip install torchvision") from None
                self._videos = json.loads(settings.read_text())
        return self._videos

    def __call__(self, images: Sequence[Any] = (), videos: Sequence[Video] = ()) -> dict:
        import torch

        out: dict = {}
        if images:
            made = self.image_processor()(images=list(images), return_tensors="pt")
            out.update({k: v for k, v in made.items() if k in self.keep and not k.endswith("_videos")})
        if videos:
            processor = self.video_processor()
            if isinstance(processor, dict):  # no torchvision: the image processor, regrouped
                parts = [frames_as_video(self.image_processor(), v.frames, processor) for v in videos]
                made = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            else:
                made = processor(videos=[v.frames for v in videos], return_tensors="pt")
            out.update({k: v for k, v in made.items() if k in self.keep and k not in out})
            if getattr(getattr(self.hf_config, "vision_config", None), "tokens_per_second", None) is not None:
                patch = (processor.get("temporal_patch_size") if isinstance(processor, dict)
                         else getattr(processor, "temporal_patch_size", None)) or 2
                out["second_per_grid_ts"] = torch.tensor([patch / (v.fps or DEFAULT_FPS) for v in videos])
        return out
