"""The ``pai-zoo`` command line: ``list``, ``list --json``, ``info`` and error exits.

Most tests call :func:`pai_zoo.cli.main` in-process against the real installed plugins
(the editable ``pai-zoo-llama``); a few run the installed console script in a subprocess.
"""
from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import pai_zoo_llama
from pai_zoo import Family, hookimpl
from pai_zoo.cli import main
from pai_zoo.families.registry import PLUGINS_ENV, Registry, get_registry, reset_registry
from pai_zoo_conformance.cli_runs import run_cli
from pai_zoo_llama import CONFIG, weights

# every test sees the registry of the really installed plugins, built afresh (tests/conftest.py)
pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]


def _env(pythonpath: Path | None = None) -> dict:
    env = dict(os.environ)
    env.pop(PLUGINS_ENV, None)
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), os.environ.get("PYTHONPATH")) if p)
    return env


@pytest.fixture
def run_script(pai_zoo_script):
    """``run_script(*args, pythonpath=None)``: the installed console script, run in a subprocess."""

    def run(*args: str, pythonpath: Path | None = None) -> subprocess.CompletedProcess:
        return subprocess.run([pai_zoo_script, *args], env=_env(pythonpath), capture_output=True, text=True,
                              timeout=600)

    return run


def _plugin(name: str, families) -> types.ModuleType:
    mod = types.ModuleType(name)
    mod.pai_zoo_families = hookimpl(lambda: families)
    return mod


# -- list -------------------------------------------------------------------------------------
def test_list(capsys):
    assert main(["list"]) == 0
    out, err = capsys.readouterr()
    lines = out.splitlines()
    assert lines[0].split() == ["PLUGIN", "DISTRIBUTION", "VERSION", "FAMILIES"]
    llama = next(line for line in lines if line.startswith("llama "))
    assert llama.split()[:4] == ["llama", "pai-zoo-llama", "0.1.0", "llama"]
    assert "(llama1, llama2, llama3, llama3.1, llama3.2, mistral)" in llama
    assert "BROKEN" not in out and err == ""


