"""Which tensor/pipeline-parallel sizes a model takes, and how many processes a layout needs.

The one place ``convert``, ``train``, ``generate`` and :func:`pai_zoo.load` ask: an invalid ``--tp``/``--pp``
names the valid ones, and a layout larger than the world (``--tp 3`` without torchrun) is one error line that
gives the torchrun command to run instead (the user's own ``pai-zoo`` arguments when the CLI is running).
Imports neither torch nor megatron-core.
"""
from __future__ import annotations

import shlex
import sys

from ..plugin.errors import PaiZooError
from ..tables.layer_kinds import layer_parts
from ..util.dist import launched_by_torchrun, local_world_size, node_count, world_size


def valid_tp_sizes(num_attention_heads: int, num_query_groups: int | None = None) -> list[int]:
    """The tensor-parallel sizes a model takes: megatron-core splits the attention heads evenly over the TP ranks
    (``tp`` divides the heads), and the key/value groups either split evenly or are replicated (``tp`` divides the
    groups, or the groups divide ``tp``)."""
    groups = num_query_groups or num_attention_heads
    return [t for t in range(1, num_attention_heads + 1)
            if num_attention_heads % t == 0 and (groups % t == 0 or t % groups == 0)]


def valid_pp_sizes(num_layers: int) -> list[int]:
    """The pipeline-parallel sizes a model takes: those that divide its layers."""
    return [p for p in range(1, num_layers + 1) if num_layers % p == 0]


def _sizes(values: list[int]) -> str:
    return ", ".join(map(str, values))


def check_tp(tp: int, num_attention_heads: int, num_query_groups: int | None = None, *, flag: str = "--tp",
             error=PaiZooError) -> None:
    """Raise ``error`` unless ``tp`` is one of :func:`valid_tp_sizes`; the message lists them."""
    valid = valid_tp_sizes(num_attention_heads, num_query_groups)
    if tp not in valid:
        groups = num_query_groups or num_attention_heads
        raise error(f"{flag} {tp} does not fit the model's {groups} key/value head groups ({num_attention_heads} "
                    f"attention heads); valid {flag}: {_sizes(valid)}")


def check_pp(pp: int, num_layers: int, *, flag: str = "--pp", error=PaiZooError) -> None:
    """Raise ``error`` unless ``pp`` divides the model's ``num_layers``; the message lists the valid sizes."""
    if pp < 1 or num_layers % pp:
        raise error(f"{flag} {pp} does not divide the model's {num_layers} layers; "
                    f"valid {flag}: {_sizes(valid_pp_sizes(num_layers))}")


def check_layout(config, tp: int = 1, pp: int = 1, *, cp: int = 1, flags=("--tp", "--pp"), error=PaiZooError) -> None:
    """:func:`check_tp` and :func:`check_pp` for a :class:`~pai_zoo.plugin.config_map.McoreConfig`, and
    :func:`check_context_parallel` for ``cp``."""
    check_pp(pp, config.num_layers, flag=flags[1], error=error)
    check_tp(tp, config.num_attention_heads, config.num_query_groups, flag=flags[0], error=error)
    check_linear_heads(config, tp, flag=flags[0], error=error)
    check_context_parallel(config, cp, error=error)


def check_context_parallel(config, cp: int, *, flag: str = "--cp", error=PaiZooError) -> None:
    """Context parallelism splits each sequence over ranks; pai-zoo's recurrent layers (Gated DeltaNet, Mamba-2) and
    sparse attention's indexer read whole sequences, so ``cp > 1`` is refused for a model that has them (before any
    model is built) instead of failing inside a layer."""
    if cp <= 1:
        return
    kinds = {part for parts in layer_parts(config) for part in parts}
    names = [name for kind, name in (("linear_attention", "Gated DeltaNet"), ("mamba", "Mamba-2")) if kind in kinds]
    if config.get("dsa_indexer_topk"):
        names.append("DeepSeek sparse attention")
    if names:
        raise error(f"{flag} {cp}: context parallelism is not supported for {' and '.join(names)} layers (they read "
                    f"the whole sequence on one rank); leave {flag} out")


def check_linear_heads(config, tp: int, *, flag: str = "--tp", error=PaiZooError) -> None:
    """Gated DeltaNet layers (``experimental_attention_variant`` ``gated_delta_net``): megatron-core splits their key
    heads and value heads evenly over the TP ranks, so ``tp`` must divide both; the message lists the sizes that fit
    the attention heads too."""
    if config.get("experimental_attention_variant") != "gated_delta_net":
        return
    keys, values = int(config.get("linear_num_key_heads") or 1), int(config.get("linear_num_value_heads") or 1)
    if keys % tp or values % tp:
        valid = [t for t in valid_tp_sizes(config.num_attention_heads, config.num_query_groups)
                 if keys % t == 0 and values % t == 0]
        raise error(f"{flag} {tp} does not divide the Gated DeltaNet's {keys} key heads and {values} value heads "
                    f"(linear_num_key_heads, linear_num_value_heads: split over the TP ranks); valid {flag}: "
                    f"{_sizes(valid)}")


def cli_arguments() -> list[str] | None:
    """The arguments of the running ``pai-zoo`` command (``None`` outside the CLI)."""
    cli = sys.modules.get("pai_zoo.cli")
    return getattr(cli, "ARGV", None)


def torchrun_command(nproc: int, arguments: list[str] | None = None) -> str:
    """``torchrun --nproc-per-node N -m pai_zoo.cli ARGS`` for the running command (``arguments``, default
    :func:`cli_arguments`); outside the CLI, ``torchrun --nproc-per-node N YOUR_SCRIPT.py``."""
    arguments = cli_arguments() if arguments is None else arguments
    tail = f"-m pai_zoo.cli {shlex.join(arguments)}" if arguments is not None else "YOUR_SCRIPT.py"
    return f"torchrun --nproc-per-node {nproc} {tail}"


def check_world(tp: int = 1, pp: int = 1, world: int | None = None) -> None:
    """Raise :class:`PaiZooError` unless ``world`` processes (default: this run's) hold a ``tp`` x ``pp`` layout:
    without torchrun the message is the torchrun command to use; under torchrun, the process count to give."""
    need = tp * pp
    world = world_size() if world is None else world
    if world % need == 0:
        return
    layout = f"--tp {tp}" + (f" --pp {pp}" if pp > 1 else "") if tp > 1 else f"--pp {pp}"
    if world == 1 and not launched_by_torchrun():
        raise PaiZooError(f"{layout} needs {need} processes and this is one (not under torchrun); run: "
                          f"{torchrun_command(need)}")
    nodes = node_count()
    if nodes > 1:  # several machines: the total is nodes x processes per node
        raise PaiZooError(f"{layout} needs a multiple of {need} processes (tp x pp = {need}), not {world} ({nodes} "
                          f"nodes x {local_world_size()}); give torchrun --nnodes and --nproc-per-node (srun --nodes "
                          f"and --ntasks-per-node) whose product is a multiple of {need}")
    raise PaiZooError(f"{layout} needs a multiple of {need} processes (tp x pp = {need}), not {world}; "
                      f"run torchrun with --nproc-per-node {need} (or a multiple of {need})")
