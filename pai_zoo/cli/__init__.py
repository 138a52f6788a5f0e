"""The ``pai-zoo`` command line: one module per command, each with ``add_parser(subparsers)`` and its
run function (``pai-zoo list`` imports neither torch nor megatron-core).

    pai-zoo list                 plugins, versions, families, broken plugins
    pai-zoo info NAME            a family (or preset): names, presets, config translation, weight table
    pai-zoo conformance NAME     run the conformance suite on an installed family
    pai-zoo convert SRC DST --to mcore|hf   Hugging Face folder <-> Megatron-Core checkpoint
    pai-zoo preprocess --input PATH... --output-prefix PREFIX --tokenizer T   text -> .bin/.idx
    pai-zoo dataset inspect PREFIX | dataset merge --output-prefix OUT PREFIX...
    pai-zoo generate --model M --prompts IN.jsonl --output OUT.jsonl | --prompt TEXT   text generation
    pai-zoo eval CKPT --data PREFIX... | --tasks NAMES   held-out loss and perplexity, lm-evaluation-harness
    pai-zoo train [CONFIG.yaml] --model M --data PREFIX --save DIR [flags]   (torchrun for several processes)
    pai-zoo rl list | rl reward --model M --data PAIRS.jsonl --save RM | rl ppo --actor M --reward RM ...   RL
    pai-zoo plugin new NAME --from-config CONFIG [--like FAMILY]   a plugin distribution from an HF config

A user error (a :class:`~pai_zoo.errors.PaiZooError`, or a file the system cannot open) is printed as
one ``pai-zoo: error: ...`` line, plus ``hint: ...`` where the error carries one; ``--debug`` shows
the traceback instead.
"""
from __future__ import annotations

import argparse
import contextlib
import importlib
import os
import sys
import traceback
import warnings

from ..plugin.errors import PaiZooError, PaiZooWarning
from ..util.launch import apply_slurm_env
from ..util.outputs import TMP_MARK, disk_error, public_name
from ..util.quiet import quiet_run
from ._checks import guard
from ._common import HelpFormatter

#: the command modules, in the order ``pai-zoo --help`` lists them
COMMANDS = ("list", "info", "conformance", "inspect", "convert", "preprocess", "dataset", "generate", "eval", "train",
            "rl", "plugin")

#: exit codes (also in ``pai-zoo --help`` and README's CLI section)
OK, USER_ERROR, USAGE, VERIFY_FAILED, INTERRUPTED, BROKEN_PIPE = 0, 1, 2, 3, 130, 141

#: the arguments of the running command (for messages that repeat them, e.g. the torchrun command to use)
ARGV: list[str] | None = None

EPILOG = f"""exit codes:
  {OK}    success
  {USER_ERROR}    user error: a missing file or folder, an unknown name, malformed input (one line: pai-zoo: error: ...)
  {USAGE}    usage error: unknown command or flag, missing or invalid argument (argparse)
  {VERIFY_FAILED}    failed verification: convert --verify found different logits, conformance checks failed
  {INTERRUPTED}  interrupted (Ctrl-C, SIGINT; train and rl save the step in progress first and say how to resume)
  138  SIGUSR1 (SLURM's pre-emption signal; train and rl save as for Ctrl-C)
  {BROKEN_PIPE}  the reader of the output went away (pai-zoo list | head -1)
  143  terminated (SIGTERM; train and rl save as for Ctrl-C)
--debug shows the traceback of an error."""


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="pai-zoo", description="A plugin-based model zoo for Megatron-Core.",
                                     epilog=EPILOG, formatter_class=HelpFormatter)
    parser.add_argument("--debug", action="store_true", help="show the traceback of an error")
    parser.add_argument("--verbose", action="store_true",
                        help="show third-party warnings (FutureWarnings, ...) and progress bars (transformers')")
    sub = parser.add_subparsers(dest="command", required=True)
    for name in COMMANDS:
        importlib.import_module(f"{__name__}.{name}").add_parser(sub)
    guard(parser)  # out-of-range flag values: one line naming the flag, as argparse reads it (_checks.RULES)
    return parser


def parse(parser: argparse.ArgumentParser, argv: list[str]) -> argparse.Namespace:
    """``parser.parse_args(argv)``, except that arguments no parser knows are reported with the usage of
    the (sub)command they were given to (argparse reports them with the top-level usage)."""
    args, extra = parser.parse_known_args(argv)
    if extra:
        command_parser(parser, args).error(f"unrecognized arguments: {' '.join(extra)}")
    return args


