"""LoRA adapters on a megatron-core model's own parallel linears (any family, found by
:mod:`pai_zoo.lora.targets`).

Each adapted ``ColumnParallelLinear`` / ``RowParallelLinear`` gets a child ``lora_adapters`` (one A and B per HF
projection fused into it) and a forward hook that adds ``scaling * B(A(dropout(x)))`` to the linear's output; the
base weights are frozen. Tensor parallelism follows the base linear:

- column-parallel base: A replicated, B split by output rows. ``x A^T`` is the same on every rank; its gradient
  is summed over the ranks (``copy_to_tensor_model_parallel_region`` on the low-rank activation). With sequence
  parallelism ``x`` is a sequence shard: the low-rank activation is gathered instead, and A is marked
  ``sequence_parallel`` so that megatron-core's ``finalize_model_grads`` sums its gradient over the ranks;
- row-parallel base: A split by input columns, B replicated. The partial ``x A^T`` is all-reduced (reduce-scattered
  over the sequence with sequence parallelism, B then marked ``sequence_parallel``).

A is drawn on the full shape from a generator seeded by the run's seed and the adapter's name, then sliced, so the
same seed gives the same adapter at any tensor-parallel size; B starts at zero (PEFT's default initialisation).
Pipeline stages adapt their own layers (global layer numbers in every name).
"""
from __future__ import annotations

import math
import zlib

import torch

from ..families.registry import get_registry
from ..tables.mapping import MappingContext
from .settings import LoraError, LoraSettings
from .targets import ADAPTERS, LAYER, Target, fused_positions, lora_targets, select

_HOOK = "_pai_zoo_lora_hook"


def _tp(module) -> tuple[int, int]:
    group = module.tp_group
    return group.size(), group.rank()


class _Pair(torch.nn.Module):
    """One HF projection's adapter: ``lora_A`` [rank, in] and ``lora_B`` [out, rank] (this rank's shares), and
    where its output rows go in the linear's local output (``positions``, not saved)."""

    def __init__(self, a: torch.Tensor, b: torch.Tensor, positions: torch.Tensor):
        super().__init__()
        self.lora_A = torch.nn.Parameter(a)
        self.lora_B = torch.nn.Parameter(b)
        self.register_buffer("positions", positions, persistent=False)


class LoraAdapters(torch.nn.Module):
    """The adapters of one linear (see the module docstring). ``parallel``: ``"column"`` or ``"row"``."""

    def __init__(self, linear, parallel: str, settings: LoraSettings, pairs: dict[str, _Pair], out_rows: int):
        super().__init__()
        self.parallel = parallel
        self.scaling = settings.scaling
        self.dropout = settings.dropout
        self.out_rows = out_rows  # the linear's local output rows
        self.sequence_parallel = bool(getattr(linear, "sequence_parallel", False))
        self.tp_group = linear.tp_group
        self.pairs = torch.nn.ModuleDict(pairs)

    def _dropped(self, x):
        return torch.nn.functional.dropout(x, self.dropout, self.training) if self.dropout else x

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from megatron.core.tensor_parallel import mappings

        ys, positions = [], []
        for pair in self.pairs.values():
            z = torch.matmul(self._dropped(x), pair.lora_A.t())
            if self.parallel == "column":
                z = (mappings.gather_from_sequence_parallel_region(z, group=self.tp_group) if self.sequence_parallel
                     else mappings.copy_to_tensor_model_parallel_region(z, group=self.tp_group))
            else:
                z = (mappings.reduce_scatter_to_sequence_parallel_region(z, group=self.tp_group)
                     if self.sequence_parallel else mappings.reduce_from_tensor_model_parallel_region(z,
                                                                                                      group=self.tp_group))
            ys.append(torch.matmul(z, pair.lora_B.t()) * self.scaling)
            positions.append(pair.positions)
        y = torch.cat(ys, dim=-1)
        return y.new_zeros(*y.shape[:-1], self.out_rows).index_copy(-1, torch.cat(positions), y)


def _hook(module, args, kwargs, output):
    x = args[0] if args else kwargs["input_"]
    out, bias = output
    return out + module.lora_adapters(x).to(out.dtype), bias


def _keep_input(module, args, kwargs):
    module._pai_zoo_lora_input = args[0] if args else kwargs["input_"]


def _before_post_norm(linear):
    """A pre-hook on a post-norm linear's ``post_layernorm`` (:mod:`pai_zoo.mcore.post_norm`: Gemma-2's and GLM-4's
    norms after attention and MLP): the update joins the linear's output before the norm, as in PEFT's model."""
    def hook(norm, args):
        x, linear._pai_zoo_lora_input = linear._pai_zoo_lora_input, None
        return (args[0] + linear.lora_adapters(x).to(args[0].dtype), *args[1:])

    return hook


