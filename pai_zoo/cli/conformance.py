"""``pai-zoo conformance NAME``: run the shared conformance suite on an installed family."""
from __future__ import annotations

import argparse

from ._common import add_command, family_or_preset


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "conformance", "run the conformance suite on an installed family")
    p.add_argument("name", help="family, alias or preset")
    p.add_argument("pytest_args", nargs=argparse.REMAINDER, help="extra pytest arguments")
    p.set_defaults(func=run)


def run(args) -> int:
    family = family_or_preset(args.name)
    import pytest

    # the suite is found by name (pytest --pyargs): the conformance suite sits above the CLI, which it runs, so the
    # CLI does not import it (tests/test_layers.py)
    argv = ["--pyargs", SUITE, "--pai-zoo-family", family.name, "-p", "no:cacheprovider", "-q", *args.pytest_args]
    return PYTEST_EXIT.get(int(pytest.main(argv)), 1)


#: The conformance suite's module that runs every check on an installed family.
SUITE = "pai_zoo_conformance.installed"
#: pytest's exit code -> pai-zoo's: failed checks are a failed verification (3), bad pytest flags usage (2).
PYTEST_EXIT = {0: 0, 1: 3, 2: 130, 4: 2}
