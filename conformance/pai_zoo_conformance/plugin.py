"""pytest plugin (entry point ``pytest11``): ``--pai-zoo-family NAME`` runs the suite on
installed families, as ``pai-zoo conformance NAME`` does."""
from __future__ import annotations


def pytest_addoption(parser):
    parser.addoption(
        "--pai-zoo-family", action="append", default=[], metavar="NAME",
        help="run the pai-zoo conformance suite on this installed family (repeatable)",
    )


def pytest_generate_tests(metafunc):
    names = metafunc.config.getoption("--pai-zoo-family", default=[])
    cls = metafunc.cls
    if names and cls is not None and getattr(cls, "family", "") is None and "family_name" in metafunc.fixturenames:
        metafunc.parametrize("family_name", names, scope="class")
