"""pytest plugin (entry point ``pytest11``): ``--pai-zoo-family NAME`` runs the suite on
installed families, as ``pai-zoo conformance NAME`` does.

Every run of a :class:`~pai_zoo_conformance.ConformanceSuite` test is recorded: at the end of the
session each family's outcomes (check -> passed / failed / skipped) go to
``$PAI_ZOO_CACHE/conformance/FAMILY.json`` (:mod:`pai_zoo.testing.conformance_record`), which
``pai-zoo info FAMILY`` shows.

The session-scoped fixture ``pai_zoo_workers`` is the session's :class:`~pai_zoo_conformance.workers.WorkerGroup`
of 2 gloo ranks, started once and shared by every multi-process check (the suite's own and a plugin's tests);
``pai_zoo_cli_server`` forks ``pai-zoo`` commands for shell scripts from one Python that imported everything once.

The marker ``no_megatron`` and the options ``--pai-zoo-megatron-free`` / ``--pai-zoo-megatron-only`` run a test
that never imports megatron-core once rather than once per megatron-core version (:mod:`.megatron_free`).
"""
from __future__ import annotations

import pytest

from . import megatron_free

_RESULTS = pytest.StashKey[dict]()
_DELTAS = pytest.StashKey[dict]()


def pytest_addoption(parser):
    parser.addoption(
        "--pai-zoo-family", action="append", default=[], metavar="NAME",
        help="run the pai-zoo conformance suite on this installed family (repeatable)",
    )
    megatron_free.addoption(parser)


def pytest_configure(config):
    megatron_free.configure(config)


def pytest_ignore_collect(collection_path, config):
    return megatron_free.ignore_collect(collection_path, config)


def pytest_collection_modifyitems(config, items):
    from .suite import mark_once

    mark_once(items)  # a `once = True` suite's checks but the forward ones: megatron_once, before the selection
    megatron_free.modify_items(config, items)


def pytest_runtest_protocol(item, nextitem):
    megatron_free.runtest_protocol(item)


@pytest.fixture(scope="session")
def pai_zoo_workers():
    """The process's 2 worker ranks (:func:`pai_zoo_conformance.workers.shared_workers`), stopped when it exits
    (not at the session's end: ``pai-zoo conformance`` runs a session inside a test, which the ranks outlive)."""
    from .workers import shared_workers

    return shared_workers()


@pytest.fixture(scope="session")
def pai_zoo_cli_server():
    """The session's :class:`~pai_zoo_conformance.cli_server.CliServer` (one thread per torch op, as the suite
    runs): a shell script with ``server.bin`` first on ``PATH`` runs ``pai-zoo`` without a Python start each."""
    import os

    from .cli_server import CliServer

    with CliServer(env={**os.environ, "OMP_NUM_THREADS": "1"}) as server:
        yield server


def pytest_generate_tests(metafunc):
    names = metafunc.config.getoption("--pai-zoo-family", default=[])
    cls = metafunc.cls
    if names and cls is not None and getattr(cls, "family", "") is None and "family_name" in metafunc.fixturenames:
        metafunc.parametrize("family_name", names, scope="class")


def _suite_family(item) -> str | None:
    """The family name a ConformanceSuite test item runs on, else None."""
    from .suite import ConformanceSuite

    cls = getattr(item, "cls", None)
    if cls is None or not issubclass(cls, ConformanceSuite):
        return None
    callspec = getattr(item, "callspec", None)
    if callspec is not None and "family_name" in callspec.params:
        return callspec.params["family_name"]
    return cls.family


@pytest.hookimpl(wrapper=True)
def pytest_runtest_makereport(item, call):
    report = yield
    family = _suite_family(item)
    if family is not None:
        check = item.originalname or item.name
        outcomes = item.config.stash.setdefault(_RESULTS, {}).setdefault(family, {})
        previous = outcomes.get(check)
        if report.failed:
            outcomes[check] = "failed"
        elif report.skipped and previous is None:
            outcomes[check] = "skipped"
        elif report.passed and report.when == "call" and previous is None:
            outcomes[check] = "passed"
        if report.passed and report.when == "call":
            from .suite import DELTAS

            deltas = {str(k): float(v) for key, value in report.user_properties if key == DELTAS
                      for k, v in value.items()}
            if deltas:  # the max |delta| per label of this run (a parametrized check keeps the largest)
                recorded = item.config.stash.setdefault(_DELTAS, {}).setdefault(family, {}).setdefault(check, {})
                for label, delta in deltas.items():
                    recorded[label] = max(delta, recorded.get(label, delta))
    return report


def pytest_sessionfinish(session):
    megatron_free.session_finish(session)
    results = session.config.stash.get(_RESULTS, {})
    if not results:
        return
    from importlib.metadata import version

    from pai_zoo.families.family import installed_mcore_version
    from pai_zoo.families.registry import get_registry
    from pai_zoo.plugin.errors import PaiZooError
    from pai_zoo.testing import conformance_record

    registry = get_registry()
    reporter = session.config.pluginmanager.get_plugin("terminalreporter")
    say = reporter.write_line if reporter is not None else (lambda line: None)
    for name, outcomes in results.items():
        name_given = name
        versions = {"pai_zoo_version": version("pai-zoo"), "mcore_version": installed_mcore_version()}
        try:
            family = registry.family(name)
            name = family.name
            plugin = registry.plugins.get(family.plugin)
            versions["plugin_version"] = plugin.version if plugin else None
        except PaiZooError:  # an unknown name: its failures are recorded under the name given
            pass
        try:
            path = conformance_record.record(name, outcomes, versions,
                                             session.config.stash.get(_DELTAS, {}).get(name_given, {}))
        except OSError as exc:
            say(f"pai-zoo: could not record the conformance results of {name!r}: {exc}")
            continue
        say(f"pai-zoo: conformance results of {name!r} recorded in {path}")
