"""Vision-language SFT data as megatron-energon datasets: ``pai-zoo dataset prepare FILE.jsonl --output DIR`` writes
WebDataset tar shards and energon's ``.nv-meta`` (energon's own ``prepare_dataset``: the shard index and
``split.yaml``; a ``dataset.yaml`` naming energon's ``CrudeWebdataset``), and ``train --sft --data DIR`` reads them
back through energon's loader with a cooker of pai-zoo's (:func:`read_vision_dataset`).

A sample is one record of :mod:`pai_zoo.data.vision_sft`: ``KEY.json`` holds ``{"messages": [...]}`` (content
lists whose image entries name the sample's own files) and ``KEY.image0.png``, ``KEY.image1.jpg`` ... the image
files' bytes as given; a video entry names its frames (``KEY.video0.frame000.png`` ..., a folder of frames) or its
file (``KEY.video0.mp4``). Every sample goes to energon's ``train`` split part; ``train --split`` divides the records
as it divides other SFT data. The shards are written into ``DIR.tmp`` and renamed to ``DIR`` at the end.
"""
from __future__ import annotations

import contextlib
import io
import json
import tarfile
from pathlib import Path

from ..plugin.errors import DataError, PaiZooError
from ..plugin.vision import read_image
from ..util.outputs import output_folder
from .vision_media import FRAME_SUFFIXES, read_video
from .vision_sft import read_vision_records, record_videos

__all__ = ["is_energon_dataset", "prepare_vision_dataset", "read_vision_dataset"]

META = ".nv-meta"
SPLIT_PART = "train"


def is_energon_dataset(path) -> bool:
    """Whether ``path`` is a prepared energon dataset (``.nv-meta/dataset.yaml``)."""
    return (Path(path) / META / "dataset.yaml").is_file()


def _energon():
    try:
        import megatron.energon  # noqa: F401
    except ImportError:
        raise PaiZooError("megatron-energon is not installed: pip install 'pai-zoo[vision]'") from None


def _add(tar: tarfile.TarFile, name: str, payload: bytes) -> None:
    info = tarfile.TarInfo(name)
    info.size = len(payload)
    tar.addfile(info, io.BytesIO(payload))


def _add_video(tar: tarfile.TarFile, key: str, k: int, video: Path):
    """Video ``k`` of sample ``key`` into ``tar``: its frames' files (a folder) or its file; the name(s) the
    sample's messages give it."""
    if video.is_dir():
        frames = sorted(f for f in video.iterdir() if f.is_file() and f.suffix.lower() in FRAME_SUFFIXES)
        names = [f"video{k}.frame{j:05d}{f.suffix.lower()}" for j, f in enumerate(frames)]
        for name, frame in zip(names, frames):
            _add(tar, f"{key}.{name}", frame.read_bytes())
        return names
    name = f"video{k}{video.suffix.lower() or '.mp4'}"
    _add(tar, f"{key}.{name}", video.read_bytes())
    return name


def _read_video(files: dict, named, where: str):
    """A sample's video: PIL frames from its frame files, or its video file decoded (through a temporary file)."""
    import tempfile

    from PIL import Image

    if isinstance(named, list):
        return [Image.open(io.BytesIO(files[n])).convert("RGB") for n in named]
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / named
        path.write_bytes(files[named])
        return read_video(path, where)


def prepare_vision_dataset(source, output, samples_per_shard: int = 1000, *, force: bool = False) -> dict:
    """Write ``source`` (a vision SFT JSON Lines file) as an energon dataset at ``output`` (by
    :mod:`pai_zoo.util.outputs`' rule: an existing folder only with ``force``); returns counts."""
    _energon()
    if samples_per_shard < 1:
        raise DataError(f"--samples-per-shard must be positive (got {samples_per_shard})")
    output = Path(output)
    if output.exists() and not force:
        raise DataError(f"{output} exists; pass --force to replace it")
    records = read_vision_records(source)
    for where, messages, images in records:  # every image and video readable before anything is written
        for image in images:
            read_image(image, where)
        for video in record_videos(messages):
            read_video(video, where)
    with output_folder(output, force=force) as tmp:
        shards, images_written = _write_shards(tmp, records, samples_per_shard)
    return {"records": len(records), "images": images_written, "shards": len(shards)}


