"""``inspect`` of a Megatron-Core ``torch_dist`` checkpoint answers without torch or megatron-core (issue 44, item 3:
under 2 s): :mod:`pai_zoo.models.inspection_fast` reads ``pai_zoo.json`` or Megatron-LM's args and the
``.metadata``'s tensor shapes. Its report must be the slow path's, line for line (the slow path builds the model's
layout with megatron-core on the meta device): a dense model with tied and untied embeddings, mixtures of experts,
multi-token-prediction layers with experts, a vision-language model, a training run's ``iter_N`` with optimizer
state, and Megatron-LM's folders (``tests/megatron_lm_writer.py``'s: ``torch_dist`` with ``common.pt`` or the common
state inside the metadata, legacy ``torch`` with random and optimizer state or two pipeline stages; and the real ones
in ``../shared/megatron-lm-fixtures``). A legacy folder of two tensor-parallel ranks still takes the slow path."""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from pai_zoo.cli import main
from pai_zoo.models import inspection_fast

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.megatron]  # the slow path builds the layout

PRESETS = ("llama3-tiny", "gemma-tiny", "qwen3-moe-tiny", "qwen2-vl-tiny")
FIXTURES = Path(__file__).resolve().parents[2] / "shared" / "megatron-lm-fixtures"
#: name -> (checkpoint, --tokenizer): pai-zoo's (PRESETS, MTP, a run) and Megatron-LM's
CASES = {**{p: (p, None) for p in PRESETS}, "glm4-moe-mtp": ("glm4-moe-mtp", None), "run": ("run", None),
         "lm-dense": ("lm-dense", None), "lm-moe-common-in-metadata": ("lm-moe", None),
         "lm-moe-with-reference": ("lm-moe", "qwen3-moe-tiny"), "lm-real": ("lm-real", None),
         "lm-real-with-tokenizer": ("lm-real", "lm-real-hf"), "lm-legacy": ("lm-legacy", None),
         "lm-legacy-moe-pp2": ("lm-legacy-moe-pp2", "qwen3-moe-tiny"), "lm-legacy-real": ("lm-legacy-real", None),
         "lm-legacy-real-with-tokenizer": ("lm-legacy-real", "lm-real-hf")}


def _mtp_folder(folder: Path) -> None:
    """glm4-moe with one MTP layer (its decoder layer a copy of the last one, with experts) in bf16."""
    import torch
    from safetensors.torch import load_file, save_file

    import pai_zoo

    handle = pai_zoo.load("glm4-moe-odd", backend="hf", seed=0, num_nextn_predict_layers=1)
    handle.model.to(torch.bfloat16).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    state = load_file(folder / "model.safetensors")
    n, hidden = config["num_hidden_layers"], config["hidden_size"]
    last, mtp = f"model.layers.{n - 1}.", f"model.layers.{n}."
    state.update({mtp + k[len(last):]: v.clone() for k, v in state.items() if k.startswith(last)})
    for name in ("enorm.weight", "hnorm.weight", "shared_head.norm.weight"):
        state[mtp + name] = torch.ones(hidden, dtype=torch.bfloat16)
    state[mtp + "eh_proj.weight"] = torch.zeros(hidden, 2 * hidden, dtype=torch.bfloat16)
    state[mtp + "embed_tokens.weight"] = state["model.embed_tokens.weight"].clone()
    state[mtp + "shared_head.head.weight"] = state["lm_head.weight"].clone()
    save_file({k: v.contiguous() for k, v in state.items()}, str(folder / "model.safetensors"),
              metadata={"format": "pt"})


