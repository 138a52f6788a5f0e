"""Megatron-LM's legacy ``torch`` checkpoints: one ``model_optim_rng.pt`` per model-parallel rank, merged into
the full (single-process) megatron-core tensors, one tensor at a time, with the args they carry.

``iter_N/mp_rank_TT[_PPP][_EEE]/model_optim_rng.pt`` holds rank (TT, PPP, EEE)'s ``model`` state dict (or
``model0``, ``model1`` ... for the virtual pipeline stages). Each pipeline stage and virtual stage numbers its
layers from 0; the global layer order is Megatron's interleaved one (virtual stage outer, pipeline stage inner).
Tensor-parallel shards are joined along the dimension in which they differ from the full tensor (rows for
column-parallel weights and the vocabulary, columns for row-parallel ones); a SwiGLU ``linear_fc1`` shard (dense,
routed or shared expert) is ``[its gate rows; its up rows]`` and is joined part by part. Norms stored under
Transformer Engine's names (``linear_qkv.layer_norm_weight``) are read as the local layers'
(``input_layernorm.weight``); ``_extra_state`` entries and the optimizer and random state are ignored. Files are
memory-mapped, so a rank's tensors are read from disk only when merged.

Mixture of experts: expert rank ``EEE`` holds experts ``EEE * n .. EEE * n + n - 1`` (``n = num_experts /
expert_model_parallel_size``), numbered from 0 in its file, and a copy of every other tensor. The experts may be
stored as ``SequentialMLP`` (``experts.local_experts.{j}.linear_fc1.weight``), ``TEGroupedMLP``
(``experts.linear_fc1.weight{j}``) or the legacy ``GroupedMLP`` (``experts.weight1`` ``[hidden, n * fc1 rows]``
and ``experts.weight2`` ``[n * fc2 columns, hidden]``, each expert's weight transposed); all three read as the
sequential names of the global experts.
"""
from __future__ import annotations

import re
from collections import defaultdict
from pathlib import Path

import torch

from ..tables.expert_names import sequential_name
from .base import CheckpointReader
from .megatron_folder import (
    LEGACY_FILE,
    RANK_DIR,
    IterationFolder,
    MegatronCheckpointError,
    checkpoint_args,
)
from .safe_pickle import safe_load


def rank_dir_name(tp: int, pp: int, ep: int, pp_size: int, ep_size: int) -> str:
    """Megatron-LM's legacy rank folder: ``mp_rank_TT``, ``_PPP`` with pipeline parallelism, ``_EEE`` with
    expert parallelism."""
    name = f"mp_rank_{tp:02d}"
    if pp_size > 1:
        name += f"_{pp:03d}"
    if ep_size > 1:
        name += f"_{ep:03d}"
    return name


def first_legacy_file(folder: Path) -> Path:
    ranks = sorted(p for p in folder.iterdir() if RANK_DIR.match(p.name))
    for rank in ranks:
        if (rank / LEGACY_FILE).is_file():
            return rank / LEGACY_FILE
    raise MegatronCheckpointError(f"{folder}: no mp_rank_*/{LEGACY_FILE} file")


_LAYER = re.compile(r"^decoder\.layers\.(\d+)\.(.*)$")
_EXPERT = re.compile(r"^(.*\.experts\.local_experts\.)(\d+)(\..*)$")
#: The legacy ``GroupedMLP``'s two tensors of all local experts -> each expert's name.
_GROUPED_MLP = {"mlp.experts.weight1": "linear_fc1.weight", "mlp.experts.weight2": "linear_fc2.weight"}
#: Transformer Engine's fused-norm names -> the local layer spec's.
TE_NAMES = {
    "self_attention.linear_qkv.layer_norm_weight": "input_layernorm.weight",
    "self_attention.linear_qkv.layer_norm_bias": "input_layernorm.bias",
    "mlp.linear_fc1.layer_norm_weight": "pre_mlp_layernorm.weight",
    "mlp.linear_fc1.layer_norm_bias": "pre_mlp_layernorm.bias",
    # multi-latent attention: the low-rank query / key-value norms fused into the up projections
    "self_attention.linear_q_up_proj.layer_norm_weight": "self_attention.q_layernorm.weight",
    "self_attention.linear_kv_up_proj.layer_norm_weight": "self_attention.kv_layernorm.weight",
}
_GATED = ("linear_fc1.weight", "linear_fc1.bias")


