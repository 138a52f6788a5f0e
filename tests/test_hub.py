"""Hugging Face Hub ids (pai_zoo.util.hub, docs/hub.md): read from a cache in huggingface_hub's own layout
(``models--org--name/{refs,snapshots,blobs}``, snapshot files symlinked to blobs named by their git or LFS hash) that
holds two revisions of a tiny model, never from the network."""
from __future__ import annotations

import hashlib
import os
import re
import shutil
import socket
from pathlib import Path

import pytest
import torch

import pai_zoo
from pai_zoo.util import hub

pytestmark = [pytest.mark.usefixtures("fresh_registry")]

REPO = "tiny-org/llama-tiny"
IDS = torch.tensor([[1, 5, 9, 2, 7]])


def _blob_name(data: bytes, lfs: bool) -> str:
    """The blob's name as huggingface_hub stores it: its etag, the sha256 of an LFS file, else git's blob sha1."""
    if lfs:
        return hashlib.sha256(data).hexdigest()
    return hashlib.sha1(b"blob %d\0" % len(data) + data).hexdigest()


def add_revision(cache: Path, repo_id: str, folder: Path, refs: tuple[str, ...]) -> str:
    """``folder``'s files as one commit of ``repo_id`` in ``cache``, named by each of ``refs``; returns the commit."""
    storage = cache / ("models--" + repo_id.replace("/", "--"))
    files = sorted(p for p in folder.iterdir() if p.is_file())
    commit = hashlib.sha1(b"".join(p.name.encode() + p.read_bytes() for p in files)).hexdigest()
    for path in files:
        data = path.read_bytes()
        blob = storage / "blobs" / _blob_name(data, lfs=path.suffix == ".safetensors")
        blob.parent.mkdir(parents=True, exist_ok=True)
        blob.write_bytes(data)
        pointer = storage / "snapshots" / commit / path.name
        pointer.parent.mkdir(parents=True, exist_ok=True)
        pointer.symlink_to(os.path.relpath(blob, pointer.parent))
    for ref in refs:
        (storage / "refs").mkdir(parents=True, exist_ok=True)
        (storage / "refs" / ref).write_text(commit)
    return commit


@pytest.fixture(scope="module")
def hub_cache(tmp_path_factory):
    """A cache holding REPO at two commits: ``main`` (llama3-tiny, seed 0) and ``narrow`` (hidden size 32, seed 1),
    with each commit's HF folder to compare with."""
    root = tmp_path_factory.mktemp("hub")
    folders = {}
    for name, seed, overrides in (("main", 0, {}), ("narrow", 1, {"hidden_size": 32, "intermediate_size": 64})):
        folders[name] = root / "folders" / name
        handle = pai_zoo.load("llama3-tiny", backend="hf", seed=seed, **overrides)
        handle.model.save_pretrained(folders[name])
        pai_zoo.get_registry().family("llama").test_tokenizer(folders[name])
    cache = root / "cache"
    commits = {name: add_revision(cache, REPO, folders[name], (name,)) for name in folders}
    return cache, folders, commits


@pytest.fixture
def offline_cache(hub_cache, monkeypatch):
    """huggingface_hub pointed at the cache (as HF_HUB_CACHE does), offline (as HF_HUB_OFFLINE=1 does)."""
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache[0]))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    return hub_cache


@pytest.fixture
def no_network(monkeypatch):
    """Every socket connection fails (and is counted): what the code under test tried to reach."""
    tried = []

    def refuse(self, address):
        tried.append(address)
        raise OSError("network disabled by the test")

    monkeypatch.setattr(socket.socket, "connect", refuse)
    monkeypatch.setattr(socket.socket, "connect_ex", refuse)
    monkeypatch.setattr(socket, "getaddrinfo", lambda *a, **k: refuse(None, a))
    return tried


def _reference_logits(folder: Path) -> torch.Tensor:
    from transformers import AutoModelForCausalLM

    with torch.no_grad():
        return AutoModelForCausalLM.from_pretrained(folder).eval()(IDS).logits


@pytest.mark.no_megatron
def test_cache_layout_is_huggingface_hubs_own(offline_cache):
    """huggingface_hub's own cache scanner reads the cache as a model with both revisions."""
    from huggingface_hub import scan_cache_dir

    cache, _, commits = offline_cache
    (repo,) = scan_cache_dir(cache).repos
    assert repo.repo_id == REPO and repo.repo_type == "model"
    assert {r.commit_hash: set(r.refs) for r in repo.revisions} == {commits["main"]: {"main"},
                                                                    commits["narrow"]: {"narrow"}}


