"""What the command modules share: the help formatter, defaults read from settings, the registry."""
from __future__ import annotations

import argparse
import dataclasses
import inspect

from ..families import registry as _registry
from ..util.hub import hub_paths, local_path


class HelpFormatter(argparse.ArgumentDefaultsHelpFormatter, argparse.RawDescriptionHelpFormatter):
    """Shows ``(default: X)`` after a flag's help, except for switches and flags without a default."""

    def _get_help_string(self, action):
        # identity, not ==: a default of 0 or 1.0 equals False or True and is still shown
        hidden = any(action.default is v for v in (None, False, True, argparse.SUPPRESS))
        if hidden or "%(default)" in (action.help or ""):
            return action.help
        return super()._get_help_string(action)


def add_command(subparsers, name: str, help: str, **kwargs) -> argparse.ArgumentParser:
    """A subcommand parser with pai-zoo's help formatter (``description`` defaults to ``help``)."""
    kwargs.setdefault("description", help)
    return subparsers.add_parser(name, help=help, formatter_class=HelpFormatter, **kwargs)


def defaults(settings) -> dict:
    """The defaults of a settings dataclass's fields, or of a function's keyword parameters."""
    if dataclasses.is_dataclass(settings):
        return {f.name: f.default for f in dataclasses.fields(settings) if f.default is not dataclasses.MISSING}
    return {name: p.default for name, p in inspect.signature(settings).parameters.items()
            if p.default is not inspect.Parameter.empty}


def registry():
    return _registry.get_registry()  # looked up at call time: tests swap it


def family_or_preset(name: str):
    """The family a family name, alias or preset names (:class:`~pai_zoo.errors.UnknownModelError` if none)."""
    reg = registry()
    if reg.is_preset(name):
        return reg.preset(name)[0]
    return reg.family(name)


def add_revision(parser: argparse.ArgumentParser, what: str = "the model") -> None:
    """``--revision``: the branch, tag or commit of a Hugging Face Hub id given as ``what`` (docs/hub.md)."""
    parser.add_argument("--revision", help=f"when {what} is a Hugging Face Hub id (org/name): the branch, tag or "
                                           "commit to read (default: the default branch; docs/hub.md)")


def hub_args(args, *models: str) -> None:
    """The Hub ids among ``args``' attributes ``models`` (at ``--revision``), ``tokenizer`` and ``adapter``
    (default branch) replaced by their snapshot folders in the Hugging Face cache, downloaded when missing
    (:mod:`pai_zoo.util.hub`); the command then reads folders, as if it had been given them."""
    values = hub_paths(getattr(args, "revision", None), *(getattr(args, m) for m in models),
                       tokenizer=getattr(args, "tokenizer", None), flag="--revision ")
    for name, value in zip((*models, "tokenizer"), values):
        if hasattr(args, name) and value is not None:
            setattr(args, name, str(value))
    if getattr(args, "adapter", None) is not None:
        args.adapter = str(local_path(args.adapter))
