"""Training samples for ``pai-zoo train``.

Pretraining data goes through megatron-core's own ``BlendedMegatronDatasetBuilder`` and
``GPTDataset`` (document shuffling, sample packing across documents, blending, splits). SFT data
(``pai-zoo preprocess --sft``: ``PREFIX_text_document`` + ``PREFIX_loss_mask_document``) is one
sample per document, with the loss mask and the record boundaries inside packed documents
(attention and positions restart at each record).

Batches are drawn in a fixed order: optimizer step ``s``, micro-step ``m`` on data-parallel rank
``r`` reads samples ``s*G + m*B*D + r*B + [0, B)`` (``G`` global batch, ``B`` batch size, ``D``
data-parallel size), so any layout sees the same samples per step and a resumed run continues
at the same sample.

Each ``--data`` prefix is ``PREFIX`` or ``PREFIX_text_document``, for pretraining and SFT alike
(:mod:`pai_zoo.data.prefix`).
"""
from __future__ import annotations

import math
import warnings
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import torch

from ..data.indexed import IndexedDatasetReader
from ..data.prefix import resolve_prefix, resolve_sft_prefix
from ..data.vision_media import VisionProcessor, read_video
from ..data.vision_sft import read_vision_records, record_videos, vision_example
from ..data.vision_shards import is_energon_dataset, read_vision_dataset
from ..data.vocabulary import check_dataset_vocabulary
from ..hf.models import hf_config_from_mcore
from ..plugin.errors import PaiZooError
from ..plugin.vision import read_image
from .config import TrainConfig


@dataclass
class DatasetTokenizer:
    """What megatron's GPT dataset reads from a tokenizer (no padding token: nothing is masked)."""

    vocab_size: int
    eod: int

    @property
    def unique_identifiers(self) -> dict:  # part of megatron's dataset cache key
        return {"class": "pai_zoo", "vocab_size": self.vocab_size, "eod": self.eod}


def resolved_prefixes(prefixes: list[str], sft: bool = False) -> list[str]:
    """``--data`` prefixes as the files they name (:mod:`pai_zoo.data.prefix`: ``PREFIX`` or
    ``PREFIX_text_document``; for SFT the ``PREFIX`` of both datasets); errors list the pairs that exist nearby."""

    if sft:
        return [str(resolve_sft_prefix(p, what="--data")) for p in prefixes]
    return [str(resolve_prefix(p, what="--data", first=".bin")) for p in prefixes]


def _split_bounds(n: int, weights: list[float]) -> list[tuple[int, int]]:
    """Megatron's document split: contiguous ranges in proportion to ``weights``."""
    total = sum(weights)
    cuts = [0]
    for w in weights:
        cuts.append(cuts[-1] + round(w / total * n))
    cuts = [min(c, n) for c in cuts]
    cuts[-1] = n
    return [(cuts[i], cuts[i + 1]) for i in range(3)]


def is_vision_sft(cfg: TrainConfig) -> bool:
    """``--sft --data FILE.jsonl`` (chat records with images and videos, read in-process:
    :mod:`pai_zoo.data.vision_sft`) or
    ``--sft --data DIR`` of ``pai-zoo dataset prepare`` (megatron-energon shards: :mod:`pai_zoo.data.vision_shards`)."""
    return cfg.sft and len(cfg.data) == 1 and (str(cfg.data[0]).endswith(".jsonl")
                                                 or is_energon_dataset(cfg.data[0]))


def check_data(cfg: TrainConfig, vocab_size: int | None = None) -> None:
    """The dataset files exist and, given the model's ``vocab_size``, their token ids fit it (before any work
    starts; :func:`pai_zoo.data.vocabulary.check_dataset_vocabulary`)."""
    if is_vision_sft(cfg):  # the records and their images read before anything is written
        if is_energon_dataset(cfg.data[0]):
            return  # written by dataset prepare, which checked every record and image
        if not Path(cfg.data[0]).is_file():
            raise PaiZooError(f"--data {cfg.data[0]}: no such file")
        for where, messages, images in read_vision_records(cfg.data[0]):
            for image in images:
                read_image(image, where)
            for video in record_videos(messages):
                read_video(video, where)
        return

    prefixes = resolved_prefixes(cfg.data_blend()[0], cfg.sft)
    if vocab_size is not None:
        for prefix in prefixes:
            check_dataset_vocabulary(prefix + ("_text_document" if cfg.sft else ""), vocab_size, cfg.model)