@pytest.mark.no_megatron
def test_load_reads_the_default_branch_and_revision_picks_the_other(offline_cache):
    cache, folders, commits = offline_cache
    main = pai_zoo.load(REPO, backend="hf")
    assert main.checkpoint == cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / commits["main"]
    torch.testing.assert_close(main.logits(IDS), _reference_logits(folders["main"]), rtol=0, atol=0)
    for revision in ("narrow", commits["narrow"]):  # a ref's name or the commit itself
        narrow = pai_zoo.load(REPO, backend="hf", revision=revision)
        assert narrow.hf_config.hidden_size == 32
        torch.testing.assert_close(narrow.logits(IDS), _reference_logits(folders["narrow"]), rtol=0, atol=0)


@pytest.mark.no_megatron
def test_missing_model_offline_is_one_line_naming_id_cache_and_fix(offline_cache):
    cache = offline_cache[0]
    with pytest.raises(hub.HubError) as err:
        pai_zoo.load("tiny-org/not-cached", backend="hf", revision="v1")
    text = str(err.value)
    assert "\n" not in text
    for part in ("tiny-org/not-cached (revision v1)", str(cache), "hf download tiny-org/not-cached --revision v1",
                 "models--tiny-org--not-cached", "HF_HUB_OFFLINE"):
        assert part in text, text
    with pytest.raises(hub.HubError, match="revision .*no-such-ref"):  # an unknown ref of a cached model, too
        pai_zoo.load(REPO, backend="hf", revision="no-such-ref")


@pytest.mark.no_megatron
def test_cached_model_is_read_without_touching_the_network_even_online(hub_cache, monkeypatch, no_network):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(hub_cache[0]))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    assert pai_zoo.load(REPO, backend="hf").hf_config.hidden_size == 64
    assert pai_zoo.load(REPO, backend="hf", revision="narrow").hf_config.hidden_size == 32
    assert no_network == []
    with pytest.raises(hub.HubError, match="cannot be reached") as err:  # not cached, network down: the one line
        hub.snapshot("tiny-org/not-cached")
    assert no_network and "hf download tiny-org/not-cached" in str(err.value)


@pytest.mark.no_megatron
def test_ambiguity_rules(offline_cache, tmp_path, monkeypatch):
    from pai_zoo.plugin.errors import PaiZooError

    assert not hub.is_hub_id("llama3-tiny") and not hub.is_hub_id("llama")  # no slash: preset or family
    assert not hub.is_hub_id(str(tmp_path)) and not hub.is_hub_id("org--x/y")  # an absolute path; not a repo id
    assert hub.is_hub_id(REPO)
    monkeypatch.chdir(tmp_path)
    shutil.copytree(offline_cache[1]["narrow"], tmp_path / REPO)  # a local folder of that name wins
    assert not hub.is_hub_id(REPO)
    assert pai_zoo.load(REPO, backend="hf").checkpoint == Path(REPO)
    with pytest.raises(PaiZooError, match="revision=main: a revision is for a Hugging Face Hub id"):
        pai_zoo.load(REPO, backend="hf", revision="main")


@pytest.mark.no_megatron
def test_incomplete_snapshot_is_not_a_model(offline_cache, tmp_path, monkeypatch):
    """A snapshot holding only config.json (what transformers caches for AutoConfig) is no cached model."""
    from huggingface_hub import constants

    cache = tmp_path / "cache"
    only_config = tmp_path / "only-config"
    only_config.mkdir()
    shutil.copy(offline_cache[1]["main"] / "config.json", only_config)
    add_revision(cache, REPO, only_config, ("main",))
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(cache))
    with pytest.raises(hub.HubError, match="no such local folder, and not in the Hugging Face cache"):
        hub.snapshot(REPO)
    assert hub.snapshot(REPO, weights=False) == cache / f"models--{REPO.replace('/', '--')}" / "snapshots" / \
        next(iter((cache / f"models--{REPO.replace('/', '--')}" / "snapshots").iterdir())).name


@pytest.mark.no_megatron
def test_model_patterns_take_the_weights_once():
    files = ["config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
             "model.safetensors.index.json", "pytorch_model.bin", "consolidated.safetensors",
             "original/consolidated.pth", "model.gguf", "tokenizer.json", "tokenizer_config.json",
             "generation_config.json"]
    from huggingface_hub.utils import filter_repo_objects

    kept = set(filter_repo_objects(files, allow_patterns=hub.model_patterns(files)))
    assert kept == {"config.json", "model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors",
                    "model.safetensors.index.json", "tokenizer.json", "tokenizer_config.json", "generation_config.json"}
    bins = ["config.json", "pytorch_model.bin", "tokenizer.model"]
    assert set(filter_repo_objects(bins, allow_patterns=hub.model_patterns(bins))) == set(bins)