class LegacyReader:
    """The full tensors of a legacy checkpoint, by their single-process megatron-core names."""

    def __init__(self, it: IterationFolder, args: dict):
        self.folder = it.folder
        self.tp = int(args.get("tensor_model_parallel_size") or 1)
        self.pp = int(args.get("pipeline_model_parallel_size") or 1)
        self.ep = int(args.get("expert_model_parallel_size") or 1)
        self.gated = bool(args.get("swiglu"))
        self.hidden = int(args.get("hidden_size") or 0)
        experts = int(args.get("num_experts") or 0)
        etp = args.get("expert_tensor_parallel_size")
        if experts and etp not in (None, self.tp):
            raise MegatronCheckpointError(
                f"{it.folder}: args.expert_tensor_parallel_size={etp} differs from tensor_model_parallel_size="
                f"{self.tp}; legacy checkpoints with their own expert tensor parallelism are not supported: load and "
                "save it with Megatron-LM as torch_dist (--ckpt-format torch_dist), which pai-zoo reads")
        if experts and experts % self.ep:
            raise MegatronCheckpointError(f"{it.folder}: args.num_experts={experts} is not divisible by "
                                          f"expert_model_parallel_size={self.ep}")
        self.local_experts = experts // self.ep if experts else 0
        self.files: dict[tuple[int, int, int], Path] = {}
        missing = []
        for t in range(self.tp):
            for p in range(self.pp):
                for e in range(self.ep):
                    file = self.folder / rank_dir_name(t, p, e, self.pp, self.ep) / LEGACY_FILE
                    (self.files.__setitem__((t, p, e), file) if file.is_file() else missing.append(file))
        if missing:
            raise MegatronCheckpointError(
                f"{missing[0]}: missing ({len(missing)} of {self.tp * self.pp * self.ep} rank files; the args say "
                f"tensor parallel {self.tp}, pipeline parallel {self.pp}, expert parallel {self.ep}); copy the "
                "whole checkpoint folder")
        loaded = {rank: safe_load(file, mmap=True) for rank, file in self.files.items()}  # memory-mapped
        self._states = {rank: self._model_chunks(state, self.files[rank]) for rank, state in loaded.items()}
        self._index = self._build_index()

    @staticmethod
    def _model_chunks(state: dict, file: Path) -> list[dict]:
        if "model" in state:
            return [state["model"]]
        chunks = sorted((k for k in state if re.fullmatch(r"model\d+", k)), key=lambda k: int(k[5:]))
        if not chunks:
            raise MegatronCheckpointError(f"{file}: no 'model' entry (found {sorted(state)}): not a model checkpoint")
        return [state[k] for k in chunks]

    def _build_index(self) -> dict[str, list[tuple[tuple[int, int, int], int, str]]]:
        """global name -> [(rank, chunk, stored key)] for every tensor-parallel rank that holds it."""
        vpp = {len(c) for c in self._states.values()}
        if len(vpp) != 1:
            raise MegatronCheckpointError(f"{self.folder}: the rank files hold different numbers of model chunks")
        vpp = vpp.pop()
        # Layers per (virtual stage, pipeline stage), from tensor rank 0 / expert rank 0.
        offsets, start = {}, 0
        for v in range(vpp):
            for p in range(self.pp):
                offsets[(v, p)] = start
                start += len({m.group(1) for k in self._states[(0, p, 0)][v] if (m := _LAYER.match(k))})
        index: dict[str, list] = defaultdict(list)
        for (t, p, e), chunks in self._states.items():
            for v, state in enumerate(chunks):
                for key, value in state.items():
                    if key.endswith("_extra_state") or value is None:
                        continue
                    m = _LAYER.match(key)
                    if not m:
                        if not e:  # the dense tensors are the same on every expert rank
                            index[key].append(((t, p, e), v, key, None))
                        continue
                    layer, rest = int(m.group(1)) + offsets[(v, p)], TE_NAMES.get(m.group(2), m.group(2))
                    if rest in _GROUPED_MLP:  # one tensor of all local experts: a view per expert
                        for j in range(self._local_experts(key)):
                            name = f"decoder.layers.{layer}.mlp.experts.local_experts.{e * self.local_experts + j}."
                            index[name + _GROUPED_MLP[rest]].append(((t, p, e), v, key, (j, rest)))
                        continue
                    name = sequential_name(f"decoder.layers.{layer}.{rest}")
                    x = _EXPERT.match(name)
                    if x:
                        name = f"{x.group(1)}{int(x.group(2)) + e * self._local_experts(key)}{x.group(3)}"
                    elif e:
                        continue
                    index[name].append(((t, p, e), v, key, None))
        self.num_layers = start
        return dict(index)

    def _local_experts(self, key: str) -> int:
        if not self.local_experts:
            raise MegatronCheckpointError(f"{self.folder}: tensor {key} is an expert's, but the args have no "
                                          "num_experts")
        return self.local_experts

    def keys(self) -> list[str]:
        return list(self._index)

    def global_shape(self, name: str) -> tuple[int, ...]:
        shards = [self._tensor(r) for r in self._index[name]]
        shape = list(shards[0].shape)
        if len(shards) > 1 and any(tuple(s.shape) != tuple(shards[0].shape) for s in shards):
            raise MegatronCheckpointError(f"{self.folder}: tensor {name} has shards of different shapes")
        if name in ("embedding.word_embeddings.weight", "output_layer.weight"):
            shape[0] *= len(shards)
        return tuple(shape)

    def dtype(self, name: str):
        return self._tensor(self._index[name][0]).dtype

    def _tensor(self, ref):
        rank, chunk, key, grouped = ref
        tensor = self._states[rank][chunk][key]
        if grouped is None:
            return tensor
        j, which = grouped  # GroupedMLP: weight1 [h, n * rows], weight2 [n * cols, h], each expert transposed
        n, h = self.local_experts, self.hidden
        if which.endswith("weight1"):
            return tensor.view(n, h, -1)[j].t()
        return tensor.view(n, -1, h)[j].t()

    def check_layout(self, layout, family: str) -> None:
        """The stored tensors are exactly the model's (names and, after merging, shapes)."""
        want, have = set(layout.local_shapes), set(self._index)
        if "output_layer.weight" not in want:  # tied embeddings: the last pipeline stage keeps a copy
            have.discard("output_layer.weight")
        missing, unexpected = sorted(want - have), sorted(have - want)
        if missing or unexpected:
            raise MegatronCheckpointError(
                f"{self.folder}: the rank files do not hold the {family} model the args describe: missing "
                f"{missing[:8]}{' ...' if len(missing) > 8 else ''}, unexpected {unexpected[:8]}"
                f"{' ...' if len(unexpected) > 8 else ''}")
        for name in want:
            if len(self._index[name]) not in (1, self.tp):
                raise MegatronCheckpointError(f"{self.folder}: tensor {name} is on {len(self._index[name])} of "
                                              f"{self.tp} tensor-parallel ranks")

    def read_local(self, layout, name: str):
        """The full tensor ``name`` (shape ``layout.local_shapes[name]``), tensor-parallel shards joined."""

        full = tuple(layout.local_shapes[name])
        refs = sorted(self._index[name], key=lambda r: r[0])
        shards = [self._tensor(r) for r in refs]
        where = f"{self.folder}: tensor {name}"
        if tuple(shards[0].shape) == full:
            return shards[0].to(layout.dtype)
        dims = [d for d in range(len(full)) if shards[0].shape[d] * len(shards) == full[d]]
        same = all(shards[0].shape[d] == full[d] for d in range(len(full)) if d not in dims[:1])
        if len(shards[0].shape) != len(full) or not dims or not same:
            raise MegatronCheckpointError(f"{where}: shards of shape {tuple(shards[0].shape)} on {len(shards)} ranks "
                                          f"do not make the model's {full}")
        dim = dims[0]
        if self.gated and dim == 0 and name.endswith(_GATED):
            gates, ups = zip(*(s.chunk(2, dim=0) for s in shards))
            return torch.cat([*gates, *ups], dim=0).to(layout.dtype)
        return torch.cat(shards, dim=dim).to(layout.dtype)

    def close(self) -> None:
        self._states.clear()


