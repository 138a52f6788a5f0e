"""Real tokenizers only: a family name or published preset means the plugin's real published tokenizer where it
bundles one that fits, else a clear refusal; toy test tokenizers only for the test presets."""
from __future__ import annotations

import dataclasses
import subprocess
import sys
from types import SimpleNamespace

import pytest

from pai_zoo.families.registry import get_registry
from pai_zoo.plugin.errors import NoBundledTokenizerError, PaiZooError, PluginError
from pai_zoo.tokenizers import names
from pai_zoo.tokenizers.names import bundled_tokenizer_folder, model_tokenizer, resolve_tokenizer

pytestmark = pytest.mark.no_megatron  # runs once (pai_zoo_conformance.megatron_free)

TEXTS = ["Hello world", "Hello  world, the quick brown fox.", "def f(x):\n    return x + 12345", "你好，世界 🙂",
         " leading space", "a</s>  b"]


@pytest.fixture()
def cache(tmp_path, monkeypatch):
    """A fresh pai-zoo cache, so the bundled tokenizers are written by the code under test."""
    monkeypatch.setenv("PAI_ZOO_CACHE", str(tmp_path / "cache"))
    return tmp_path / "cache"


def test_a_family_without_a_bundled_tokenizer_is_refused_not_given_its_toy(cache):
    with pytest.raises(NoBundledTokenizerError) as err:
        resolve_tokenizer("qwen2")
    assert str(err.value).startswith("--tokenizer qwen2: family 'qwen2' bundles no published tokenizer; pass the "
                                     "checkpoint's folder (--tokenizer /path/to/")
    assert "or a tokenizer.json" in str(err.value) and isinstance(err.value, PaiZooError)
    assert names.NoBundledTokenizerError is NoBundledTokenizerError  # still importable from its old place
    with pytest.raises(NoBundledTokenizerError, match=r"preset 'qwen2-7b' of family 'qwen2' bundles no published "
                                                      r"tokenizer.*/path/to/qwen2-7b"):
        resolve_tokenizer("qwen2-7b")
    assert not (cache / "test-tokenizers").exists()  # no toy tokenizer was written for a published name


def test_llama_presets_get_the_mistral_tokenizer_only_where_it_is_theirs(cache):
    # The bundled model is Mistral-7B-v0.1's: Llama-3 has 128256 tiktoken ranks, Llama-2 other 32000 pieces.
    for name in ("llama3-8b", "llama3.1-8b", "llama2-7b", "llama-7b", "mistral-7b-v0.3"):
        with pytest.raises(NoBundledTokenizerError, match=rf"preset '{name}' of family 'llama' .*mistral-7b"):
            resolve_tokenizer(name)
    with pytest.raises(NoBundledTokenizerError, match="family 'llama' bundles no published tokenizer"):
        resolve_tokenizer("llama")  # not one tokenizer for every Llama preset
    ref = resolve_tokenizer("mistral-7b")
    assert ref == resolve_tokenizer("MISTRAL-7B")
    assert ref.path == str(bundled_tokenizer_folder(get_registry().family("llama"), "published"))
    assert ref.load().vocab_size == get_registry().family("llama").presets["mistral-7b"]["vocab_size"] == 32000


def test_the_bundled_published_tokenizer_encodes_like_transformers(cache):
    from transformers import AutoTokenizer

    ref = resolve_tokenizer("mistral-7b")
    tok, auto = ref.load(), AutoTokenizer.from_pretrained(ref.path)
    assert tok.vocab_size == len(auto)
    for text in TEXTS:
        assert tok.encode(text) == auto.encode(text), text
    assert tok.encode("Hello world") == [1, 22557, 1526]  # Mistral-7B-v0.1's ids (Llama-2's are [1, 15043, 3186])


def test_every_published_name_is_refused_or_fits_and_is_never_a_test_tokenizer(cache):
    registry = get_registry()
    given = []
    for family in registry.families.values():
        test_folder = str(cache / "test-tokenizers")
        for name in (family.name, *(p for p in family.presets if not family.is_test_preset(p))):
            try:
                ref = resolve_tokenizer(name)
            except NoBundledTokenizerError as exc:
                assert f"--tokenizer {name}: " in str(exc) and "pass the checkpoint's folder" in str(exc)
                continue
            assert not ref.path.startswith(test_folder), name
            vocab = family.presets[name]["vocab_size"] if name in family.presets else None
            assert vocab is None or ref.load().vocab_size <= vocab, name
            given.append(name)
    assert given == ["mistral-7b"]


def test_a_published_tokenizer_bigger_than_the_preset_vocabulary_is_refused(cache, monkeypatch):
    from pai_zoo.tokenizers import names

    llama = get_registry().family("llama")
    small = {**llama.presets["mistral-7b"], "vocab_size": 1000}
    family = dataclasses.replace(llama, presets={**llama.presets, "mistral-7b": small})
    with pytest.raises(NoBundledTokenizerError, match="has 32000 tokens, more than the preset's vocab_size 1000"):
        names._published_ref(family, "mistral-7b")


def test_published_tokenizer_presets_must_be_published_presets_with_a_writer():
    llama = get_registry().family("llama")
    with pytest.raises(PluginError, match=r"\['llama3-tiny'\] are not published presets"):
        dataclasses.replace(llama, published_tokenizer_presets=("llama3-tiny",))
    with pytest.raises(PluginError, match=r"\['gpt-17'\] are not published presets"):
        dataclasses.replace(llama, published_tokenizer_presets=("gpt-17",))
    with pytest.raises(PluginError, match="without a published_tokenizer"):
        dataclasses.replace(llama, published_tokenizer=None)


def test_a_model_gets_the_test_tokenizer_only_for_test_presets(cache):
    llama = get_registry().family("llama")

    def source(preset):
        return SimpleNamespace(path=None, kind="preset", family=llama, preset=preset)

    assert model_tokenizer(source("llama3-tiny"), 1000).vocab_size == 600  # the toy, fitting the tiny preset
    assert model_tokenizer(source("mistral-7b"), 32000).vocab_size == 32000  # the real one
    assert model_tokenizer(source("llama3-8b"), 128256) is None  # never the toy, never Mistral's
    assert model_tokenizer(source("mistral-7b"), 1000) is None  # an override left no room for it


@pytest.mark.parametrize(("name", "expected"), [
    ("llama3-tiny", "tokenizer:     test vocabulary (600 pieces), not a published model's"),
    ("mistral-7b", "tokenizer:     published tokenizer, bundled by the plugin (32000 pieces)"),
    ("qwen2", "tokenizer:     none bundled: pass a checkpoint folder (--tokenizer /path/to/"),
    ("llama3-8b", "tokenizer:     none bundled (bundled for mistral-7b): pass a checkpoint folder "
                  "(--tokenizer /path/to/llama3-8b)"),
])
def test_info_labels_the_tokenizer(cache, name, expected):
    out = subprocess.run([sys.executable, "-m", "pai_zoo.cli", "info", name], capture_output=True, text=True)
    assert out.returncode == 0, out.stderr
    assert any(line.startswith(expected) for line in out.stdout.splitlines()), out.stdout