@pytest.mark.no_megatron
def test_cli_inspect_and_generate_take_hub_ids(offline_cache, tmp_path):
    from pai_zoo_conformance.cli_runs import run_cli

    cache, _, commits = offline_cache
    out = run_cli(["inspect", REPO, "--revision", "narrow"])
    assert out.returncode == 0, out.stderr
    assert commits["narrow"] in out.stdout and re.search(r"hidden_size\s+32\n", out.stdout), out.stdout
    out = run_cli(["inspect", REPO])
    assert out.returncode == 0 and commits["main"] in out.stdout, out.stderr
    out = run_cli(["inspect", "tiny-org/absent"])
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "pai-zoo: error: tiny-org/absent: no such local folder, and not in the Hugging Face cache" in out.stderr
    out = run_cli(["generate", "--model", REPO, "--revision", "narrow", "--backend", "hf", "--prompt", "the cat",
                   "--max-new-tokens", "3"])
    assert out.returncode == 0, out.stderr


@pytest.mark.megatron_once
def test_cli_convert_from_a_hub_id_to_mcore_reads_the_named_revision(offline_cache, tmp_path):
    from pai_zoo_conformance.cli_runs import run_cli

    _, folders, _ = offline_cache
    out = run_cli(["convert", REPO, tmp_path / "mcore", "--to", "mcore", "--revision", "narrow"])
    assert out.returncode == 0, out.stderr
    converted = pai_zoo.load(tmp_path / "mcore", backend="mcore")
    assert converted.mcore_config["hidden_size"] == 32
    reference = _reference_logits(folders["narrow"])
    torch.testing.assert_close(converted.logits(IDS)[..., :reference.shape[-1]], reference, rtol=1e-5, atol=1e-5)


@pytest.mark.no_megatron
def test_train_and_rl_take_hub_ids_and_revision(offline_cache, tmp_path):
    from pai_zoo_conformance.cli_runs import run_cli

    _, _, commits = offline_cache
    out = run_cli(["train", "--plan", "--model", REPO, "--revision", "narrow", "--global-batch-size", "4"])
    assert out.returncode == 0, out.stderr
    assert f"snapshots/{commits['narrow']} (llama)" in out.stdout, out.stdout
    yaml = tmp_path / "run.yaml"
    yaml.write_text(f"model: {REPO}\nrevision: {commits['narrow']}\nglobal_batch_size: 4\n")
    out = run_cli(["train", yaml, "--plan"])
    assert out.returncode == 0 and f"snapshots/{commits['narrow']} (llama)" in out.stdout, out.stderr
    out = run_cli(["rl", "dpo", "--model", "tiny-org/absent", "--revision", "v2", "--data", tmp_path / "pairs.jsonl",
                   "--save", tmp_path / "dpo"])
    assert out.returncode == 1 and out.stderr.count("\n") == 1, out.stderr
    assert "tiny-org/absent (revision v2): no such local folder, and not in the Hugging Face cache" in out.stderr
    out = run_cli(["rl", "dpo", "--model", "llama3-tiny", "--revision", "v2", "--data", tmp_path / "pairs.jsonl",
                   "--save", tmp_path / "dpo"])
    assert out.returncode == 1 and "--revision v2: a revision is for a Hugging Face Hub id" in out.stderr, out.stderr


def _mock_hub(repos: dict[str, Path], commit: str):
    """An ``httpx2.MockTransport`` handler answering huggingface_hub's requests as the Hub would for ``repos`` (id ->
    folder, one commit each), and the errors of the ids ``org/gated``, ``org/missing`` and any revision ``nope``."""
    import httpx2

    requested = []

    def error(status, code):
        return httpx2.Response(status, headers={"X-Error-Code": code, "X-Error-Message": code}, json={"error": code})

    def handle(request):
        path = request.url.path
        requested.append((request.method, path))
        if "/org/gated" in path:
            return error(403, "GatedRepo")
        if "/revision/nope" in path or "/resolve/nope/" in path:
            return error(404, "RevisionNotFound")
        repo = next((r for r in repos if f"/{r}/" in path + "/"), None)
        if repo is None:
            return error(404, "RepoNotFound")
        files = sorted(p for p in repos[repo].iterdir() if p.is_file())
        if path.startswith(f"/api/models/{repo}/tree/"):
            entries = [{"type": "file", "path": f.name, "size": f.stat().st_size,
                        "oid": _blob_name(f.read_bytes(), False)} for f in files]
            return httpx2.Response(200, json=entries)
        if path.startswith(f"/api/models/{repo}"):
            return httpx2.Response(200, json={"id": repo, "sha": commit, "siblings": [{"rfilename": f.name}
                                                                                         for f in files]})
        name = path.rsplit("/", 1)[-1]
        data = (repos[repo] / name).read_bytes()
        headers = {"X-Repo-Commit": commit, "ETag": f'"{_blob_name(data, False)}"', "Content-Length": str(len(data))}
        return httpx2.Response(200, headers=headers, content=b"" if request.method == "HEAD" else data)

    return httpx2.MockTransport(handle), requested