def _hook_up(linear) -> list:
    if isinstance(getattr(linear, "post_layernorm", None), torch.nn.Module):
        return [linear.register_forward_pre_hook(_keep_input, with_kwargs=True),
                linear.post_layernorm.register_forward_pre_hook(_before_post_norm(linear))]
    return [linear.register_forward_hook(_hook, with_kwargs=True)]


def _parallel_of(linear) -> str:
    from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear

    if isinstance(linear, ColumnParallelLinear):
        if linear.gather_output:
            raise LoraError(f"{type(linear).__name__} with gather_output: not adaptable")
        return "column"
    if isinstance(linear, RowParallelLinear):
        if not linear.input_is_parallel:
            raise LoraError(f"{type(linear).__name__} without input_is_parallel: not adaptable")
        return "row"
    raise LoraError(f"{type(linear).__name__}: LoRA adapts megatron-core's local ColumnParallelLinear and "
                    "RowParallelLinear (train with --transformer-impl local)")


def _local_to_global(local_rows: int, tp: int, rank: int, gated: bool) -> torch.Tensor:
    """The global fused row of each local output row of a column-parallel linear (a gated ``linear_fc1`` holds
    ``[gate share; up share]``)."""
    if not gated:
        return torch.arange(rank * local_rows, (rank + 1) * local_rows)
    half = local_rows // 2
    return torch.cat([torch.arange(rank * half, (rank + 1) * half),
                      tp * half + torch.arange(rank * half, (rank + 1) * half)])


def initial_a(name: str, rank: int, in_features: int, seed: int) -> torch.Tensor:
    """A's start, as PEFT draws it (``kaiming_uniform_(a=sqrt(5))``), on the full shape from a generator of its own
    seeded by ``seed`` and the adapter's name: the same at any tensor-parallel size."""
    generator = torch.Generator().manual_seed((seed * 1_000_003 + zlib.crc32(name.encode())) % (2**63))
    a = torch.empty(rank, in_features)
    torch.nn.init.kaiming_uniform_(a, a=math.sqrt(5), generator=generator)
    return a


def _layers(model):
    decoder = getattr(model, "decoder", None)
    return [] if decoder is None else list(decoder.layers)


def attach(model, chosen: dict[Target, tuple[int, ...]], settings: LoraSettings, config, ctx, seed: int) -> int:
    """Freeze ``model`` and give each chosen target of each of its decoder layers its adapters (``chosen``: from
    :func:`pai_zoo.lora.targets.select`); returns the number of adapted linears on this rank."""
    from megatron.core.tensor_parallel.layers import set_tensor_model_parallel_attributes

    for p in model.parameters():
        p.requires_grad_(False)
    count = 0
    for layer in _layers(model):
        g = layer.layer_number - 1
        for target, which in chosen.items():
            if not ctx.is_layer_of(g, target.row.layer_kind):
                continue
            try:
                linear = layer.get_submodule(target.in_module)
            except AttributeError:
                continue
            parallel = _parallel_of(linear)
            tp, rank = _tp(linear)
            weight = linear.weight
            out_local, in_local = weight.shape
            fused = out_local * tp if parallel == "column" else out_local
            sorted_positions = [p.sort().values for p in fused_positions(target, ctx, fused)]
            gated = parallel == "column" and target.in_module.endswith("linear_fc1") and bool(
                config.get("gated_linear_unit"))
            local_global = (_local_to_global(out_local, tp, rank, gated) if parallel == "column"
                            else torch.arange(out_local))
            pairs = {}
            for i in which:
                leaf = target.leaves[i]
                name = f"{target.mcore.replace(LAYER, str(g))}.{ADAPTERS}.{leaf}"
                mine = torch.isin(local_global, sorted_positions[i]).nonzero().flatten()
                k = torch.searchsorted(sorted_positions[i], local_global[mine])
                rows = sorted_positions[i].numel()
                share = rows // tp if parallel == "column" else rows
                start = rank * share if parallel == "column" else 0
                if not torch.equal(k, torch.arange(start, start + share)):
                    raise LoraError(f"{name}: this rank's rows of {leaf} are not a contiguous share; LoRA cannot "
                                    "split its B by output rows")
                a = initial_a(name, settings.rank, in_local * (tp if parallel == "row" else 1), seed)
                if parallel == "row":
                    a = a[:, rank * in_local:(rank + 1) * in_local]
                pair = _Pair(a.to(weight.dtype).contiguous(), torch.zeros(share, settings.rank, dtype=weight.dtype),
                             mine)
                split = pair.lora_B if parallel == "column" else pair.lora_A
                replicated = pair.lora_A if parallel == "column" else pair.lora_B
                if tp > 1:
                    set_tensor_model_parallel_attributes(split, True, 0 if parallel == "column" else 1, 1)
                if getattr(linear, "sequence_parallel", False):
                    replicated.sequence_parallel = True
                pairs[leaf] = pair
            linear.lora_adapters = LoraAdapters(linear, parallel, settings, pairs, out_local)
            setattr(linear, _HOOK, _hook_up(linear))
            count += 1
    return count


