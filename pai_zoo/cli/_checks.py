"""Flag values checked as argparse reads them, before any command imports torch, megatron-core or transformers or
loads a model or tokenizer.

:data:`RULES` is the one table: a flag's destination name (``seed``, ``top_p``, ``max_shard_size``...) -> the
:class:`Rule` its value must pass, the same for every command that has the flag (a plugin's RL trainer's flags
included). :func:`guard` gives the rule to each such flag of a parser and its subcommands (``build_parser`` calls it
once); a value that fails is one ``pai-zoo: error:`` line naming the flag as the user spelled it
(``--temperature -1: must be 0 or more (0 = greedy)``), exit 1. A malformed number (``--top-k abc``) stays
argparse's usage error (exit 2). ``pai-zoo train`` checks its settings in :class:`~pai_zoo.training.config.TrainConfig`
(flags and YAML keys alike, named as given); :func:`check_model_name` refuses a model that is neither a name nor an
existing path before anything loads.
"""
from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

from ..formats.hf_folder import parse_size
from ..models.verification import parse_tolerance
from ..plugin.errors import SettingError, UnknownModelError, no_such_path


@dataclass(frozen=True)
class Rule:
    """``test(value)`` is true for a value the flag accepts (or raises its own :class:`SettingError`); ``text`` says
    what it accepts."""

    test: Callable[[Any], bool]
    text: str


def _number(value) -> bool:
    return isinstance(value, (int, float)) and not isinstance(value, bool) and not math.isnan(value)


def _iteration(value) -> bool:
    return str(value) == "release" or str(value).isdigit()


def _size(value) -> bool:
    try:
        return parse_size(str(value)) > 0
    except (TypeError, ValueError, OverflowError):
        return False


def _tolerance(value) -> bool:
    parse_tolerance(value)  # its own line: --verify-tolerance 'x': give ATOL or ATOL,RTOL ...
    return True


POSITIVE = Rule(lambda v: _number(v) and v > 0, "must be positive")
AT_LEAST_ONE = Rule(lambda v: _number(v) and v >= 1, "must be 1 or more")
NON_NEGATIVE = Rule(lambda v: _number(v) and v >= 0, "must be 0 or more")
PROBABILITY = Rule(lambda v: _number(v) and 0 < v <= 1, "must be above 0 and at most 1")
FRACTION = Rule(lambda v: _number(v) and 0 <= v < 1, "must be at least 0 and below 1")
SEED = Rule(lambda v: _number(v) and 0 <= v < 2**32, "must be a seed from 0 to 2**32 - 1")
ITERATION = Rule(_iteration, "expected a saved iteration: a number (0 or more) or 'release'")
SIZE = Rule(_size, "expected a positive size such as 5GB, 500MB or a number of bytes")
TOLERANCE = Rule(_tolerance, "expected ATOL or ATOL,RTOL, numbers >= 0 (e.g. 1e-4 or 2e-5,1e-5)")

#: flag destination -> its rule, for every command that has the flag (flags not here take any value of their type;
#: tests/test_cli_flags.py keeps every number flag of every command in this table or in :data:`FREE`)
RULES: dict[str, Rule] = {
    # sizes and counts
    **dict.fromkeys(("tp", "pp", "ep", "etp", "tensor_parallel_size", "pipeline_parallel_size", "gpus", "threads",
                     "workers", "nodes", "gpus_per_node"), AT_LEAST_ONE),
    **dict.fromkeys(("batch_size", "micro_batch_size", "mini_batch_size", "rollout_batch_size", "seq_length",
                     "pad_length", "max_new_tokens", "max_completion_length", "max_tokens", "max_length",
                     "samples_per_shard", "epochs", "steps", "ppo_epochs", "num_iterations", "num_generations",
                     "log_every", "kl_horizon", "lora_rank", "tensorboard_log_interval"), AT_LEAST_ONE),
    **dict.fromkeys(("document", "num_fewshot", "top_k", "save_every", "max_steps", "eval_every"), NON_NEGATIVE),
    # rates, sampling and coefficients
    **dict.fromkeys(("lr", "actor_lr", "critic_lr", "limit", "gpu_memory", "lora_alpha"), POSITIVE),
    **dict.fromkeys(("temperature", "weight_decay", "max_grad_norm", "beta", "kl_coef", "clip_range", "epsilon",
                     "epsilon_high", "label_smoothing"), NON_NEGATIVE),
    "top_p": PROBABILITY,
    **dict.fromkeys(("eval_fraction", "lora_dropout"), FRACTION),
    **dict.fromkeys(("gamma", "lam"), Rule(lambda v: _number(v) and 0 <= v <= 1, "must be from 0 to 1")),
    "seed": SEED,
    # values with a form
    "iteration": ITERATION,
    "max_shard_size": SIZE,
    "verify_tolerance": TOLERANCE,
}

