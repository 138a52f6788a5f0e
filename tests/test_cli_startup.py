"""Start-up: ``pai-zoo --help``, ``list``, ``info NAME``, ``inspect`` of a Hugging Face folder and a flag error import
neither torch nor megatron-core nor transformers (issue 44: each answers in under 2 s; bench/startup_bench.py times
them). One fresh interpreter runs every case through the CLI's own ``main()`` and reports what each imported."""
from __future__ import annotations

import json
import subprocess
import sys

import pytest

from pai_zoo.families.registry import get_registry
from pai_zoo.hf.config_cache import full_config_dict

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]

HEAVY = ("torch", "megatron.core", "transformers")

#: the child: run each command line through main() in order, and after each, the heavy modules imported so far
CHILD = """
import contextlib, io, json, sys
from pai_zoo.cli import main
heavy, seen = {heavy!r}, {{}}
for argv in json.loads(sys.argv[1]):
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()) as err:
        try:
            code = main(argv)
        except SystemExit as exc:
            code = exc.code
    seen[" ".join(argv[:2])] = [code, [m for m in heavy if m in sys.modules], err.getvalue()[-300:]]
print(json.dumps(seen))
"""


def test_help_list_info_inspect_and_flag_errors_import_nothing_heavy(tmp_path, monkeypatch):
    monkeypatch.setenv("PAI_ZOO_CACHE", str(tmp_path / "cache"))
    family = get_registry().family("llama")
    # what a first `info llama` and `inspect` of the folder leave in the cache: the configs with transformers' defaults
    full_config = full_config_dict(family, family.presets[family.tiny])
    folder = tmp_path / "hf"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps(family.presets[family.tiny]))
    _safetensors(folder / "model.safetensors", full_config)
    full_config_dict(family, json.loads((folder / "config.json").read_text()))
    runs = [["--help"], ["list"], ["info", "llama"],
            ["generate", "--model", "llama3-tiny", "--prompt", "hi", "--temperature", "-1"],
            ["train", "--model", "llama3-tiny", "--data", str(tmp_path / "d"), "--save", str(tmp_path / "r"), "--lr",
             "-1"],
            ["eval", "llama3-tiny", "--data", str(tmp_path / "d"), "--seq-length", "0"],
            ["convert", str(folder), str(tmp_path / "o"), "--to", "mcore", "--max-shard-size", "-5"],
            ["preprocess", "--input", "x.jsonl", "--output-prefix", str(tmp_path / "p"), "--tokenizer", "llama3-tiny",
             "--workers", "0"],
            ["rl", "reward", "--model", "llama3-tiny", "--data", "x", "--save", str(tmp_path / "r"), "--seed", "-1"],
            ["inspect", str(folder)]]  # last: what a case imports stays imported for the cases after it
    proc = subprocess.run([sys.executable, "-c", CHILD.format(heavy=HEAVY), json.dumps(runs)],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr
    seen = json.loads(proc.stdout.splitlines()[-1])
    expected = {"--help": 0, "list": 0, "info llama": 0, "inspect " + str(folder): 0}
    for name, (code, heavy, err) in seen.items():
        assert code == expected.get(name, 1), (name, err)
        assert heavy == [], f"{name} imported {heavy}"
    assert not (tmp_path / "r").exists() and not (tmp_path / "o").exists()


def _safetensors(path, config: dict) -> None:
    """A safetensors file of the right names and shapes for a tiny Llama (zeros), written without torch."""
    h, inter, layers = config["hidden_size"], config["intermediate_size"], config["num_hidden_layers"]
    heads, kv, vocab = config["num_attention_heads"], config["num_key_value_heads"], config["vocab_size"]
    dim = config.get("head_dim") or h // heads
    shapes = {"model.embed_tokens.weight": [vocab, h], "model.norm.weight": [h]}
    if not config.get("tie_word_embeddings"):
        shapes["lm_head.weight"] = [vocab, h]
    for i in range(layers):
        p = f"model.layers.{i}."
        shapes |= {p + "input_layernorm.weight": [h], p + "post_attention_layernorm.weight": [h],
                   p + "self_attn.q_proj.weight": [heads * dim, h], p + "self_attn.k_proj.weight": [kv * dim, h],
                   p + "self_attn.v_proj.weight": [kv * dim, h], p + "self_attn.o_proj.weight": [h, heads * dim],
                   p + "mlp.gate_proj.weight": [inter, h], p + "mlp.up_proj.weight": [inter, h],
                   p + "mlp.down_proj.weight": [h, inter]}
    header, offset = {}, 0
    for name, shape in shapes.items():
        size = 4
        for n in shape:
            size *= n
        header[name] = {"dtype": "F32", "shape": shape, "data_offsets": [offset, offset + size]}
        offset += size
    raw = json.dumps(header).encode()
    raw += b" " * (-len(raw) % 8)
    path.write_bytes(len(raw).to_bytes(8, "little") + raw + bytes(offset))