@pytest.mark.no_megatron
def test_online_download_through_a_mocked_hub_and_its_errors(hub_cache, tmp_path, monkeypatch, no_network):
    """Online, a model missing from the cache is downloaded (model files only) into huggingface_hub's cache; gated,
    missing and unknown revisions are one line each. The Hub is an httpx2 mock transport: no socket is opened."""
    import httpx2
    import huggingface_hub
    from huggingface_hub import constants
    from huggingface_hub.utils import _http, are_progress_bars_disabled

    from pai_zoo.util.quiet import quiet_run

    folder = tmp_path / "repo"
    shutil.copytree(hub_cache[1]["narrow"], folder)
    (folder / "model.gguf").write_bytes(b"not wanted")  # an export pai-zoo does not read: not downloaded
    commit = "a" * 40
    transport, requested = _mock_hub({"org/online": folder}, commit)
    monkeypatch.setattr(constants, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", False)
    _http.set_client_factory(lambda: httpx2.Client(transport=transport))
    bars = []
    download = huggingface_hub.snapshot_download

    def watched(*args, **kwargs):  # huggingface_hub's progress bars are on while it downloads, in a quiet run too
        bars.append((kwargs.get("local_files_only", False), are_progress_bars_disabled()))
        return download(*args, **kwargs)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", watched)
    try:
        with quiet_run():
            got = pai_zoo.load("org/online", backend="hf")
        assert (False, False) in bars and are_progress_bars_disabled() is False  # on in the download; restored
        snapshot = tmp_path / "cache" / "models--org--online" / "snapshots" / commit
        assert got.checkpoint == snapshot and got.hf_config.hidden_size == 32
        assert not (snapshot / "model.gguf").exists() and (snapshot / "model.safetensors").is_file()
        assert (snapshot / "model.safetensors").is_symlink()  # huggingface_hub's own layout
        requested.clear()
        assert hub.snapshot("org/online") == snapshot and requested == []  # cached now: no request
        for repo, revision, expected in (("org/gated", None, "a gated model on the Hugging Face Hub"),
                                         ("org/missing", None, "no such local folder, and no model org/missing"),
                                         ("org/online", "nope", "no revision 'nope' on the Hugging Face Hub")):
            with pytest.raises(hub.HubError, match=expected) as err:
                hub.snapshot(repo, revision)
            assert "\n" not in str(err.value)
    finally:
        _http.set_client_factory(_http.default_client_factory)
    assert no_network == []


def download_on_a_rank(folder: str, cache: str, commit: str) -> tuple[str, int]:
    """A worker rank resolving ``org/ranks`` from a mocked Hub into ``cache``: its folder and the requests it made."""
    import httpx2
    from huggingface_hub import constants
    from huggingface_hub.utils import _http

    before = constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE
    constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = cache, False
    transport, requested = _mock_hub({"org/ranks": Path(folder)}, commit)
    _http.set_client_factory(lambda: httpx2.Client(transport=transport))
    try:
        return str(hub.snapshot("org/ranks")), len(requested)
    finally:
        _http.set_client_factory(_http.default_client_factory)
        constants.HF_HUB_CACHE, constants.HF_HUB_OFFLINE = before


@pytest.mark.megatron_once
def test_one_process_per_machine_downloads(hub_cache, tmp_path, pai_zoo_workers):
    """Two ranks resolving the same missing id at once: one downloads, the other waits for the lock and then finds
    the snapshot cached, without a request."""
    commit = "b" * 40
    results = pai_zoo_workers.run(download_on_a_rank, str(hub_cache[1]["main"]), str(tmp_path / "cache"), commit)
    assert {path for path, _ in results} == {str(tmp_path / "cache" / "models--org--ranks" / "snapshots" / commit)}
    counts = sorted(count for _, count in results)
    assert counts[0] == 0 and counts[1] > 0, counts