@pytest.fixture(scope="module")
def checkpoints(tmp_path_factory) -> dict[str, Path]:
    """The tiny presets (llama3-tiny with its test tokenizer) and glm4-moe with MTP, converted; a training run."""
    import megatron_lm_writer as mlw  # registered by conftest.py

    import pai_zoo
    from pai_zoo.conversion.entry import convert
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess
    from pai_zoo.tokenizers.names import bundled_tokenizer_folder
    from pai_zoo_conformance.cli_runs import run_cli

    root = tmp_path_factory.mktemp("inspect-fast")
    out = {}
    for preset in PRESETS:
        handle = pai_zoo.load(preset, backend="hf", seed=0)
        handle.model.save_pretrained(root / preset)
        if preset == "llama3-tiny":
            for file in bundled_tokenizer_folder(handle.family, "test").iterdir():
                shutil.copy(file, root / preset)
        convert(root / preset, root / f"{preset}-mcore", "mcore")
        out[preset] = root / f"{preset}-mcore"
        out[f"{preset}-hf"] = root / preset
        if preset in ("llama3-tiny", "qwen3-moe-tiny"):  # the same model as Megatron-LM writes it
            name = "lm-dense" if preset == "llama3-tiny" else "lm-moe"
            overrides = {"layernorm_epsilon": handle.config.rms_norm_eps}  # rotary_base: Megatron-LM's default (a note)
            mlw.write_torch_dist(handle.model, handle.config, root / name, tp=1 if name == "lm-dense" else 2,
                                 common_in_metadata=name == "lm-moe", args_overrides=overrides)
            out[name] = root / name
            if name == "lm-dense":  # legacy: random and optimizer state; two tensor-parallel ranks
                mlw.write_legacy(handle.model, handle.config, root / "lm-legacy", with_optimizer=True,
                                 args_overrides=overrides)
                mlw.write_legacy(handle.model, handle.config, root / "lm-legacy-tp2", tp=2, args_overrides=overrides)
                out["lm-legacy"], out["lm-legacy-tp2"] = root / "lm-legacy", root / "lm-legacy-tp2"
            else:  # two pipeline stages, the legacy GroupedMLP and Transformer Engine's names
                mlw.write_legacy(handle.model, handle.config, root / "lm-legacy-moe-pp2", pp=2, experts="grouped",
                                 te_names=True, args_overrides=overrides)
                out["lm-legacy-moe-pp2"] = root / "lm-legacy-moe-pp2"
    _mtp_folder(root / "glm4-moe-mtp")
    convert(root / "glm4-moe-mtp", root / "glm4-moe-mtp-mcore", "mcore")
    out["glm4-moe-mtp"] = root / "glm4-moe-mtp-mcore"
    # a training run: two steps of llama3-tiny on a toy corpus, saved with its optimizer state at iter_0000002
    toy.write_tokenizer(root / "run-hf", vocab_size=300)
    pai_zoo.load("llama3-tiny", backend="hf", seed=3, vocab_size=300).model.save_pretrained(root / "run-hf")
    preprocess([toy.write_corpus(root / "corpus.jsonl", documents=20)], root / "toy", str(root / "run-hf"),
               append_eod=True, progress=False)
    proc = run_cli(["train", "--model", root / "run-hf", "--data", root / "toy_text_document", "--save", root / "run",
                    "--global-batch-size", "1", "--batch-size", "1", "--seq-length", "16", "--train-tokens", "32",
                    "--warmup-tokens", "16", "--lr", "1e-3", "--save-interval", "2", "--no-progress"])
    assert proc.returncode == 0, proc.stderr[-3000:]
    out["run"] = root / "run"
    if FIXTURES.is_dir():
        out["lm-real"], out["lm-real-hf"] = FIXTURES / "llama-dist-tp2", FIXTURES / "llama-hf"
        out["lm-legacy-real"], out["lm-legacy-real-tp2"] = FIXTURES / "llama-legacy-tp1", FIXTURES / "llama-legacy-tp2"
    return out