#: number flags that take any value, and why
FREE = {
    "value_clip": "negative turns value clipping off (rl ppo)",
    "kl_target": "None or a target KL; the adaptive controller checks it",
}

#: the extra line argparse's help shows for a temperature (what 0 means)
_NOTES = {"temperature": " (0 = greedy)"}


def shown(value) -> str:
    """A value as it reads in a message: ``-1``, ``0.5``, ``'abc'``."""
    if isinstance(value, float):
        return f"{value:g}"
    return str(value)


def check_value(rule: Rule, value, flag: str, dest: str = "") -> None:
    """Raise :class:`SettingError` naming ``flag`` (as given) unless ``value`` passes ``rule``."""
    if value is not None and not rule.test(value):
        raise SettingError(f"{flag} {shown(value)}: {rule.text}{_NOTES.get(dest, '')}")


class Checked(argparse._StoreAction):
    """``store``, after checking the value against :attr:`rule` (named by the option string the user typed)."""

    rule: Rule

    def __call__(self, parser, namespace, values, option_string=None):
        check_value(self.rule, values, option_string or self.dest, self.dest)
        setattr(namespace, self.dest, values)


def guard(parser: argparse.ArgumentParser, rules: dict[str, Rule] | None = None) -> None:
    """Give every ``store`` flag of ``parser`` and of its subcommands, at any depth, whose destination is in
    ``rules`` (default :data:`RULES`) its rule."""
    rules = RULES if rules is None else rules
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for sub in dict.fromkeys(action.choices.values()):  # aliases share a parser
                guard(sub, rules)
        elif type(action) is argparse._StoreAction and action.option_strings and action.dest in rules \
                and action.nargs in (None, "?"):
            action.__class__ = Checked
            action.rule = rules[action.dest]


def check_model_name(name: str, registry) -> None:
    """``name`` is a preset, a family or an existing path: else the registry's one line (no such file or folder /
    unknown model), before anything is imported or loaded for it."""
    if registry.is_preset(name) or registry.is_family(name) or Path(name).exists():
        return
    raise UnknownModelError(registry._unknown(name))


def check_inputs(*given: tuple[str | None, str]) -> None:
    """Each ``(path, what)`` whose path was given exists: else the one no-such-path line naming ``what`` (the flag)."""
    for path, what in given:
        if path is not None and not Path(path).exists():
            raise no_such_path(path, what)


#: an RL trainer's flags (by destination) that name a model: a preset, a family or an existing folder
#: (``rule:...`` is a rule reward, not a model)
MODEL_DESTS = ("model", "actor", "critic", "ref_model", "reward")
#: an RL trainer's flags that name an input file, checked when the value is a JSON Lines or JSON file name
INPUT_DESTS = ("data", "prompts")
JSON_SUFFIXES = (".jsonl", ".json", ".jsonl.gz", ".jsonl.zst")


def check_trainer_inputs(settings: dict, flags: dict[str, str], registry) -> None:
    """The models and input files an RL trainer's settings name exist (:data:`MODEL_DESTS`, :data:`INPUT_DESTS`),
    before the trainer imports torch; ``flags``: destination -> the flag to name."""
    for dest in MODEL_DESTS:
        value = settings.get(dest)
        if isinstance(value, str) and value and not value.startswith("rule:"):
            try:
                check_model_name(value, registry)
            except UnknownModelError as exc:
                raise SettingError(f"{flags.get(dest, dest)} {value}: {exc}") from None
    check_inputs(*((settings[dest], flags.get(dest, dest)) for dest in INPUT_DESTS
                   if isinstance(settings.get(dest), str) and settings[dest].endswith(JSON_SUFFIXES)))
