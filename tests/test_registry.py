"""Plugin discovery and lookups of :mod:`pai_zoo.registry`.

Entry-point discovery is tested for real: fake installed distributions (a ``*.dist-info``
folder with ``METADATA`` and ``entry_points.txt``) plus their plugin modules are written to a
temporary folder, which is prepended to ``PYTHONPATH`` of a subprocess so that
``importlib.metadata`` finds them next to the real, editable-installed plugins (Llama and any others).
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import textwrap
import types
from pathlib import Path

import pytest

import pai_zoo_llama
from pai_zoo import Family, PluginError, UnknownModelError, WeightMap, hookimpl
from pai_zoo.families.registry import PLUGINS_ENV, Registry, reset_registry
from pai_zoo.rl import RLTrainer, get_trainer, list_trainers
from pai_zoo_llama import CONFIG, weights
from pai_zoo_llama.presets import PRESETS

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

BIN = Path(sys.executable).parent
PAI_ZOO = str(BIN / "pai-zoo") if (BIN / "pai-zoo").exists() else shutil.which("pai-zoo")


# -- fake installed distributions -----------------------------------------------------------
def install_fake(
    root: Path, dist: str, entry_points: dict[str, str], modules: dict[str, str], version: str = "0.1"
) -> Path:
    """Write ``DIST-VERSION.dist-info`` (METADATA, entry_points.txt in group ``pai_zoo``) and
    the plugin modules into ``root``; return the dist-info folder."""
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir(parents=True)
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    eps = "".join(f"{name} = {target}\n" for name, target in entry_points.items())
    (info / "entry_points.txt").write_text(f"[pai_zoo]\n{eps}")
    for module, source in modules.items():
        (root / f"{module}.py").write_text(textwrap.dedent(source))
    return info


TOYFAM_PLUGIN = """
    from pai_zoo import Family, hookimpl
    from pai_zoo.rl import RLTrainer
    from pai_zoo_llama import CONFIG, weights
    from pai_zoo_llama.presets import PRESETS

    TOY = Family(
        name="toyfam",
        aliases=("toy",),
        hf_architectures=("ToyForCausalLM",),
        model_types=("toyfam",),
        presets={"toyfam-tiny": dict(PRESETS["llama3-tiny"], model_type="llama")},
        tiny="toyfam-tiny",
        config_map=CONFIG,
        weight_map=weights,
        description="a toy family for the registry tests",
    )


    class ToyPPO(RLTrainer):
        name = "toy-ppo"


    @hookimpl
    def pai_zoo_families():
        return [TOY]


    @hookimpl
    def pai_zoo_rl_trainers():
        return {"toy-ppo": ToyPPO}
"""

BROKEN_IMPORT_PLUGIN = """
    raise ImportError("toy dependency missing: frobnicate")
"""

BROKEN_FAMILIES_PLUGIN = """
    from pai_zoo import hookimpl


    @hookimpl
    def pai_zoo_families():
        raise RuntimeError("families exploded")


    @hookimpl
    def pai_zoo_rl_trainers():
        return {"from-broken": object}