def build_pretraining_datasets(cfg: TrainConfig, vocab_size: int, eod: int, samples: tuple[int, int], cache: Path):
    """``(train, valid)`` megatron ``GPTDataset``/``BlendedDataset`` objects holding at least
    ``samples`` samples each (``valid`` is ``None`` when it needs none or the split has none)."""
    from megatron.core.datasets.blended_megatron_dataset_builder import (
        BlendedMegatronDatasetBuilder,
    )
    from megatron.core.datasets.gpt_dataset import GPTDataset, GPTDatasetConfig

    prefixes, weights = cfg.data_blend()
    prefixes = resolved_prefixes(prefixes)
    split = ",".join(str(w) for w in cfg.split_weights())
    config = GPTDatasetConfig(
        random_seed=cfg.seed, sequence_length=cfg.sequence_length, blend=(prefixes, weights), split=split,
        path_to_cache=str(cache), tokenizer=DatasetTokenizer(vocab_size, eod),
        reset_position_ids=False, reset_attention_mask=False, eod_mask_loss=False, create_attention_mask=False,
        mid_level_dataset_surplus=0.005,
    )
    sizes = [samples[0], samples[1] or None, None]
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        train, valid, _ = BlendedMegatronDatasetBuilder(GPTDataset, sizes, lambda: True, config).build()
    if train is None or len(train) == 0:
        raise PaiZooError(f"--data {' '.join(cfg.data)}: no training samples of {cfg.sequence_length} tokens "
                          f"(the data is too small for the split {cfg.split})")
    return PretrainingSamples(train), (PretrainingSamples(valid) if valid is not None and samples[1] else None)


class PretrainingSamples:
    """A megatron GPT dataset as ``(tokens, labels, loss_mask, position_ids, segment_ids)`` samples."""

    def __init__(self, dataset):
        self.dataset = dataset

    def __len__(self) -> int:
        return len(self.dataset)

    def __getitem__(self, i: int):
        item = self.dataset[i % len(self.dataset)]
        n = item["tokens"].shape[0]
        return (
            item["tokens"],
            item["labels"],
            item["loss_mask"].float(),
            item["position_ids"],
            torch.zeros(n, dtype=torch.long),
        )


class SFTSamples:
    """Documents of an SFT dataset (``preprocess --sft``), one sample each, shuffled per epoch.

    A sample of a document with tokens ``t`` and mask ``m`` is ``t[:-1]`` with labels ``t[1:]``
    and loss mask ``m[1:]``; inside packed documents, positions restart and attention is
    confined to each record (``segment_ids``)."""

    def __init__(self, prefix: str, documents: tuple[int, int], seed: int, sequence_length: int):
        self.text = IndexedDatasetReader(prefix + "_text_document")
        self.mask = IndexedDatasetReader(prefix + "_loss_mask_document")
        if self.text.num_documents != self.mask.num_documents or len(self.text) != len(self.mask):
            raise PaiZooError(f"--data {prefix}: the text and loss-mask datasets differ in documents "
                              f"({self.text.num_documents} vs {self.mask.num_documents})")
        self.first, self.stop = documents
        self.seed = seed
        self.sequence_length = sequence_length
        self.truncated = 0

    def __len__(self) -> int:
        return self.stop - self.first

    def _document(self, i: int) -> int:
        n = len(self)
        epoch, j = divmod(i, n)
        order = np.random.RandomState((self.seed + epoch) % 2**32).permutation(n)
        return self.first + int(order[j])

    def __getitem__(self, i: int):
        doc = self._document(i)
        tokens = torch.from_numpy(self.text.document(doc).astype(np.int64))
        mask = torch.from_numpy(self.mask.document(doc).astype(np.float32))
        if tokens.shape != mask.shape:
            raise PaiZooError(f"SFT document {doc}: {tokens.numel()} tokens but {mask.numel()} loss-mask entries")
        docs = self.text.document_indices
        lengths = self.text.sequence_lengths[docs[doc]:docs[doc + 1]]
        segment = torch.repeat_interleave(torch.arange(len(lengths)), torch.as_tensor(lengths.astype(np.int64)))
        start = torch.cumsum(torch.as_tensor(lengths.astype(np.int64)), 0) - torch.as_tensor(lengths.astype(np.int64))
        positions = torch.arange(tokens.numel()) - start[segment]
        limit = self.sequence_length + 1
        if tokens.numel() > limit:
            self.truncated += 1
            tokens, mask, segment, positions = tokens[:limit], mask[:limit], segment[:limit], positions[:limit]
        # A label that crosses into the next record is never a target.
        same = (segment[1:] == segment[:-1]).float()
        return tokens[:-1], tokens[1:], mask[1:] * same, positions[:-1], segment[:-1]


