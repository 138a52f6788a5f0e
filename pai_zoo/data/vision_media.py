"""The images and videos of a vision-language prompt or SFT record, through the checkpoint's own transformers
processors, for generation (:mod:`pai_zoo.generation.images`) and training (:mod:`pai_zoo.data.vision_sft`).

* An image: a file PIL opens (:func:`pai_zoo.vision.read_image`).
* A video: a folder of frames (its image files, sorted by name) or a video file, decoded by transformers'
  ``load_video`` with the first decoder installed (torchcodec, PyAV, decord, OpenCV); without one a video file is
  refused in one line naming what to install, and a folder of frames still works.

:class:`VisionProcessor` runs the checkpoint's own processors. :meth:`VisionProcessor.prompt` gives a prompt's
ids expanded by the checkpoint's processor class (``AutoProcessor``'s: its text for each placeholder, repeats or
Qwen3-VL's timestamps) and the inputs it makes, keeping every output the family reads
(:func:`pai_zoo.vision.accepted_inputs`: ``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``,
``video_grid_thw``, ``second_per_grid_ts`` and the family's own :attr:`~pai_zoo.vision.VisionSpec.inputs`); where
the folder has no processor class for it, the image and video processors make the inputs and each placeholder is
repeated :attr:`~pai_zoo.vision.VisionSpec.tokens` times (:func:`expand_media`). transformers' video processors need
torchvision; where it is missing and the image processor is a patch processor of Qwen2-VL's kind (it has
``temporal_patch_size``), :func:`frames_video_processor` stands in: the frames go through the image processor at the
video processor's settings and are regrouped into the video processor's layout (:func:`frames_as_video`), equal to
its output (tested where torchvision loads). A folder of frames is taken as sampled (``do_sample_frames=False``),
its rate unknown (transformers then assumes 24 fps). :func:`expand_mask` carries an SFT record's loss mask over the
processor's expansion.
"""
from __future__ import annotations

import json
from pathlib import Path
from typing import Any, Sequence

from ..plugin.errors import PaiZooError
from ..plugin.vision import accepted_inputs, expand_media, read_image

__all__ = ["FRAME_SUFFIXES", "VisionProcessor", "count_runs", "expand_media", "frames_as_video", "read_video"]

#: The files of a frames folder, in name order.
FRAME_SUFFIXES = (".png", ".jpg", ".jpeg", ".bmp", ".webp", ".gif", ".tif", ".tiff")
#: transformers' ``load_video`` backends, in the order tried: (backend, module, pip package).
DECODERS = (("torchcodec", "torchcodec", "torchcodec"), ("pyav", "av", "av"), ("decord", "decord", "decord"),
            ("opencv", "cv2", "opencv-python"))
#: The frame rate transformers assumes for frames given without one (``VideoMetadata.sampled_fps``).
DEFAULT_FPS = 24.0
VIDEO_CONFIG = "video_preprocessor_config.json"


class Video:
    """A video's frames (PIL images or an array ``[t, h, w, 3]``), its frame rate (None: unknown) and, for a decoded
    file, transformers' ``VideoMetadata``."""

    def __init__(self, frames, fps: float | None, source: str, metadata=None):
        self.frames, self.fps, self.source, self.metadata = frames, fps, source, metadata

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
    return Video(frames, getattr(metadata, "fps", None), str(path), metadata)


def count_runs(ids: Sequence[int], token: int) -> int:
    """How many runs of ``token`` ``ids`` holds (one unexpanded placeholder, or an expanded run, per item)."""
    return sum(1 for i, t in enumerate(ids) if t == token and (i == 0 or ids[i - 1] != token))


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


def frames_video_processor(settings: dict, image_processor, refusal: str | None = None):
    """A stand-in for transformers' video processor of a Qwen2-VL-style checkpoint where torchvision is missing: a
    ``VideoProcessorMixin`` (so the checkpoint's processor class takes it) that makes the video processor's outputs
    from the frames with :func:`frames_as_video`, and its ``video_metadata`` as transformers makes it for frames.
    ``refusal``: the line it raises when called, where the image processor cannot stand in."""
    import torch
    from transformers.feature_extraction_utils import BatchFeature
    from transformers.video_processing_utils import VideoProcessorMixin
    from transformers.video_utils import make_batched_metadata, make_batched_videos

    class FramesVideoProcessor(VideoProcessorMixin):
        stand_in = True

        def __init__(self):
            super().__init__()
            for key in ("patch_size", "merge_size", "temporal_patch_size"):
                setattr(self, key, settings.get(key, getattr(image_processor, key, None)))

        def __call__(self, videos, video_metadata=None, return_metadata=False, do_sample_frames=None, **_):
            if refusal:
                raise PaiZooError(refusal)
            if do_sample_frames is None and settings.get("do_sample_frames"):
                raise PaiZooError("sampling a video file's frames needs transformers' video processor: pip install "
                                  "torchvision, or give a folder of the frames to use")
            videos = make_batched_videos(videos)  # arrays [t, h, w, c], as transformers' processors take them
            parts = [frames_as_video(image_processor, list(v), settings) for v in videos]
            if settings.get("video_processor_type", "Qwen2VLVideoProcessor") != "Qwen2VLVideoProcessor":
                _check_clip_bounds(parts, settings, image_processor)
            out = {k: torch.cat([p[k] for p in parts]) for k in parts[0]}
            if return_metadata:
                out["video_metadata"] = make_batched_metadata(videos, video_metadata=video_metadata)
            return BatchFeature(out)

    return FramesVideoProcessor()