"""


def _family_plugin_source(name: str, aliases: tuple[str, ...] = ()) -> str:
    return f"""
    from pai_zoo import Family, hookimpl
    from pai_zoo_llama import CONFIG, weights


    @hookimpl
    def pai_zoo_families():
        return [Family(name={name!r}, aliases={aliases!r}, presets={{{name + '-tiny'!r}: {{"model_type": "llama"}}}},
                       tiny={name + '-tiny'!r}, config_map=CONFIG, weight_map=weights)]
    """


@pytest.fixture(scope="module")
def good_env(tmp_path_factory) -> Path:
    """toyfam (works), brokenimport (ImportError on import), brokenfam (pai_zoo_families raises)."""
    root = tmp_path_factory.mktemp("good_env")
    install_fake(root, "pai-zoo-toyfam", {"toyfam": "toyfam_plugin"}, {"toyfam_plugin": TOYFAM_PLUGIN})
    install_fake(root, "pai-zoo-brokenimport", {"brokenimport": "broken_import_plugin"},
                 {"broken_import_plugin": BROKEN_IMPORT_PLUGIN})
    install_fake(root, "pai-zoo-brokenfam", {"brokenfam": "broken_families_plugin"},
                 {"broken_families_plugin": BROKEN_FAMILIES_PLUGIN}, version="2.3")
    return root


#: The plugins ``good_env`` adds to the really installed ones.
FAKE_PLUGINS = {"toyfam", "brokenimport", "brokenfam"}


@pytest.fixture(scope="module")
def installed() -> dict:
    """:func:`summary` of the really installed plugins (llama and whichever others are installed), found at run time."""
    s = summary(None)
    assert "llama" in s["plugins"] and "llama" in s["families"], s
    assert not FAKE_PLUGINS & set(s["plugins"]), s
    assert all(p["error"] is None for p in s["plugins"].values()), s
    return s


@pytest.fixture(scope="module")
def dup_env(tmp_path_factory) -> Path:
    """dupa's family 'dupfam' and dupb's alias 'DUPFAM' collide (case-insensitively)."""
    root = tmp_path_factory.mktemp("dup_env")
    install_fake(root, "pai-zoo-dupa", {"dupa": "dupa_plugin"}, {"dupa_plugin": _family_plugin_source("dupfam")})
    install_fake(root, "pai-zoo-dupb", {"dupb": "dupb_plugin"},
                 {"dupb_plugin": _family_plugin_source("otherfam", ("DUPFAM",))})
    return root


def _env(pythonpath: Path | None, plugins: str | None = None) -> dict:
    env = dict(os.environ)
    env.pop(PLUGINS_ENV, None)
    if plugins is not None:
        env[PLUGINS_ENV] = plugins
    if pythonpath is not None:
        env["PYTHONPATH"] = os.pathsep.join(p for p in (str(pythonpath), os.environ.get("PYTHONPATH")) if p)
    return env


def run_cli(args: list[str], pythonpath: Path | None, plugins: str | None = None) -> subprocess.CompletedProcess:
    assert PAI_ZOO, "the pai-zoo console script is not installed"
    return subprocess.run([PAI_ZOO, *args], env=_env(pythonpath, plugins), capture_output=True, text=True, timeout=120)


def run_py(code: str, pythonpath: Path | None, plugins: str | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], env=_env(pythonpath, plugins),
                          capture_output=True, text=True, timeout=120)


SUMMARY = """
    import json
    import pai_zoo
    r = pai_zoo.get_registry()
    print(json.dumps({
        "plugins": {n: {"dist": p.distribution, "version": p.version, "families": p.families, "error": p.error,
                        "has_traceback": bool(p.traceback)} for n, p in r.plugins.items()},
        "families": sorted(r.families),
    }))