def build_sft_datasets(cfg: TrainConfig):
    prefixes, weights = cfg.data_blend()
    if len(prefixes) != 1 or weights is not None:
        raise PaiZooError("--sft takes one dataset prefix (blending SFT datasets is not supported)")
    prefixes = resolved_prefixes(prefixes, sft=True)

    with IndexedDatasetReader(prefixes[0] + "_text_document") as reader:
        n = reader.num_documents
    (t0, t1), (v0, v1), _ = _split_bounds(n, cfg.split_weights())
    if t1 <= t0:
        raise PaiZooError(f"--data {prefixes[0]}: no training documents in split {cfg.split} of {n} documents")
    train = SFTSamples(prefixes[0], (t0, t1), cfg.seed, cfg.sequence_length)
    valid = SFTSamples(prefixes[0], (v0, v1), cfg.seed + 1, cfg.sequence_length) if v1 > v0 else None
    return train, valid


class VisionSFTSamples:
    """A vision-language SFT JSON Lines file (:mod:`pai_zoo.data.vision_sft`), read and processed once: records
    packed in file order into samples of at most ``sequence_length + 1`` tokens (a record is never split, so an
    image or a video never straddles two samples), shuffled per epoch. A sample is the SFT tuple (the family's
    positions, M-RoPE's ``[3, s]`` or plain ones, restarting at each record) plus a dict of its records' processor
    outputs (``pixel_values``, ``image_grid_thw``, ``pixel_values_videos``, ``video_grid_thw`` ...), concatenated in
    record order, or None."""

    def __init__(self, packs: list, seed: int):
        self.packs, self.seed, self.truncated = packs, seed, 0

    def __len__(self) -> int:
        return len(self.packs)

    def __getitem__(self, i: int):
        n = len(self.packs)
        epoch, j = divmod(i, n)
        pack = self.packs[int(np.random.RandomState((self.seed + epoch) % 2**32).permutation(n)[j])]
        tokens = torch.from_numpy(np.concatenate([e.tokens for e in pack]))
        mask = torch.from_numpy(np.concatenate([e.loss_mask for e in pack]).astype(np.float32))
        segment = torch.cat([torch.full((e.tokens.size,), k) for k, e in enumerate(pack)])
        positions = torch.cat([torch.arange(e.tokens.size) if e.positions is None else e.positions for e in pack],
                              dim=-1)
        vision = concat_inputs([e.inputs for e in pack])
        same = (segment[1:] == segment[:-1]).float()  # a label that crosses into the next record is never a target
        return tokens[:-1], tokens[1:], mask[1:] * same, positions[..., :-1], segment[:-1], vision


def concat_inputs(items) -> dict | None:
    """Processor outputs of several records (or samples) concatenated key by key, in order (None: none)."""
    items = [i for i in items if i]
    keys = dict.fromkeys(k for i in items for k in i)
    return {k: torch.cat([torch.as_tensor(i[k]) for i in items if k in i]) for k in keys} or None