def _check_clip_bounds(parts, settings: dict, image_processor) -> None:
    """The stand-in resizes each frame by the image processor's rule; a video processor that bounds the whole
    clip's pixels (Qwen3-VL's: ``t * h * w``) resizes the same only while each frame is at least the lower bound
    and the clip at most the upper one. Outside that, one line asking for torchvision."""
    size = settings.get("size") or {}
    low, high = size.get("shortest_edge"), size.get("longest_edge")
    patch = settings.get("patch_size", getattr(image_processor, "patch_size", 14))
    tp = settings.get("temporal_patch_size", getattr(image_processor, "temporal_patch_size", 2))
    for part in parts:
        t, h, w = part["video_grid_thw"][0].tolist()
        pixels = h * w * patch * patch
        if (low and pixels < low) or (high and t * tp * pixels > high):
            raise PaiZooError(f"a video of {t * tp} frames of {h * patch}x{w * patch} pixels is outside what the "
                              f"frames' own resizing reproduces of {settings['video_processor_type']}: pip install "
                              "torchvision (transformers' video processor), or give fewer or smaller frames")


def expand_mask(before: Sequence[int], mask: Sequence[int], after: Sequence[int], where: str) -> list[int]:
    """The loss ``mask`` of ``before`` carried to ``after`` (the processor's expansion of ``before``): tokens the two
    share keep their value, what the processor wrote in place of a placeholder gets 0. Every target of ``before``
    must survive, or one :class:`~pai_zoo.PaiZooError` line."""
    from difflib import SequenceMatcher

    out = [0] * len(after)
    for tag, i0, i1, j0, j1 in SequenceMatcher(None, list(before), list(after), autojunk=False).get_opcodes():
        if tag == "equal":
            out[j0:j1] = mask[i0:i1]
    if sum(out) != sum(mask):
        raise PaiZooError(f"{where}: the processor's expansion of the prompt changed {sum(mask) - sum(out)} target "
                          "tokens; the chat template and the processor's tokenizer disagree")
    return out