def test_list_json(capsys):
    assert main(["list", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert isinstance(data, list)
    llama = next(p for p in data if p["name"] == "llama")
    assert llama == {"name": "llama", "distribution": "pai-zoo-llama", "version": "0.1.0",
                     "families": ["llama", "mixtral", "llama4", "ministral3"], "error": None, "traceback": None}


def test_list_without_plugins(capsys, monkeypatch):
    monkeypatch.setenv(PLUGINS_ENV, "not-installed")
    assert main(["list"]) == 0
    assert "no pai-zoo plugins installed" in capsys.readouterr().out


def test_list_with_conflicting_plugins_exits_nonzero(capsys):
    def conflicting():
        a = _plugin("a", [Family(name="clash", presets={"a-tiny": {"model_type": "llama"}}, tiny="a-tiny",
                                 config_map=CONFIG, weight_map=weights)])
        b = _plugin("b", [Family(name="b", aliases=("CLASH",), presets={"b-tiny": {"model_type": "llama"}},
                                 tiny="b-tiny", config_map=CONFIG, weight_map=weights)])
        return Registry(plugins=[("plug-a", a), ("plug-b", b)], use_entry_points=False)

    import pai_zoo.registry

    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(pai_zoo.registry, "get_registry", conflicting)
        assert main(["list"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and err.startswith("pai-zoo: error:") and "'plug-a'" in err and "'plug-b'" in err


# -- info -------------------------------------------------------------------------------------
def test_info_family(capsys):
    assert main(["info", "llama"]) == 0
    out = capsys.readouterr().out
    assert "family:        llama - Llama 1/2/3.x and Mistral" in out
    assert "plugin:        llama (pai-zoo-llama 0.1.0)" in out
    assert "tiny preset:   llama3-tiny" in out
    assert "architectures: LlamaForCausalLM, MistralForCausalLM" in out
    for preset in pai_zoo_llama.LLAMA.presets:
        assert f"\n  {preset} " in out
    assert "num_key_value_heads -> num_query_groups" in out
    assert "weight map (rows for llama3-tiny" in out
    assert "-> decoder.layers.{layer}.self_attention.linear_qkv.weight" in out
    assert "model.layers.{layer}.self_attn.q_proj.weight, model.layers.{layer}.self_attn.k_proj.weight" in out
    assert "-> decoder.layers.{layer}.mlp.linear_fc1.weight" in out
    assert out.count("\n          -> ") == 9  # one per row of llama3-tiny's table (no biases)


def test_info_preset_and_alias_show_their_family(capsys):
    def without_tokenizer(out: str) -> list[str]:  # the tokenizer line tells what the given name gets
        return [line for line in out.splitlines() if not line.startswith("tokenizer:")]

    assert main(["info", "llama"]) == 0
    family_out = capsys.readouterr().out
    assert sum(line.startswith("tokenizer:") for line in family_out.splitlines()) == 1
    for name in ("llama3-tiny", "MISTRAL-TINY", "Llama3.1"):
        assert main(["info", name]) == 0
        assert without_tokenizer(capsys.readouterr().out) == without_tokenizer(family_out), name


def test_info_of_a_plugin_family(capsys):
    toy = Family(name="toyfam", presets={"toyfam-tiny": dict(pai_zoo_llama.PRESETS["llama3-tiny"])},
                 tiny="toyfam-tiny", config_map=CONFIG, weight_map=weights, model_types=("toyfam",))
    reset_registry(Registry(plugins=[("toyplug", _plugin("toyplug", [toy]))], use_entry_points=False))
    assert main(["info", "TOYFAM"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("family:        toyfam\n")
    assert "plugin:        toyplug" in out and "aliases:       -" in out
    assert "toyfam-tiny" in out and "linear_qkv" in out
    assert main(["info", "llama"]) == 1  # a user error: the installed registry has only the toy plugin
    assert "unknown model 'llama'" in capsys.readouterr().err


def test_info_unknown_name(capsys):
    assert main(["info", "nosuch"]) == 1
    out, err = capsys.readouterr()
    assert out == ""
    assert err.startswith("pai-zoo: error: unknown model 'nosuch'")
    installed = get_registry().families  # every installed plugin's families, not only llama's
    assert "llama" in installed and len(installed) >= 1
    assert f"a family ({', '.join(sorted(installed))})" in err
    assert all(preset in err for family in installed.values() for preset in family.presets)
    assert "llama3-tiny" in err


def test_conformance_unknown_name(capsys):
    assert main(["conformance", "nosuch"]) == 1
    out, err = capsys.readouterr()
    assert out == "" and "unknown model 'nosuch'" in err


def test_usage_errors(capsys):
    with pytest.raises(SystemExit) as exc:
        main([])
    assert exc.value.code == 2
    with pytest.raises(SystemExit) as exc:
        main(["info"])
    assert exc.value.code == 2
    assert "name" in capsys.readouterr().err
    with pytest.raises(SystemExit) as exc:
        main(["--help"])
    assert exc.value.code == 0
    out = capsys.readouterr().out
    assert "list" in out and "info" in out and "conformance" in out


# -- the installed console script ----------------------------------------------------------
def test_console_script_info_and_errors(run_script):
    proc = run_script("info", "llama3-tiny")
    assert proc.returncode == 0, proc.stderr
    assert "family:        llama" in proc.stdout and "self_attention.linear_qkv.weight" in proc.stdout
    proc = run_script("info", "nosuch")
    assert proc.returncode == 1  # a user error; 2 is argparse's usage error
    assert proc.stdout == "" and "pai-zoo: error: unknown model 'nosuch'" in proc.stderr
    assert "Traceback" not in proc.stderr
    proc = run_script("conformance", "nosuch")
    assert proc.returncode == 1 and "'nosuch'" in proc.stderr


def test_console_script_list_json_with_a_broken_plugin(tmp_path, run_script):
    info = tmp_path / "pai_zoo_broken-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: pai-zoo-broken\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[pai_zoo]\nbroken = broken_cli_plugin\n")
    (tmp_path / "broken_cli_plugin.py").write_text(textwrap.dedent("""
        from pai_zoo import hookimpl

        @hookimpl
        def pai_zoo_families():
            raise ValueError("bad preset table")
    """))
    proc = run_script("list", "--json", pythonpath=tmp_path)
    assert proc.returncode == 0, proc.stderr
    data = {p["name"]: p for p in json.loads(proc.stdout)}
    assert data["broken"] == {"name": "broken", "distribution": "pai-zoo-broken", "version": "1.0", "families": [],
                              "error": "ValueError: bad preset table", "traceback": None}
    assert data["llama"]["families"] == ["llama", "mixtral", "llama4", "ministral3"] and data["llama"]["error"] is None
    proc = run_script("list", pythonpath=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "BROKEN: ValueError: bad preset table" in proc.stdout


def test_python_dash_m_entry():
    proc = subprocess.run([sys.executable, "-m", "pai_zoo.cli", "list"], env=_env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert any(line.split()[:2] == ["llama", "pai-zoo-llama"] for line in proc.stdout.splitlines())


@pytest.mark.megatron
@pytest.mark.megatron_once(first=True)  # the command; the suite itself runs in both passes
def test_conformance_runs_the_suite_on_an_installed_family():
    """In this process (``pai-zoo conformance`` runs pytest in its own): the session's worker ranks serve its
    tensor-parallel check, and test_console_script_info_and_errors covers the console script."""
    proc = run_cli(["conformance", "mistral", "-p", "no:warnings"])
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    # The alias resolves to the llama family and every check of the suite runs and passes.
    from pai_zoo_conformance import ConformanceSuite

    checks = [name for name in dir(ConformanceSuite) if name.startswith("test_")]
    assert f"{len(checks)} passed" in proc.stdout and "failed" not in proc.stdout


# -- supported megatron-core versions and backends (issue 6) --------------------------------------
def _toy_family(**fields) -> Family:
    return Family(name="toyfam", presets={"toyfam-tiny": dict(pai_zoo_llama.PRESETS["llama3-tiny"])},
                  tiny="toyfam-tiny", config_map=CONFIG, weight_map=weights, model_types=("toyfam",), **fields)


def test_list_shows_each_familys_megatron_core_versions_and_backends(capsys):
    from importlib import metadata

    toy = _toy_family(mcore_versions=">=0.10,<0.16", backends=("local", "transformer_engine"))  # not the installed one
    reset_registry(Registry(plugins=[("toyplug", _plugin("toyplug", [toy]))], use_entry_points=True))
    assert main(["list"]) == 0
    out = capsys.readouterr().out
    installed = metadata.version("megatron-core")
    assert (f"\nmegatron-core {installed}; families by the megatron-core versions and layer-spec backends they "
            "support:\n") in out
    groups = [line for line in out.splitlines() if line.startswith("  >=")]
    # a family of megatron-core's own layers (llama) takes both layer specs (Family.backends' default)
    default = next(line for line in groups if line.startswith("  >=0.16.1  [local, transformer_engine]: "))
    assert "llama" in default.split(": ", 1)[1].split(", ")
    assert "  >=0.10,<0.16  [local, transformer_engine]: toyfam   NOT SUPPORTED by megatron-core " + installed in groups
    # The plugin table keeps one row per plugin: no other line starts with a plugin's name.
    assert [line.split()[0] for line in out.splitlines() if line.split()[:1] == ["toyplug"]] == ["toyplug"]


def test_family_rejects_a_bad_version_specifier_or_backend():
    from pai_zoo import PluginError

    with pytest.raises(PluginError, match=r"mcore_versions='0\.16 or newer' is not a PEP 440 version specifier"):
        _toy_family(mcore_versions="0.16 or newer")
    with pytest.raises(PluginError, match=r"backends \['te'\] must name some of \['local', 'transformer_engine'\]"):
        _toy_family(backends=("te",))


@pytest.mark.megatron
def test_building_under_an_unsupported_megatron_core_fails_clearly():
    from pai_zoo import PaiZooError
    from pai_zoo.mcore.build import build_gpt_model

    family = _toy_family(mcore_versions=">=0.10,<0.16")  # neither 0.16.1 nor 0.19.x, the versions make test runs
    family.check_mcore_version("0.15.3")  # supported: no error
    for version in ("0.16.1", "0.19.2"):
        expected = rf"supports megatron-core >=0.10,<0.16; megatron-core {version} is installed"
        with pytest.raises(PaiZooError, match=expected):
            family.check_mcore_version(version)
    from pai_zoo.hf import models as hf

    config = family.to_mcore_config(hf.config_dict(hf.hf_config(family, family.presets["toyfam-tiny"])))
    with pytest.raises(PaiZooError, match=r"family 'toyfam' \(plugin \?\) supports megatron-core >=0.10,<0.16"):
        build_gpt_model(family, config)


def test_list_with_versions_imports_no_torch_or_megatron():
    proc = subprocess.run([sys.executable, "-c", textwrap.dedent("""
        import sys
        from pai_zoo.cli import main
        assert main(["list"]) == 0
        heavy = sorted(m for m in sys.modules if m.split(".")[0] in ("torch", "megatron"))
        assert not heavy, heavy
        print("no heavy imports")
    """)], env=_env(), capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "layer-spec backends they support" in proc.stdout and proc.stdout.rstrip().endswith("no heavy imports")


# -- recorded conformance results in `pai-zoo info` (issue 6) -------------------------------------
def test_info_says_when_conformance_has_not_run(capsys, monkeypatch, tmp_path):
    monkeypatch.setenv("PAI_ZOO_CACHE", str(tmp_path))
    assert main(["info", "llama"]) == 0
    out = capsys.readouterr().out
    assert "megatron-core: >=0.16.1" in out and "backends:      local" in out
    assert ("conformance: not run yet - run `pai-zoo conformance llama` "
            f"(results go to {tmp_path / 'conformance' / 'llama.json'})") in out


def test_suite_runs_are_recorded_and_shown_by_info(capsys, monkeypatch, tmp_path):
    """A pytest run of ConformanceSuite classes (one real family, one unknown) writes per-family JSON
    results that `pai-zoo info` shows; a later run of other checks keeps the earlier ones."""
    import pai_zoo

    tests = tmp_path / "test_suites.py"
    tests.write_text(textwrap.dedent("""
        from pai_zoo_conformance import ConformanceSuite

        class TestMistral(ConformanceSuite):
            family = "mistral"   # an alias: recorded under the family's name, llama

        class TestMissing(ConformanceSuite):
            family = "no-such-family"
    """))
    cache = tmp_path / "cache"

    def pytest_run(*args):  # a pytest session in this process, as `pai-zoo conformance` runs one
        with monkeypatch.context() as patch:
            patch.setenv("PAI_ZOO_CACHE", str(cache))
            patch.chdir(tmp_path)
            code = pytest.main(["-q", "-p", "no:cacheprovider", str(tests), *args])
        return subprocess.CompletedProcess(["pytest", *args], int(code), capsys.readouterr().out, "")

    proc = pytest_run("-k", "registration")
    assert proc.returncode == 1, proc.stdout[-3000:]  # TestMissing fails
    assert not re.search(r"\b2 deselected", proc.stdout) and "1 passed" in proc.stdout and "1 error" in proc.stdout
    llama = json.loads((cache / "conformance" / "llama.json").read_text())
    assert llama["family"] == "llama" and set(llama["checks"]) == {"test_registration"}
    first = llama["checks"]["test_registration"]
    assert first["outcome"] == "passed" and first["pai_zoo_version"] == pai_zoo.__version__
    assert first["plugin_version"] == "0.1.0" and first["date"].endswith("Z")
    missing = json.loads((cache / "conformance" / "no-such-family.json").read_text())
    assert missing["checks"] == {"test_registration": {**missing["checks"]["test_registration"], "outcome": "failed"}}

    proc = pytest_run("-k", "TestMistral and config_round_trip")
    assert proc.returncode == 0, proc.stdout[-3000:]
    llama = json.loads((cache / "conformance" / "llama.json").read_text())
    assert {k: v["outcome"] for k, v in llama["checks"].items()} == {
        "test_config_round_trip_every_preset": "passed", "test_registration": "passed"}

    monkeypatch.setenv("PAI_ZOO_CACHE", str(cache))
    assert main(["info", "mistral"]) == 0
    out = capsys.readouterr().out
    recorded = cache / "conformance" / "llama.json"
    assert f"conformance: 2 of 2 checks passed (recorded {llama['updated']} in {recorded})" in out
    assert "\n  passed  test_registration " in out and "\n  passed  test_config_round_trip_every_preset " in out