def adapters_of(model) -> dict:
    """``{global name: (LoraAdapters' pair, parallel, tp, rank)}`` of this rank's adapters."""
    found = {}
    for layer in _layers(model):
        g = layer.layer_number - 1
        for path, module in layer.named_modules():
            if isinstance(module, LoraAdapters):
                tp, rank = module.tp_group.size(), module.tp_group.rank()
                for leaf, pair in module.pairs.items():
                    found[f"decoder.layers.{g}.{path}.{leaf}"] = (pair, module.parallel, tp, rank)
    return found


def has_lora(model) -> bool:
    return any(isinstance(m, LoraAdapters) for m in model.modules())


def load_adapters(model, mcore_adapters: dict, where: str) -> None:
    """Fill this rank's adapters from full adapters in mcore form (:mod:`pai_zoo.lora.targets`): the model's
    adapters and the given ones must match one to one."""
    own = adapters_of(model)
    layers = {f"decoder.layers.{layer.layer_number - 1}." for layer in _layers(model)}
    given = {n.rsplit(".", 1)[0] for n in mcore_adapters if any(n.startswith(p) for p in layers)}
    missing, unexpected = sorted(set(own) - given), sorted(given - set(own))
    if missing or unexpected:
        raise LoraError(f"{where}: the adapters do not match the model's targets: missing "
                        f"{missing[:3]}{' ...' if len(missing) > 3 else ''}, unexpected "
                        f"{unexpected[:3]}{' ...' if len(unexpected) > 3 else ''}")
    with torch.no_grad():
        for name, (pair, parallel, tp, rank) in own.items():
            a, b = mcore_adapters[f"{name}.lora_A"], mcore_adapters[f"{name}.lora_B"]
            if parallel == "column":
                share = b.shape[0] // tp
                b = b[rank * share:(rank + 1) * share]
            else:
                share = a.shape[1] // tp
                a = a[:, rank * share:(rank + 1) * share]
            for got, want, what in ((a, pair.lora_A, "lora_A"), (b, pair.lora_B, "lora_B")):
                if tuple(got.shape) != tuple(want.shape):
                    raise LoraError(f"{where}: {name}.{what} has shape {tuple(got.shape)} here; the model's is "
                                    f"{tuple(want.shape)} (rank {a.shape[0]} vs {pair.lora_A.shape[0]}?)")
                want.copy_(got)


def sharded_state(model) -> dict:
    """The adapters as megatron-core ``ShardedTensor`` s under their global names (a run checkpoint's model
    state: the base is not saved)."""
    from megatron.core.utils import make_sharded_tensor_for_checkpoint, make_tp_sharded_tensor_for_checkpoint

    state = {}
    for name, (pair, parallel, tp, _) in adapters_of(model).items():
        split, replicated = (("lora_B", "lora_A") if parallel == "column" else ("lora_A", "lora_B"))
        axis = 0 if parallel == "column" else 1
        state[f"{name}.{split}"] = make_tp_sharded_tensor_for_checkpoint(getattr(pair, split),
                                                                         f"{name}.{split}", axis)
        state[f"{name}.{replicated}"] = make_sharded_tensor_for_checkpoint(getattr(pair, replicated),
                                                                           f"{name}.{replicated}")
    return state


def load_sharded(model, state: dict) -> None:
    """Copy a loaded :func:`sharded_state` back into the adapters."""
    with torch.no_grad():
        for name, (pair, _, _, _) in adapters_of(model).items():
            pair.lora_A.copy_(state[f"{name}.lora_A"])
            pair.lora_B.copy_(state[f"{name}.lora_B"])


def add_lora(model, family, config, settings: LoraSettings, seed: int = 0, adapters: dict | None = None,
             where: str = "the adapter") -> int:
    """Freeze ``model`` (a GPTModel or its virtual-pipeline chunks) and give it ``settings``' adapters: drawn from
    ``seed``, or ``adapters`` (full, mcore form). Returns the number of adapted linears on this rank."""
    table = get_registry().weight_map(family, config)
    ctx = MappingContext.from_config(config)
    chosen = select(lora_targets(table), settings.targets, family.name)
    chunks = model if isinstance(model, (list, tuple)) else [model]
    count = sum(attach(chunk, chosen, settings, config, ctx, seed) for chunk in chunks)
    if adapters is not None:
        for chunk in chunks:
            load_adapters(chunk, adapters, where)
    return count