def _inspect(path, capsys, *extra) -> str:
    code = main(["inspect", str(path), *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return out


@pytest.mark.parametrize("name", list(CASES))
def test_the_fast_report_is_the_slow_one(checkpoints, name, capsys, monkeypatch):
    from pai_zoo.formats import detect
    from pai_zoo.models.inspection import _megatron

    folder, reference = CASES[name]
    if folder not in checkpoints:
        pytest.skip(f"{FIXTURES} is absent: the real Megatron-LM checkpoints are not on this machine")
    path = checkpoints[folder]
    tokenizer = checkpoints[reference] if reference else None
    kind = detect(path)
    fast = inspection_fast.fast_megatron(path, kind, None, tokenizer, None)
    assert fast is not None, f"{name}: the fast path fell back"
    slow = _megatron(path, None, tokenizer, None)
    assert fast[0].lines() == slow[0].lines()
    assert fast[1] == slow[1]  # the tokenizer the report checks
    extra = ["--tokenizer", str(tokenizer)] if tokenizer else []
    quick = _inspect(path, capsys, *extra)
    monkeypatch.setattr(inspection_fast, "fast_megatron", lambda *args: None)
    assert quick == _inspect(path, capsys, *extra)  # through the CLI: the files and tokenizer lines too
    lines = quick.splitlines()
    if name == "glm4-moe-mtp":
        assert any(x.startswith("MTP layers:   1 (mtp.layers.*: ") for x in lines), quick
    if name == "qwen2-vl-tiny":
        assert any(x.startswith("vision:       ") for x in lines), quick
    if name == "run":
        assert kind == "run" and any(x.startswith("files:") for x in lines), quick
    if name in ("llama3-tiny", "lm-real-with-tokenizer", "lm-legacy-real-with-tokenizer"):
        assert any(x.startswith("tokenizer:    ") and "fits the model" in x for x in lines), quick
    if name.startswith("lm-"):
        assert "(written by Megatron-LM: no pai_zoo.json, read from its args)" in quick, quick


def test_what_the_fast_path_cannot_answer_goes_the_slow_way(checkpoints, capsys, monkeypatch):
    from pai_zoo.formats import detect

    for name in ("lm-legacy-tp2", "lm-legacy-real-tp2"):  # only the layout tells a shard from a copy
        if name not in checkpoints:
            continue
        legacy = checkpoints[name]
        assert inspection_fast.fast_megatron(legacy, detect(legacy), None, None, None) is None
        assert "format:       torch (written by Megatron-LM" in _inspect(legacy, capsys)
    # --iteration of a pai-zoo folder: read from its args, as Megatron-LM's
    path = checkpoints["llama3-tiny"]
    fast = inspection_fast.fast_megatron(path, "mcore", None, None, "release")
    assert fast is not None and fast[0].format.startswith("torch_dist (written by Megatron-LM")
    quick = _inspect(path, capsys, "--iteration", "release")
    monkeypatch.setattr(inspection_fast, "fast_megatron", lambda *args: None)
    assert quick == _inspect(path, capsys, "--iteration", "release")


def test_inspect_of_a_torch_dist_checkpoint_imports_neither_torch_nor_megatron(checkpoints, tmp_path):
    damaged = Path(shutil.copytree(checkpoints["qwen3-moe-tiny"], tmp_path / "damaged"))
    data = next((damaged / "release").glob("*.distcp"))
    with open(data, "r+b") as f:
        f.truncate(100)
    child = ("import contextlib, io, json, sys\nfrom pai_zoo.cli import main\nseen = []\n"
             "for path in sys.argv[1:]:\n"
             "    with contextlib.redirect_stdout(io.StringIO()) as out, \\\n"
             "            contextlib.redirect_stderr(io.StringIO()) as err:\n"
             "        code = main(['inspect', path])\n"
             "    seen.append([code, out.getvalue(), err.getvalue()])\n"
             "heavy = sorted({m.split('.')[0] for m in sys.modules} & {'torch', 'megatron', 'transformers'})\n"
             "print(json.dumps([seen, heavy]))\n")
    paths = [checkpoints["glm4-moe-mtp"], checkpoints["qwen2-vl-tiny"], checkpoints["run"], checkpoints["lm-moe"],
             checkpoints["lm-legacy"], damaged]
    proc = subprocess.run([sys.executable, "-c", child, *map(str, paths)], capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 0, proc.stderr
    seen, heavy = json.loads(proc.stdout.splitlines()[-1])
    assert heavy == [], heavy
    for (code, out, err), path in zip(seen[:5], paths):
        assert code == 0 and out.startswith(f"checkpoint:   {path}\n") and "parameters:   " in out, (code, err)
    code, out, err = seen[5]
    assert code == 1 and out == "" and err.startswith(f"pai-zoo: error: {data}: truncated: 100 bytes"), err