def _write_shards(tmp: Path, records, samples_per_shard: int) -> tuple[list, int]:
    """The tar shards and energon's index of ``records`` in the folder ``tmp``: the shards' names, the images."""
    import yaml
    from megatron.energon.flavors.webdataset.base_webdataset import BaseWebdatasetFactory

    shards, images_written = [], 0
    for first in range(0, len(records), samples_per_shard):
        name = f"shard-{len(shards):06d}.tar"
        with tarfile.open(tmp / name, "w") as tar:
            for index, (_, messages, images) in enumerate(records[first:first + samples_per_shard], start=first):
                key, names = f"{index:08d}", {}
                for k, image in enumerate(images):
                    names[image] = f"image{k}{Path(image).suffix.lower() or '.png'}"
                    _add(tar, f"{key}.{names[image]}", Path(image).read_bytes())
                for k, video in enumerate(record_videos(messages)):
                    names[video] = _add_video(tar, key, k, Path(video))
                images_written += len(images)
                renamed = [{**m, "content": [{**p, p["type"]: names[p[p["type"]]]}
                                             if p.get("type") in ("image", "video") else p
                                             for p in m["content"]]} if isinstance(m["content"], list) else m
                           for m in messages]
                _add(tar, f"{key}.json", json.dumps({"messages": renamed}, ensure_ascii=False).encode())
        shards.append(name)
    with contextlib.redirect_stdout(io.StringIO()):  # energon's own progress lines
        BaseWebdatasetFactory.prepare_dataset(tmp, shards, split_parts_ratio=[(SPLIT_PART, 1.0)], shuffle_seed=None,
                                              workers=1)
    (tmp / META / "dataset.yaml").write_text(yaml.dump({"__module__": "megatron.energon",
                                                        "__class__": "CrudeWebdataset"}, sort_keys=False))
    return shards, images_written


def read_vision_dataset(folder) -> list[tuple[str, list[dict], list]]:
    """``(where, messages, images)`` per sample of a prepared energon dataset, in its order, read through
    energon's loader (one process, no workers); images as PIL images."""
    _energon()
    from dataclasses import dataclass

    from megatron.energon import (
        Cooker,
        DefaultTaskEncoder,
        Sample,
        WorkerConfig,
        get_loader,
        get_val_dataset,
        stateless,
    )
    from megatron.energon.task_encoder.cooking import basic_sample_keys
    from PIL import Image

    @dataclass
    class VisionRecord(Sample):
        messages: list
        files: dict

    @stateless
    def cook(crude):
        files = {k: v for k, v in crude.items() if k.startswith(("image", "video"))}
        return VisionRecord(**basic_sample_keys(crude), messages=json.loads(crude["json"])["messages"], files=files)

    class Encoder(DefaultTaskEncoder):
        decoder = None  # the files' bytes as written
        cookers = [Cooker(cook)]

        def batch(self, samples):
            return samples

        def encode_batch(self, batch):
            return batch

    folder = Path(folder)
    config = WorkerConfig(rank=0, world_size=1, num_workers=0)
    dataset = get_val_dataset(folder, split_part=SPLIT_PART, worker_config=config, batch_size=1,
                              task_encoder=Encoder())
    out = []
    for (sample,) in get_loader(dataset, worker_config=config):
        where = f"{folder}:{sample.__key__}"
        images, messages = [], []
        for m in sample.messages:
            if isinstance(m["content"], list):
                m = {**m, "content": [{**p, "video": _read_video(sample.files, p["video"], where)}
                                      if p.get("type") == "video" else p for p in m["content"]]}
                for part in m["content"]:
                    if part.get("type") == "image":
                        images.append(Image.open(io.BytesIO(sample.files[part["image"]])).convert("RGB"))
            messages.append(m)
        out.append((where, messages, images))
    if not out:
        raise DataError(f"{folder}: the energon dataset holds no samples")
    return out