class VisionProcessor:
    """The checkpoint's processors (loaded from ``folder`` when first needed) for a family (``spec``; ``hf_config``
    its transformers config). :meth:`prompt` expands one prompt's ids and makes its inputs; ``__call__(images,
    videos)`` makes the inputs only."""

    def __init__(self, folder, spec, config, hf_config=None, where: str = "model"):
        self.folder = None if folder is None else Path(folder)
        self.spec, self.config, self.hf_config, self.where = spec, config, hf_config, where
        self._images = self._videos = self._full = None
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
        """transformers' video processor of the checkpoint or, where it cannot load without torchvision and the
        image processor can stand in, :func:`frames_video_processor`."""
        if self._videos is None:
            settings = self._file(VIDEO_CONFIG, "videos")
            try:
                from transformers import AutoVideoProcessor

                self._videos = AutoVideoProcessor.from_pretrained(self.folder)
            except ImportError as exc:  # torchvision missing: a stand-in, which refuses what it cannot do
                why = None if hasattr(self.image_processor(), "temporal_patch_size") else (
                    f"{self.folder}: the checkpoint's video processor ({type(exc).__name__}: transformers' video "
                    "processors need torchvision) cannot load here: pip install torchvision")
                self._videos = frames_video_processor(json.loads(settings.read_text()), self.image_processor(), why)
        return self._videos

    def processor(self):
        """The checkpoint's own processor (``AutoProcessor``'s) or, where it cannot load without torchvision, its
        class with the stand-in video processor (:func:`frames_video_processor`) and the folder's
        ``processor_config.json`` settings; None where the folder has no config, tokenizer or processor for it."""
        if self._full is None:
            self._full = False
            if self.folder is None or not (self.folder / "config.json").is_file():
                return None
            from transformers import AutoProcessor

            try:
                self._full = AutoProcessor.from_pretrained(self.folder)
            except ImportError:  # torchvision missing
                self._full = self._stand_in() or False
            except (KeyError, OSError, ValueError, TypeError, AttributeError):
                self._full = False
            if not hasattr(self._full, "tokenizer"):  # an image processor alone: no prompt expansion
                self._full = False
        return self._full or None

    def _stand_in(self):
        """The processor class of the folder built from its parts, the video processor the stand-in."""
        import inspect

        try:
            from transformers import AutoConfig, AutoTokenizer
            from transformers.models.auto.processing_auto import PROCESSOR_MAPPING_NAMES, processor_class_from_name

            cls = processor_class_from_name(PROCESSOR_MAPPING_NAMES[AutoConfig.from_pretrained(
                self.folder).model_type])
            made = {}
            for attribute in cls.get_attributes():
                if attribute == "tokenizer":
                    made[attribute] = AutoTokenizer.from_pretrained(self.folder)
                elif attribute == "image_processor":
                    made[attribute] = self.image_processor()
                elif attribute == "video_processor" and (self.folder / VIDEO_CONFIG).is_file():
                    made[attribute] = self.video_processor()
                else:
                    return None
            settings = self.folder / "processor_config.json"
            accepted = inspect.signature(cls.__init__).parameters
            extra = {k: v for k, v in (json.loads(settings.read_text()) if settings.is_file() else {}).items()
                     if k in accepted and k not in made}
            if getattr(made.get("video_processor"), "stand_in", False):  # transformers cannot name the video
                # processor's base class without torchvision: the stand-in's class check is left out
                cls = type(cls.__name__, (cls,), {"check_argument_for_proper_class": lambda self, n, a: type(a)})
            return cls(**made, **extra)
        except (KeyError, OSError, ValueError, TypeError, ImportError, AttributeError):
            return None

    def check_named(self, ids: list[int], images: int, videos: int, where: str) -> None:
        """The prompt ``ids`` names as many images and videos as are given: the checkpoint's processor's placeholders
        (``image_token``, ``video_token``) in its text, or, without a processor, the runs of the family's
        placeholder ids. One :class:`~pai_zoo.PaiZooError` line otherwise."""
        processor = self.processor() if images or videos else None
        tokens = self.spec.placeholders(self.config)
        text = None if processor is None else processor.tokenizer.decode(
            ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        for kind, given in (("image", images), ("video", videos)):
            marker = getattr(processor, f"{kind}_token", None) if processor is not None else None
            if processor is not None and marker is None:
                named, shown = 0, f"the processor has no {kind} placeholder"
            elif marker is not None:
                named = text.count(marker)
                shown = f"placeholder id {processor.tokenizer.convert_tokens_to_ids(marker)}, {marker}"
            else:
                named = count_runs(ids, tokens[kind]) if kind in tokens else 0
                shown = f"placeholder id {tokens.get(kind)}"
            if named != given:
                raise PaiZooError(f"{where}: the prompt names {named} {kind}(s) ({shown}) but {given} {kind}(s) are "
                                  f"given; give one {kind} per placeholder")

    def prompt(self, ids: list[int], images: Sequence[Any], videos: Sequence[Video], where: str):
        """``(ids, inputs)``: ``ids`` expanded by the checkpoint's processor (its text for each placeholder: repeats,
        Qwen3-VL's timestamps ...) and the processor's inputs for the family; without a processor class, each
        placeholder repeated :attr:`~pai_zoo.vision.VisionSpec.tokens` times."""
        processor = self.processor() if images or videos else None
        if processor is None:
            inputs = self(images, videos)
            grids = {"image": inputs.get("image_grid_thw"), "video": inputs.get("video_grid_thw")}
            return (expand_media(self.spec, self.config, ids, grids)[0] if inputs else list(ids)), inputs
        text = processor.tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        kwargs = {}
        if videos:
            kwargs["videos"] = [v.frames for v in videos]
            if all(v.metadata is None for v in videos):
                kwargs["do_sample_frames"] = False  # frames as given: the folder's are taken as sampled
            else:
                kwargs["video_metadata"] = [v.metadata or {"total_num_frames": len(v), "fps": None,
                                                           "frames_indices": list(range(len(v)))} for v in videos]
        try:
            out = processor(text=[text], images=list(images) or None, return_tensors="pt", add_special_tokens=False,
                            **kwargs)
        except ValueError as exc:
            raise PaiZooError(f"{where}: the checkpoint's processor refuses the prompt: {exc}") from None
        ids = out["input_ids"]
        # per-token outputs (Gemma 3's token_type_ids) are the prompt's, which the family makes again from the
        # padded batch's ids (VisionSpec.hf_inputs, .bidirectional): not batched
        inputs = {k: v for k, v in out.items() if k in self.keep and getattr(v, "shape", None) != ids.shape}
        return ids[0].tolist(), inputs

    def __call__(self, images: Sequence[Any] = (), videos: Sequence[Video] = ()) -> dict:
        import torch

        out: dict = {}
        if images:
            made = self.image_processor()(images=list(images), return_tensors="pt")
            out.update({k: v for k, v in made.items() if k in self.keep and not k.endswith("_videos")})
        if videos:
            given = ({"do_sample_frames": False} if all(v.metadata is None for v in videos) else
                     {"video_metadata": [v.metadata or {"total_num_frames": len(v), "fps": None,
                                                        "frames_indices": list(range(len(v)))} for v in videos]})
            made = self.video_processor()(videos=[v.frames for v in videos], return_tensors="pt", **given)
            out.update({k: v for k, v in made.items() if k in self.keep and k not in out})
            if getattr(getattr(self.hf_config, "vision_config", None), "tokens_per_second", None) is not None:
                patch = getattr(self.video_processor(), "temporal_patch_size", None) or 2
                out["second_per_grid_ts"] = torch.tensor([patch / (v.fps or DEFAULT_FPS) for v in videos])
        return out
