"""Reward functions by name, filled through the ``pai_zoo_reward_funcs`` hook, and scoring a batch of completions
with them.

A reward function follows TRL's contract (:func:`pai_zoo.hookspecs.pai_zoo_reward_funcs`):
``function(prompts, completions, **fields) -> list[float]``. What a function does wrong stops the run with one
line naming the function and, where one is to blame, the sample: it raises, returns something not a list of one
number per completion, or returns NaN (or None) for a sample.
"""
from __future__ import annotations

import math
from collections.abc import Callable, Sequence

from ..families.registry import Registry, get_registry
from ..plugin.errors import PaiZooError, PluginError, SettingError

RewardFunction = Callable[..., Sequence[float]]


class RewardFunctionError(PaiZooError):
    """A reward function failed on a batch (raised, returned NaN, or the wrong number of rewards)."""


def list_reward_funcs(registry: Registry | None = None) -> dict[str, RewardFunction]:
    """Every registered reward function, ``{name: function}``, from the plugins' ``pai_zoo_reward_funcs`` hooks."""
    functions: dict[str, RewardFunction] = {}
    owner: dict[str, str] = {}
    for impl in (registry or get_registry()).pm.hook.pai_zoo_reward_funcs.get_hookimpls():
        for name, fn in (impl.function() or {}).items():
            if name in functions:
                raise PluginError(f"reward function {name!r} is registered by both {owner[name]!r} and "
                                  f"{impl.plugin_name!r}")
            functions[name], owner[name] = fn, impl.plugin_name
    return functions


def get_reward_funcs(spec: str | Sequence[str], flag: str = "--reward-funcs") -> dict[str, RewardFunction]:
    """The functions ``spec`` names (``"a,b"`` or a list), in order; an unknown name fails naming the known ones."""
    names = [n.strip() for n in (spec.split(",") if isinstance(spec, str) else spec) if n and n.strip()]
    if not names:
        raise SettingError(f"{flag} names no reward function")
    known = list_reward_funcs()
    unknown = [n for n in names if n not in known]
    if unknown:
        raise SettingError(f"{flag}: unknown reward function {', '.join(map(repr, unknown))}; registered: "
                           f"{', '.join(sorted(known)) or 'none'} (a plugin adds one through pai_zoo_reward_funcs)")
    if len(set(names)) < len(names):
        raise SettingError(f"{flag} names a reward function twice: {','.join(names)}")
    return {n: known[n] for n in names}


def score(functions: dict[str, RewardFunction], prompts: list, completions: list, fields: dict[str, list],
          where: Sequence[str]) -> list[list[float]]:
    """``rewards[function][sample]`` of each function on the batch; ``where[i]`` names sample ``i`` in errors."""
    out = []
    for name, fn in functions.items():
        try:
            values = fn(prompts, completions, **fields)
        except Exception as exc:  # a plugin's function: any failure is reported, one line
            sample = _failing_sample(fn, prompts, completions, fields)
            at = f" on {where[sample]}" if sample is not None else ""
            raise RewardFunctionError(f"reward function {name!r} raised {type(exc).__name__}{at}: "
                                      f"{str(exc).splitlines()[0] if str(exc) else ''}".rstrip(": ")) from None
        values = list(values) if isinstance(values, (list, tuple)) or hasattr(values, "tolist") else values
        if not isinstance(values, list) or len(values) != len(completions):
            got = f"{len(values)} values" if isinstance(values, list) else type(values).__name__
            raise RewardFunctionError(f"reward function {name!r} returned {got} for {len(completions)} completions; "
                                      "it must return one number per completion")
        row = []
        for i, value in enumerate(values):
            try:
                number = float(value)
            except (TypeError, ValueError):
                number = math.nan
            if not math.isfinite(number):
                raise RewardFunctionError(f"reward function {name!r} returned {value!r} for {where[i]}; a reward "
                                          "must be a finite number")
            row.append(number)
        out.append(row)
    return out


def _failing_sample(fn, prompts, completions, fields) -> int | None:
    """The first sample on which ``fn`` raises alone (None when each passes alone)."""
    for i in range(len(completions)):
        try:
            fn(prompts[i:i + 1], completions[i:i + 1], **{k: v[i:i + 1] for k, v in fields.items()})
        except Exception:
            return i
    return None


__all__ = ["RewardFunction", "RewardFunctionError", "get_reward_funcs", "list_reward_funcs", "score"]