def common_state(it: IterationFolder) -> dict:
    """A legacy iteration's non-tensor state (``args``, ``iteration``, ``checkpoint_version`` ...), from its first
    rank file."""
    state = safe_load(first_legacy_file(it.folder), mmap=True)
    return {k: v for k, v in state.items() if k not in ("model", "optimizer", "rng_state")
            and not k.startswith("model")}


class LegacyCheckpoint(CheckpointReader):
    """A Megatron-LM legacy ``torch`` folder (format ``"megatron-lm-legacy"``); :attr:`config` is its args.

    The rank files do not record the full shapes of tensor-parallel shards: :meth:`read` joins a sharded tensor
    once :meth:`use_layout` has given the model's shapes (``pai_zoo.load`` and ``convert`` do); :attr:`reader`
    reads by megatron-core name with a layout."""

    format = "megatron-lm-legacy"

    def __init__(self, path, it: IterationFolder):
        """``it``: the iteration to read (:func:`pai_zoo.formats.megatron_folder.iteration_folder`)."""
        self.path = Path(path)
        self.iteration = it
        self.common = common_state(self.iteration)
        self.args = checkpoint_args(self.iteration, self.common)
        self.config = self.args
        self.folder = self.iteration.folder
        self.reader = LegacyReader(self.iteration, self.args)
        self._layout = None

    def use_layout(self, layout) -> None:
        """The model's full shapes (:class:`pai_zoo.mcore.dist_ckpt.Layout`), to join tensor-parallel shards."""
        self._layout = layout

    def names(self) -> list[str]:
        return self.reader.keys()

    def shape(self, name: str) -> tuple[int, ...]:
        if self._layout is not None and name in self._layout.local_shapes:
            return tuple(self._layout.local_shapes[name])
        return self.reader.global_shape(name)

    def dtype(self, name: str):
        return self.reader.dtype(name)

    def read(self, name: str):
        if self._layout is not None:
            return self.reader.read_local(self._layout, name)
        refs = self.reader._index[name]
        if len(refs) > 1 and name not in ("embedding.word_embeddings.weight", "output_layer.weight"):
            raise MegatronCheckpointError(
                f"{self.folder}: tensor {name} is split over {len(refs)} tensor-parallel rank files, which do not "
                "record its full shape; read it through pai_zoo.load or pai-zoo convert, which know the model's")
        shards = [self.reader._tensor(r) for r in sorted(refs, key=lambda r: r[0])]
        return shards[0].clone() if len(shards) == 1 else torch.cat(shards, dim=0)

    def weight_files(self) -> list[Path]:
        return sorted(self.reader.files.values())

    def close(self) -> None:
        self.reader.close()