def command_parser(parser: argparse.ArgumentParser, args: argparse.Namespace) -> argparse.ArgumentParser:
    """The innermost subcommand's parser that ``args`` went through (``pai-zoo rl ppo`` -> ``ppo``'s)."""
    while True:
        subs = [a for a in parser._actions if isinstance(a, argparse._SubParsersAction)]
        chosen = getattr(args, subs[0].dest, None) if subs else None
        if chosen not in (subs[0].choices if subs else {}):
            return parser
        parser = subs[0].choices[chosen]


def _show_warning(message, category, filename, lineno, file=None, line=None, _default=warnings.showwarning):
    """pai-zoo's own warnings as one ``pai-zoo: warning:`` line; others as Python shows them."""
    if issubclass(category, PaiZooWarning):
        print(f"pai-zoo: warning: {message}", file=sys.stderr if file is None else file)
    else:
        _default(message, category, filename, lineno, file, line)


#: the namespace attributes that hold a command's output, in the order they are looked for (a full disk names it)
OUTPUTS = ("dst", "save", "output", "output_prefix")


def destination(args) -> str | None:
    """The output a command writes (its ``--save``, ``--output`` ... as given), or None."""
    return next((getattr(args, name) for name in OUTPUTS if getattr(args, name, None)), None)


def describe(exc: BaseException, path=None) -> tuple[str, str | None]:
    """The ``error:`` line and the hint (or None) for a user error; ``path`` is the command's output, named by a
    full-disk line whose error carries no file name."""
    disk = disk_error(exc, path) if not isinstance(exc, PaiZooError) else None
    if disk is not None:  # a full disk, a quota, a read-only mount: one line naming the mount point and the path
        return str(disk), None
    if isinstance(exc, PaiZooError):
        return str(exc), exc.hint
    name = getattr(exc, "filename", None)
    if isinstance(name, str) and TMP_MARK in name:
        name = str(public_name(name))  # the destination, not the temporary name the user never sees
    what = {FileNotFoundError: "no such file or folder", NotADirectoryError: "not a folder",
            IsADirectoryError: "a folder, not a file", PermissionError: "permission denied"}.get(type(exc))
    if name is not None:
        return f"{what or exc.strerror or exc}: {name}", None
    return str(exc), None


def main(argv: list[str] | None = None) -> int:
    """Run ``pai-zoo ARGV``; returns the exit code (argparse exits 2 itself on a usage error)."""
    argv = sys.argv[1:] if argv is None else [str(a) for a in argv]
    global ARGV
    ARGV = argv
    debug = "--debug" in argv[:next((i for i, a in enumerate(argv) if a in COMMANDS), len(argv))]
    warnings.showwarning = _show_warning
    args = None
    try:
        args = parse(build_parser(), argv)
        apply_slurm_env()  # started by srun without torchrun: SLURM's variables as torchrun's (pai_zoo.util.launch)
        with quiet_run(verbose=args.verbose):  # third-party warnings and progress bars only with --verbose
            try:
                return args.func(args)
            finally:
                ARGV = None  # this run's arguments only (main may be called again in one process)
    except KeyboardInterrupt as exc:  # also util.interrupt.Interrupted: its line (empty off rank 0) and 128 + signal
        if debug:
            raise
        message = getattr(exc, "message", "interrupted")
        if message:
            print(f"pai-zoo: {message}", file=sys.stderr)
        return getattr(exc, "exit_code", INTERRUPTED)
    except BrokenPipeError:  # the reader went away (pai-zoo list | head -1): stop quietly, as SIGPIPE would
        with contextlib.suppress(OSError):
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return BROKEN_PIPE
    except BaseException as exc:  # a user error, or a full disk a library wrapped (disk_error); else re-raised
        if isinstance(exc, (SystemExit, GeneratorExit)) or not (
                isinstance(exc, (PaiZooError, OSError)) or disk_error(exc) is not None):
            raise
        if debug:
            traceback.print_exc()
        message, hint = describe(exc, destination(args))
        print(f"pai-zoo: error: {message}", file=sys.stderr)
        if hint:
            print(f"hint: {hint}", file=sys.stderr)
        return USER_ERROR