def build_vision_sft_datasets(cfg: TrainConfig, family, config, tokenizer, processor_folder):
    """``(train, valid)`` :class:`VisionSFTSamples` of ``--data FILE.jsonl``, split by records as ``--split``."""

    if family.vision is None:
        raise PaiZooError(f"--data {cfg.data[0]}: a JSON Lines file trains directly only on a vision-language "
                          f"model; for {family.name!r} preprocess it first (pai-zoo preprocess --sft)")
    if tokenizer is None:
        raise PaiZooError(f"--model {cfg.model}: vision SFT data needs the model's tokenizer, which it lacks")
    if processor_folder is None or not any((Path(processor_folder) / f).is_file() for f in (
            "preprocessor_config.json", "processor_config.json")):
        raise PaiZooError(f"--model {cfg.model}: no preprocessor_config.json beside the model: vision SFT needs "
                          "the checkpoint's image processor")
    processor = VisionProcessor(processor_folder, family.vision, config, hf_config_from_mcore(family, config),
                                cfg.model)
    reader = read_vision_dataset if is_energon_dataset(cfg.data[0]) else read_vision_records
    records = reader(cfg.data[0])
    examples = [vision_example(where, messages, images, tokenizer, family, config, processor)
                for where, messages, images in records]
    limit = cfg.sequence_length + 1
    for (where, _, _), example in zip(records, examples):
        if example.tokens.size > limit:
            raise PaiZooError(f"{where}: {example.tokens.size} tokens with its images, over --seq-length "
                              f"{cfg.sequence_length} + 1; raise --seq-length or give smaller images")
    (t0, t1), (v0, v1), _ = _split_bounds(len(examples), cfg.split_weights())
    if t1 <= t0:
        raise PaiZooError(f"--data {cfg.data[0]}: no training records in split {cfg.split} of {len(examples)}")

    def packs(part):
        out, current, used = [], [], 0
        for example in part:
            if current and used + example.tokens.size > limit:
                out.append(current)
                current, used = [], 0
            current.append(example)
            used += example.tokens.size
        return out + ([current] if current else [])

    train = VisionSFTSamples(packs(examples[t0:t1]), cfg.seed)
    valid = VisionSFTSamples(packs(examples[v0:v1]), cfg.seed + 1) if v1 > v0 else None
    return train, valid


@dataclass
class Batch:
    tokens: torch.Tensor
    labels: torch.Tensor
    loss_mask: torch.Tensor
    position_ids: torch.Tensor  # [b, s], or M-RoPE's [3, b, s]
    attention_mask: torch.Tensor  # True = masked out (megatron's convention), [b, 1, s, s]
    vision: dict | None = None  # a vision-language batch's processor outputs (pixel_values, image_grid_thw ...)

    def to(self, device) -> "Batch":
        move = {k: v.to(device, non_blocking=True) for k, v in (self.vision or {}).items()}
        return Batch(*(t.to(device, non_blocking=True) for t in (self.tokens, self.labels, self.loss_mask,
                                                                   self.position_ids, self.attention_mask)),
                     move or None)


def collate(samples, length: int) -> Batch:
    """Stack samples padded (loss-masked) to ``length`` tokens, with causal masks that keep
    attention inside each segment."""
    def pad(x, value):
        return torch.nn.functional.pad(x, (0, length - x.shape[-1]), value=value)

    tokens = torch.stack([pad(s[0], 0) for s in samples])
    labels = torch.stack([pad(s[1], 0) for s in samples])
    loss_mask = torch.stack([pad(s[2], 0.0) for s in samples])
    positions = torch.stack([pad(s[3], 0) for s in samples])
    if positions.dim() == 3:  # M-RoPE [b, 3, s] -> megatron-core's [3, b, s]
        positions = positions.transpose(0, 1).contiguous()
    segments = torch.stack([pad(s[4], -1) for s in samples])
    causal = torch.ones(length, length, dtype=torch.bool).tril()
    allowed = causal & (segments[:, :, None] == segments[:, None, :])
    allowed |= torch.eye(length, dtype=torch.bool)  # padding attends to itself (never a target)
    vision = None
    if len(samples[0]) > 5:  # images and videos in batch order, as placed
        vision = concat_inputs([s[5] for s in samples])
    return Batch(tokens, labels, loss_mask, positions, (~allowed).unsqueeze(1), vision)


class BatchSchedule:
    """The fixed order in which samples form micro-batches (see the module docstring)."""

    def __init__(self, samples, cfg: TrainConfig, dp_rank: int, dp_size: int, fixed_length: bool):
        self.samples = samples
        self.cfg = cfg
        self.dp_rank, self.dp_size = dp_rank, dp_size
        self.fixed_length = fixed_length

    def length(self, items) -> int:
        if self.fixed_length:
            return self.cfg.sequence_length
        longest = max(s[0].numel() for s in items)
        return min(self.cfg.sequence_length, math.ceil(longest / self.cfg.pad_length) * self.cfg.pad_length)

    def microbatches(self, step: int, count: int):
        """The ``count`` micro-batches of optimizer step ``step`` (0-based) for this rank."""
        b, g = self.cfg.batch_size, self.cfg.global_batch_size
        batches = []
        for m in range(count):
            first = step * g + m * b * self.dp_size + self.dp_rank * b
            items = [self.samples[first + k] for k in range(b)]
            batches.append(collate(items, self.length(items)))
        return batches