"""


def summary(pythonpath: Path | None, plugins: str | None = None) -> dict:
    proc = run_py(SUMMARY, pythonpath, plugins)
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def row(output: str, plugin: str) -> str:
    """The ``pai-zoo list`` line of ``plugin``."""
    lines = [line for line in output.splitlines() if line.split()[:1] == [plugin]]
    assert len(lines) == 1, f"no single row for {plugin!r} in:\n{output}"
    return lines[0]


# -- 1. entry-point discovery -------------------------------------------------------------------
def test_list_shows_broken_plugins_and_keeps_the_good_ones(good_env):
    proc = run_cli(["list"], good_env)
    assert proc.returncode == 0, proc.stderr
    out = proc.stdout
    assert out.splitlines()[0].split() == ["PLUGIN", "DISTRIBUTION", "VERSION", "FAMILIES"]
    assert "BROKEN: ImportError: toy dependency missing: frobnicate" in row(out, "brokenimport")
    broken_fam = row(out, "brokenfam")
    assert "BROKEN: RuntimeError: families exploded" in broken_fam
    assert broken_fam.split()[1:3] == ["pai-zoo-brokenfam", "2.3"]
    assert row(out, "toyfam").split() == ["toyfam", "pai-zoo-toyfam", "0.1", "toyfam", "(toy)"]
    llama = row(out, "llama")
    assert llama.split()[1:4] == ["pai-zoo-llama", "0.1.0", "llama"]
    assert "BROKEN" not in llama and "mistral" in llama
    assert PLUGINS_ENV not in out


def test_registry_in_an_environment_with_broken_plugins(good_env):
    proc = run_py("""
        import pai_zoo
        from pai_zoo.errors import UnknownModelError
        r = pai_zoo.get_registry()
        assert r.family("llama").name == "llama" and r.family("Mistral").plugin == "llama"
        assert r.family("TOY").name == "toyfam" and r.family("toyfam").plugin == "toyfam"
        assert r.preset("toyfam-tiny")[1]["hidden_size"] == 64
        assert r.family_for_hf_config({"architectures": ["ToyForCausalLM"]}).name == "toyfam"
        assert r.plugins["brokenimport"].broken and "frobnicate" in r.plugins["brokenimport"].traceback
        assert r.plugins["brokenfam"].broken and r.plugins["brokenfam"].families == []
        assert not r.pm.has_plugin("brokenfam")  # a broken plugin's other hooks are dropped too
        assert sorted(pai_zoo.rl.list_trainers()) == ["dpo", "grpo", "ppo", "reward", "toy-ppo"]  # + the toy
        try:
            r.family("nosuch")
        except UnknownModelError as exc:
            msg = str(exc)
        assert "broken plugins: brokenimport, brokenfam" in msg or "broken plugins: brokenfam, brokenimport" in msg, msg
        assert "toyfam-tiny" in msg and "llama3-tiny" in msg
        print("ok")
    """, good_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_summary_of_discovered_plugins(good_env, installed):
    s = summary(good_env)
    assert set(s["plugins"]) == set(installed["plugins"]) | FAKE_PLUGINS
    assert s["families"] == sorted([*installed["families"], "toyfam"])
    for name, plugin in installed["plugins"].items():  # the fakes change nothing about the real plugins
        assert s["plugins"][name] == plugin, name
    assert s["plugins"]["toyfam"] == {"dist": "pai-zoo-toyfam", "version": "0.1", "families": ["toyfam"],
                                      "error": None, "has_traceback": False}
    assert s["plugins"]["brokenimport"]["error"] == "ImportError: toy dependency missing: frobnicate"
    assert s["plugins"]["brokenimport"]["has_traceback"]
    assert s["plugins"]["brokenfam"]["error"] == "RuntimeError: families exploded"


# -- 2. no torch / megatron on discovery --------------------------------------------------------
NO_HEAVY = 'assert "torch" not in sys.modules and not any(m.startswith("megatron") for m in sys.modules), ' \
           'sorted(m for m in sys.modules if m.startswith(("torch", "megatron")))'


def test_list_imports_no_torch_or_megatron(good_env):
    proc = run_py(f"""
        import sys
        from pai_zoo.cli import main
        assert main(["list"]) == 0
        assert main(["list", "--json"]) == 0
        {NO_HEAVY}
        import pai_zoo
        assert pai_zoo.get_registry().family("toyfam").name == "toyfam"  # toyfam imports pai_zoo_llama
        {NO_HEAVY}
        print("ok")
    """, good_env)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.rstrip().endswith("ok")


def test_import_pai_zoo_imports_no_torch():
    proc = run_py(f"""
        import sys
        import pai_zoo
        {NO_HEAVY}
        assert "pai_zoo.registry" in sys.modules
        print("ok")
    """, None)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.strip() == "ok"


def test_no_torch_check_can_fail():
    """The check above is meaningful: torch is installed and would be seen in sys.modules."""
    proc = run_py(f"""
        import sys
        import torch
        {NO_HEAVY}
    """, None)
    assert proc.returncode != 0 and "AssertionError" in proc.stderr


# -- 3. conflicting plugins -------------------------------------------------------------------
def _module_plugin(name: str, families=None, trainers=None) -> types.ModuleType:
    mod = types.ModuleType(name)
    if families is not None:
        def pai_zoo_families():
            if isinstance(families, BaseException):
                raise families
            return families
        mod.pai_zoo_families = hookimpl(pai_zoo_families)
    if trainers is not None:
        mod.pai_zoo_rl_trainers = hookimpl(lambda: trainers)
    return mod


def toy_family(name: str, aliases=(), presets=None, tiny=None, **kwargs) -> Family:
    presets = presets if presets is not None else {f"{name}-tiny": dict(PRESETS["llama3-tiny"], model_type="llama")}
    return Family(name=name, aliases=tuple(aliases), presets=presets, tiny=tiny or next(iter(presets)),
                  config_map=CONFIG, weight_map=weights, **kwargs)


class PluginA:
    @hookimpl
    def pai_zoo_families():
        return [toy_family("shared")]


class PluginB:
    @hookimpl
    def pai_zoo_families():
        return [toy_family("different", aliases=("other", "Shared"))]


def test_duplicate_family_alias_in_process():
    with pytest.raises(PluginError) as err:
        Registry(plugins=[("a", PluginA), ("b", PluginB)], use_entry_points=False)
    msg = str(err.value)
    assert "'a'" in msg and "'b'" in msg and "'Shared'" in msg and PLUGINS_ENV in msg


def test_duplicate_family_name_in_process():
    a = _module_plugin("a", [toy_family("same")])
    b = _module_plugin("b", [toy_family("SAME", presets={"other-tiny": {"model_type": "llama"}})])
    with pytest.raises(PluginError, match=r"'a'.*'b'"):
        Registry(plugins=[("a", a), ("b", b)], use_entry_points=False)


def test_duplicate_preset_in_process():
    a = _module_plugin("a", [toy_family("fam-a", presets={"Common-Tiny": {"model_type": "llama"}})])
    b = _module_plugin("b", [toy_family("fam-b", presets={"common-tiny": {"model_type": "llama"}})])
    with pytest.raises(PluginError, match=r"preset 'common-tiny' is claimed by two plugins: 'a' and 'b'"):
        Registry(plugins=[("a", a), ("b", b)], use_entry_points=False)


@pytest.mark.parametrize("order", ["preset-first", "family-first"])
def test_preset_and_family_name_collide_in_either_order(order):
    """A preset of one plugin and a family name of another share one namespace, whatever the order."""
    a = ("a", _module_plugin("a", [toy_family("fam-a", presets={"foo": {"model_type": "llama"}})]))
    b = ("b", _module_plugin("b", [toy_family("foo", presets={"foo-tiny": {"model_type": "llama"}})]))
    plugins = [a, b] if order == "preset-first" else [b, a]
    with pytest.raises(PluginError) as err:
        Registry(plugins=plugins, use_entry_points=False)
    assert "'a'" in str(err.value) and "'b'" in str(err.value) and "foo" in str(err.value)


def test_two_plugins_with_the_same_entry_point_name_in_process():
    with pytest.raises(PluginError, match="two plugins are named 'x'"):
        Registry(plugins=[("x", _module_plugin("x1", [])), ("x", _module_plugin("x2", []))], use_entry_points=False)


def test_duplicate_family_via_entry_points(dup_env):
    proc = run_cli(["list"], dup_env)
    assert proc.returncode != 0
    assert "PluginError" not in proc.stdout and "Traceback" not in proc.stderr
    err = proc.stderr
    assert err.startswith("pai-zoo: error:") and "'dupa'" in err and "'dupb'" in err and "DUPFAM" in err
    code = """
        import pai_zoo
        from pai_zoo.errors import PluginError
        try:
            pai_zoo.get_registry()
        except PluginError as exc:
            print(exc)
        else:
            raise SystemExit("no PluginError")
    """
    proc = run_py(code, dup_env)
    assert proc.returncode == 0, proc.stderr + proc.stdout
    assert "'dupa'" in proc.stdout and "'dupb'" in proc.stdout
    # the remedy the message suggests: select one of them
    proc = run_cli(["list"], dup_env, plugins="dupb,llama")
    assert proc.returncode == 0, proc.stderr
    assert "otherfam (DUPFAM)" in row(proc.stdout, "dupb") and "dupa" not in proc.stdout


def test_same_entry_point_name_in_two_distributions(tmp_path):
    install_fake(tmp_path, "pai-zoo-one", {"samename": "one_plugin"}, {"one_plugin": _family_plugin_source("onefam")})
    install_fake(tmp_path, "pai-zoo-two", {"samename": "two_plugin"}, {"two_plugin": _family_plugin_source("twofam")})
    proc = run_cli(["list"], tmp_path)
    assert proc.returncode != 0
    assert "two plugins are named 'samename'" in proc.stderr
    assert "pai-zoo-one" in proc.stderr and "pai-zoo-two" in proc.stderr


# -- 4. PAI_ZOO_PLUGINS and uninstalling ----------------------------------------------------
def test_pai_zoo_plugins_selects_entry_points(good_env, installed):
    s = summary(good_env, plugins="toyfam")
    assert set(s["plugins"]) == {"toyfam"} and s["families"] == ["toyfam"]
    s = summary(good_env, plugins=" toyfam , llama ")
    assert set(s["plugins"]) == {"toyfam", "llama"}
    assert s["families"] == sorted([*installed["plugins"]["llama"]["families"], "toyfam"])
    for everything in (None, "", "all", "*"):
        s = summary(good_env, plugins=everything)
        assert set(s["plugins"]) == set(installed["plugins"]) | FAKE_PLUGINS, everything
        assert s["families"] == sorted([*installed["families"], "toyfam"])


def test_pai_zoo_plugins_in_list_output(good_env):
    proc = run_cli(["list"], good_env, plugins="toyfam")
    assert proc.returncode == 0, proc.stderr
    assert "toyfam" in row(proc.stdout, "toyfam")
    assert not any(line.startswith(("llama", "broken")) for line in proc.stdout.splitlines())
    assert "(plugins selected by PAI_ZOO_PLUGINS: toyfam)" in proc.stdout
    proc = run_cli(["info", "llama"], good_env, plugins="toyfam")  # an unknown model is a user error: exit 1
    assert proc.returncode == 1 and "'llama'" in proc.stderr and "toyfam-tiny" in proc.stderr


def test_pai_zoo_plugins_in_process(monkeypatch):
    monkeypatch.delenv(PLUGINS_ENV, raising=False)
    assert Registry(env={PLUGINS_ENV: "nothing-installed"}).families == {}
    assert set(Registry(env={PLUGINS_ENV: "llama"}).families) == {"llama", "mixtral", "llama4", "ministral3"}
    monkeypatch.setenv(PLUGINS_ENV, "nothing-installed")
    assert Registry().plugins == {}
    monkeypatch.delenv(PLUGINS_ENV)
    assert "llama" in Registry().families


def test_uninstalling_a_plugin_removes_exactly_its_families(good_env, installed, tmp_path):
    env = tmp_path / "site"
    shutil.copytree(good_env, env)
    before = summary(env)
    shutil.rmtree(env / "pai_zoo_toyfam-0.1.dist-info")
    after = summary(env)
    assert set(before["families"]) - set(after["families"]) == {"toyfam"}
    assert set(after["families"]) == set(installed["families"])
    assert set(before["plugins"]) - set(after["plugins"]) == {"toyfam"}
    shutil.rmtree(env / "pai_zoo_brokenfam-2.3.dist-info")
    again = summary(env)
    assert again["families"] == after["families"]
    assert set(again["plugins"]) == set(installed["plugins"]) | {"brokenimport"}


# -- 5. RL trainers -----------------------------------------------------------------------------
class MyTrainer(RLTrainer):
    name = "mytrainer"
    description = "a test trainer"

    def run(self) -> dict:
        return {"steps": self.settings.get("steps", 0)}


class OtherTrainer(RLTrainer):
    name = "othertrainer"


def core_trainers() -> dict:
    """The trainers pai_zoo.rl itself registers: in every list."""
    from pai_zoo.rl.ppo import PPOTrainer
    from pai_zoo.rl.reward import RewardTrainer

    return {"ppo": PPOTrainer, "reward": RewardTrainer}


def test_rl_trainers_are_collected_from_plugins():
    reg = Registry(plugins=[("p1", _module_plugin("p1", trainers={"mytrainer": MyTrainer})),
                            ("p2", _module_plugin("p2", [toy_family("tfam")], {"othertrainer": OtherTrainer}))],
                   use_entry_points=False)
    assert list_trainers(reg) == {"mytrainer": MyTrainer, "othertrainer": OtherTrainer, **core_trainers()}


def test_rl_trainers_of_a_broken_plugin_are_not_registered():
    reg = Registry(plugins=[("ok", _module_plugin("ok", trainers={"mytrainer": MyTrainer})),
                            ("bad", _module_plugin("bad", RuntimeError("boom"), {"othertrainer": OtherTrainer}))],
                   use_entry_points=False)
    assert reg.plugins["bad"].error == "RuntimeError: boom"
    assert list_trainers(reg) == {"mytrainer": MyTrainer, **core_trainers()}


def test_duplicate_rl_trainer_names_both_plugins():
    reg = Registry(plugins=[("first", _module_plugin("first", trainers={"mytrainer": MyTrainer})),
                            ("second", _module_plugin("second", trainers={"mytrainer": OtherTrainer}))],
                   use_entry_points=False)
    with pytest.raises(PluginError) as err:
        list_trainers(reg)
    assert "'mytrainer'" in str(err.value) and "'first'" in str(err.value) and "'second'" in str(err.value)


@pytest.fixture
def installed_registry(request):
    reg = Registry(plugins=[("rlplug", _module_plugin("rlplug", trainers={"mytrainer": MyTrainer,
                                                                         "othertrainer": OtherTrainer}))],
                   use_entry_points=False)
    reset_registry(reg)
    request.addfinalizer(reset_registry)
    return reg


def test_get_trainer(installed_registry):
    assert list_trainers() == {"mytrainer": MyTrainer, "othertrainer": OtherTrainer, **core_trainers()}
    cls = get_trainer("mytrainer")
    assert cls is MyTrainer and cls(steps=3).run() == {"steps": 3}
    with pytest.raises(UnknownModelError) as err:
        get_trainer("nope")
    assert "'nope'" in str(err.value) and "registered: mytrainer, othertrainer, ppo, reward" in str(err.value)


def test_get_trainer_with_only_the_core_trainers():
    reset_registry(Registry(plugins=[], use_entry_points=False))
    try:
        assert list_trainers() == core_trainers()
        with pytest.raises(UnknownModelError, match="registered: ppo, reward$"):
            get_trainer("nope")
    finally:
        reset_registry(None)


def test_rl_trainer_base_class():
    with pytest.raises(NotImplementedError, match="OtherTrainer.run"):
        OtherTrainer(lr=1e-6).run()
    assert OtherTrainer(lr=1e-6).settings == {"lr": 1e-6}


# -- 6. lookups -----------------------------------------------------------------------------
TOY = toy_family("toyfam", aliases=("Toy",), hf_architectures=("ToyForCausalLM",), model_types=("toyfam", "toy2"))


@pytest.fixture(scope="module")
def registry() -> Registry:
    return Registry(plugins=[("llama", pai_zoo_llama), ("toyfam", _module_plugin("toyfam", [TOY]))],
                    use_entry_points=False, env={})


def test_family_by_name_and_alias_case_insensitive(registry):
    llama = registry.family("llama")
    assert llama is pai_zoo_llama.LLAMA and llama.plugin == "llama"
    for name in ("LLAMA", "Llama3.1", "mistral", "MISTRAL", "llama2"):
        assert registry.family(name) is llama
    assert registry.family("toy") is TOY and registry.family("TOYFAM") is TOY and TOY.plugin == "toyfam"
    assert registry.is_family("Toy") and not registry.is_family("llama3-tiny")
    assert registry.plugins["toyfam"].families == ["toyfam"]
    assert registry.plugins["llama"].families == ["llama", "mixtral", "llama4", "ministral3"]


def test_preset_lookup(registry):
    family, cfg = registry.preset("LLAMA3-TINY")
    assert family is pai_zoo_llama.LLAMA and cfg == PRESETS["llama3-tiny"]
    cfg["hidden_size"] = 1  # a copy: the family's preset is untouched
    assert registry.preset("llama3-tiny")[1]["hidden_size"] == 64
    assert registry.preset("mistral-tiny")[1]["model_type"] == "mistral"
    assert registry.preset("toyfam-tiny")[0] is TOY
    assert registry.is_preset("Mistral-Tiny") and not registry.is_preset("mistral")


def test_family_for_hf_config(registry):
    assert registry.family_for_hf_config({"architectures": ["MistralForCausalLM"]}).name == "llama"
    assert registry.family_for_hf_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama"}).name == "llama"
    assert registry.family_for_hf_config({"model_type": "toy2"}) is TOY
    assert registry.family_for_hf_config({"model_type": "mistral"}).name == "llama"
    # architectures win over model_type; an unknown architecture falls back to model_type
    assert registry.family_for_hf_config({"architectures": ["ToyForCausalLM"], "model_type": "llama"}) is TOY
    assert registry.family_for_hf_config({"architectures": ["Nope"], "model_type": "toyfam"}) is TOY
    with pytest.raises(UnknownModelError) as err:
        registry.family_for_hf_config(
            {"architectures": ["GPT2LMHeadModel"], "model_type": "gpt2"}, where="ckpt/config.json"
        )
    msg = str(err.value)
    assert msg.startswith("ckpt/config.json:") and "GPT2LMHeadModel" in msg and "'gpt2'" in msg
    assert "installed families: llama, llama4, ministral3, mixtral, toyfam" in msg


def test_unknown_name_lists_presets_and_families(registry):
    for lookup in (registry.family, registry.preset):
        with pytest.raises(UnknownModelError) as err:
            lookup("nosuch")
        msg = str(err.value)
        assert "'nosuch'" in msg and "llama3-tiny" in msg and "mistral-7b" in msg and "toyfam-tiny" in msg
        assert "a family (llama, llama4, ministral3, mixtral, toyfam)" in msg and "broken" not in msg


def test_unknown_name_mentions_broken_plugins():
    reg = Registry(plugins=[("bad", _module_plugin("bad", ImportError("no frob")))], use_entry_points=False)
    assert reg.plugins["bad"].broken and reg.plugins["bad"].error == "ImportError: no frob"
    assert "ImportError: no frob" in reg.plugins["bad"].traceback
    with pytest.raises(UnknownModelError, match=r"not a preset \(none\), a family \(none\).*broken plugins: bad"):
        reg.family("llama")


def test_weight_map_hook_defaults_to_the_family_table_and_can_be_overridden(registry):
    assert [type(r).__name__ for r in registry.weight_map(TOY, {}).rows][:2] == ["Vocab", "Copy"]
    custom = WeightMap()

    class Override:
        @hookimpl
        def pai_zoo_weight_map(family, config):
            return custom if family.name == "toyfam" else None

    reg = Registry(plugins=[("llama", pai_zoo_llama), ("toyfam", _module_plugin("toyfam", [toy_family("toyfam")])),
                            ("override", Override)], use_entry_points=False)
    assert reg.weight_map(reg.family("toyfam"), {}) is custom
    assert len(reg.weight_map(reg.family("llama"), {}).rows) == 9


def test_family_validation():
    with pytest.raises(PluginError, match=r"tiny preset 'missing' is not among its presets \['a-tiny'\]"):
        Family(
            name="bad",
            presets={"a-tiny": {"model_type": "llama"}},
            tiny="missing",
            config_map=CONFIG,
            weight_map=weights,
        )
    with pytest.raises(PluginError, match="preset 'a-tiny' has no 'model_type'"):
        Family(name="bad", presets={"a-tiny": {"hidden_size": 8}}, tiny="a-tiny", config_map=CONFIG, weight_map=weights)
    fam = toy_family("good", aliases=("g",))
    assert fam.names == ("good", "g") and fam.default_model_type == "good"


def test_a_family_that_fails_validation_at_import_is_a_broken_plugin(tmp_path):
    install_fake(
        tmp_path,
        "pai-zoo-badtiny",
        {"badtiny": "badtiny_plugin"},
        {
            "badtiny_plugin": """
        from pai_zoo import Family, hookimpl
        from pai_zoo_llama import CONFIG, weights

        BAD = Family(name="badtiny", presets={"x": {"model_type": "llama"}}, tiny="y", config_map=CONFIG,
                     weight_map=weights)
    """
        },
    )
    proc = run_cli(["list"], tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "BROKEN: PluginError: family 'badtiny': tiny preset 'y'" in row(proc.stdout, "badtiny")
    assert "llama" in row(proc.stdout, "llama")


def test_a_plugin_returning_something_else_than_a_family_is_broken():
    registry = Registry(plugins=[("odd", _module_plugin("odd", families=["not a family"]))], use_entry_points=False)
    assert registry.plugins["odd"].broken
    assert "returned str, not a pai_zoo.Family" in registry.plugins["odd"].error
    assert registry.families == {}


def test_pai_zoo_plugins_naming_a_missing_plugin_warns(good_env):
    assert Registry(env={PLUGINS_ENV: "llama,nosuch"}).missing_selected == ["nosuch"]
    proc = run_cli(["list"], good_env, plugins="toyfam,nosuch")
    assert proc.returncode == 0 and "not installed: nosuch" in proc.stderr


def test_two_families_claiming_one_architecture_is_ambiguous():
    a = toy_family("fam-a", hf_architectures=("LlamaForCausalLM",), model_types=("llama",))
    b = toy_family(
        "fam-b", presets={"fam-b-tiny": dict(PRESETS["llama3-tiny"])}, hf_architectures=("LlamaForCausalLM",)
    )
    registry = Registry(plugins=[("a", _module_plugin("a", families=[a])), ("b", _module_plugin("b", families=[b]))],
                        use_entry_points=False)
    with pytest.raises(
        PluginError, match=r"claimed by several families: 'fam-a' \(plugin 'a'\), 'fam-b' \(plugin 'b'\)"
    ):
        registry.family_for_hf_config({"architectures": ["LlamaForCausalLM"], "model_type": "llama"})


def test_a_plugin_trainer_named_like_a_builtin_one_is_refused():
    reg = Registry(plugins=[("clash", _module_plugin("clash", trainers={"ppo": MyTrainer}))], use_entry_points=False)
    with pytest.raises(PluginError, match=r"RL trainer 'ppo' is registered by both 'pai_zoo.rl' and 'clash'"):
        list_trainers(reg)
