"""Every ``pai-zoo`` subcommand on bad input: missing files, unknown names, malformed records.

Each case asserts the exit code (1 for a user error, 2 for argparse's usage error), that no traceback
is printed, that the message names the path or name at fault, and that nothing is written to the
output path. Failures happen before any model is built or trained, so the cases are fast.
"""
from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import numpy as np
import pytest

from pai_zoo.cli import main
from pai_zoo.data.indexed import IndexedDatasetWriter

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]  # tests/conftest.py


@pytest.fixture
def files(tmp_path) -> Path:
    """Bad inputs of every kind, and one good dataset ``good``."""
    (tmp_path / "bad.jsonl").write_text('{"text": "fine"}\n{"text": broken\n')
    (tmp_path / "sft_bad.jsonl").write_text(json.dumps({"messages": [{"role": "user", "content": "hi"}]}) + "\n")
    (tmp_path / "prompts_bad.jsonl").write_text('{"prompt": "hi"}\nnot json\n')
    (tmp_path / "pairs_bad.jsonl").write_text('{"prompt": "a", "chosen": "b"}\n')
    (tmp_path / "afile.txt").write_text("a file, not a folder\n")
    (tmp_path / "garbage.idx").write_bytes(b"\x01\x02not an index at all" * 4)
    (tmp_path / "garbage.bin").write_bytes(b"\x00" * 16)
    (tmp_path / "unknown_family").mkdir()
    (tmp_path / "unknown_family" / "config.json").write_text(
        json.dumps({"model_type": "nosuchfamily", "architectures": ["NoSuchForCausalLM"]}))
    (tmp_path / "bad_config").mkdir()
    (tmp_path / "bad_config" / "config.json").write_text("{not json")
    (tmp_path / "bad.yaml").write_text("model: [unclosed\n")
    (tmp_path / "bad_tokenizer").mkdir()
    (tmp_path / "bad_tokenizer" / "tokenizer.json").write_text("{not json")
    (tmp_path / "bad.model").write_bytes(b"not a sentencepiece model")
    (tmp_path / "bad_tracker").mkdir()
    (tmp_path / "bad_tracker" / "latest_checkpointed_iteration.txt").write_text("soon\n")
    with IndexedDatasetWriter(tmp_path / "good", np.int32) as writer:
        writer.add_document([1, 2, 3])
    return tmp_path


def run(argv: list[str], capsys) -> tuple[int, str]:
    """``main(argv)``: its exit code (argparse's too) and stdout + stderr. Any exception escaping is a failure."""
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    return code, out + err


# (argv with {t} for the files folder, exit code, text the message names, output paths that must not appear)
CASES = {
    "list-usage": (["list", "--bogus"], 2, "--bogus", []),
    "info-unknown": (["info", "nosuch"], 1, "unknown model 'nosuch'", []),
    "info-missing-path": (["info", "{t}/missing/model"], 1, "no such file or folder: {t}/missing/model", []),
    "info-usage": (["info"], 2, "name", []),
    "info-not-a-checkpoint": (["info", "{t}"], 1, "{t}: not a checkpoint folder", []),
    "generate-tp-without-torchrun": (["generate", "--model", "llama3-tiny", "--prompt", "hi", "--tp", "2"], 1,
                                     "run: torchrun --nproc-per-node 2 -m pai_zoo.cli generate", []),
    "convert-verify-tolerance": (["convert", "{t}/unknown_family", "{t}/out", "--to", "mcore", "--verify-tolerance",
                                  "x"], 1, "--verify-tolerance 'x'", ["{t}/out"]),
    "conformance-unknown": (["conformance", "nosuch"], 1, "unknown model 'nosuch'", []),
    "convert-missing": (["convert", "{t}/missing", "{t}/out", "--to", "mcore"], 1,
                        "no such file or folder: {t}/missing", ["{t}/out"]),
    "convert-not-a-folder": (["convert", "{t}/afile.txt", "{t}/out", "--to", "mcore"], 1,
                             "{t}/afile.txt: not a folder", ["{t}/out"]),
    "convert-unknown-family": (["convert", "{t}/unknown_family", "{t}/out", "--to", "mcore"], 1,
                               "model_type='nosuchfamily'", ["{t}/out"]),
    "convert-unknown-family-flag": (["convert", "{t}/unknown_family", "{t}/sub/out", "--to", "mcore", "--family",
                                     "nosuch"], 1, "'nosuch'", ["{t}/sub"]),
    "convert-malformed-config": (["convert", "{t}/bad_config", "{t}/out", "--to", "mcore"], 1,
                                 "{t}/bad_config/config.json: invalid JSON at line 1", ["{t}/out"]),
    "convert-not-mcore": (["convert", "{t}/unknown_family", "{t}/out", "--to", "hf"], 1,
                          "{t}/unknown_family: not a Megatron-Core checkpoint", ["{t}/out"]),
    "convert-usage": (["convert", "{t}/unknown_family", "{t}/out", "--to", "onnx"], 2, "onnx", ["{t}/out"]),
    "convert-missing-tokenizer": (["convert", "{t}/unknown_family", "{t}/out", "--to", "hf", "--tokenizer",
                                   "{t}/missing_tok"], 1, "no such file or folder: {t}/missing_tok", ["{t}/out"]),
    "inspect-missing": (["inspect", "{t}/missing"], 1, "no such file or folder: {t}/missing", []),
    "inspect-not-a-checkpoint": (["inspect", "{t}/bad_tokenizer"], 1, "{t}/bad_tokenizer: not a checkpoint folder",
                                 []),
    "inspect-unknown-family": (["inspect", "{t}/unknown_family"], 1, "no installed family handles", []),
    "inspect-bad-tracker": (["inspect", "{t}/bad_tracker"], 1, "latest_checkpointed_iteration.txt: expected", []),
    "inspect-usage": (["inspect"], 2, "checkpoint", []),
    "preprocess-missing": (["preprocess", "--input", "{t}/missing.jsonl", "--output-prefix", "{t}/out",
                            "--tokenizer", "llama3-tiny"], 1, "no such file or folder: {t}/missing.jsonl",
                           ["{t}/out_text_document.bin", "{t}/out_text_document.idx"]),
    "preprocess-bad-line": (["preprocess", "--input", "{t}/bad.jsonl", "--output-prefix", "{t}/out",
                             "--tokenizer", "llama3-tiny"], 1, "{t}/bad.jsonl:2: malformed JSON",
                            ["{t}/out_text_document.bin", "{t}/out_text_document.idx"]),
    "preprocess-folder-input": (["preprocess", "--input", "{t}/unknown_family", "--output-prefix", "{t}/out",
                                 "--tokenizer", "llama3-tiny"], 1, "{t}/unknown_family: is a folder",
                                ["{t}/out_text_document.bin"]),
    "preprocess-unknown-tokenizer": (["preprocess", "--input", "{t}/bad.jsonl", "--output-prefix", "{t}/out",
                                      "--tokenizer", "nosuchtok"], 1, "nosuchtok", ["{t}/out_text_document.bin"]),
    "preprocess-missing-tokenizer": (["preprocess", "--input", "{t}/bad.jsonl", "--output-prefix", "{t}/out",
                                      "--tokenizer", "{t}/no/tokenizer"], 1, "no such file or folder: {t}/no/tokenizer",
                                     ["{t}/out_text_document.bin"]),
    "preprocess-malformed-tokenizer": (["preprocess", "--input", "{t}/bad.jsonl", "--output-prefix", "{t}/out",
                                        "--tokenizer", "{t}/bad_tokenizer"], 1,
                                       "{t}/bad_tokenizer/tokenizer.json is not a valid",
                                       ["{t}/out_text_document.bin"]),
    "preprocess-malformed-sentencepiece": (["preprocess", "--input", "{t}/bad.jsonl", "--output-prefix", "{t}/out",
                                            "--tokenizer", "{t}/bad.model"], 1, "{t}/bad.model is not a valid",
                                           ["{t}/out_text_document.bin"]),
    "preprocess-not-a-tokenizer": (["preprocess", "--input", "{t}/bad.jsonl", "--output-prefix", "{t}/out",
                                    "--tokenizer", "{t}/afile.txt"], 1, "tokenizer format of {t}/afile.txt",
                                   ["{t}/out_text_document.bin"]),
    "preprocess-usage": (["preprocess", "--input", "{t}/bad.jsonl"], 2, "--output-prefix", []),
    "preprocess-sft-bad-record": (["preprocess", "--sft", "--input", "{t}/sft_bad.jsonl", "--output-prefix",
                                   "{t}/out", "--tokenizer", "llama3-tiny"], 1,
                                  "{t}/sft_bad.jsonl:1: no assistant message",
                                  ["{t}/out_text_document.bin", "{t}/out_loss_mask_document.bin"]),
    "preprocess-sft-missing": (["preprocess", "--sft", "--input", "{t}/missing.jsonl", "--output-prefix",
                                "{t}/out", "--tokenizer", "llama3-tiny"], 1,
                               "no such file or folder: {t}/missing.jsonl", ["{t}/out_text_document.bin"]),
    "dataset-inspect-missing": (["dataset", "inspect", "{t}/missing"], 1, "no such file or folder: {t}/missing.idx",
                                []),
    "dataset-inspect-malformed": (["dataset", "inspect", "{t}/garbage"], 1,
                                  "{t}/garbage.idx: not a Megatron MMAP index", []),
    "dataset-inspect-folder": (["dataset", "inspect", "{t}/unknown_family"], 1,
                               "no such file or folder: {t}/unknown_family.idx", []),
    "dataset-inspect-near": (["dataset", "inspect", "{t}/goo"], 1, "hint: datasets (.bin/.idx pairs) in {t}: {t}/good",
                             []),
    "dataset-usage": (["dataset", "nosuch"], 2, "nosuch", []),
    "dataset-merge-missing": (["dataset", "merge", "{t}/good", "{t}/missing", "--output-prefix", "{t}/merged"], 1,
                              "no such file or folder: {t}/missing.idx", ["{t}/merged.bin", "{t}/merged.idx"]),
    "dataset-merge-malformed": (["dataset", "merge", "{t}/good", "{t}/garbage", "--output-prefix", "{t}/merged"], 1,
                                "{t}/garbage.idx: not a Megatron MMAP index", ["{t}/merged.bin", "{t}/merged.idx"]),
    "generate-missing-model": (["generate", "--model", "{t}/nowhere", "--prompt", "hi"], 1,
                               "no such file or folder: {t}/nowhere", []),
    "generate-unknown-model": (["generate", "--model", "nosuch", "--prompt", "hi"], 1, "unknown model 'nosuch'", []),
    "generate-missing-prompts": (["generate", "--model", "llama3-tiny", "--prompts", "{t}/missing.jsonl", "--output",
                                  "{t}/out.jsonl"], 1, "no such file or folder: {t}/missing.jsonl", ["{t}/out.jsonl"]),
    "generate-bad-line": (["generate", "--model", "llama3-tiny", "--prompts", "{t}/prompts_bad.jsonl", "--output",
                           "{t}/out.jsonl"], 1, "{t}/prompts_bad.jsonl:2: malformed JSON", ["{t}/out.jsonl"]),
    "generate-usage": (["generate", "--prompt", "hi"], 2, "--model", []),
    "eval-nothing-to-do": (["eval", "llama3-tiny"], 1, "give --data PREFIX", []),
    "eval-missing-model": (["eval", "{t}/nowhere", "--data", "{t}/good"], 1, "no such file or folder: {t}/nowhere",
                           []),
    "eval-missing-data": (["eval", "llama3-tiny", "--data", "{t}/missing", "--output", "{t}/out.json"], 1,
                          "no such file or folder: {t}/missing.bin", ["{t}/out.json"]),
    "eval-missing-jsonl": (["eval", "llama3-tiny", "--data", "{t}/held_out.jsonl", "--output", "{t}/out.json"], 1,
                           "--data {t}/held_out.jsonl: no such file", ["{t}/out.json"]),
    "eval-bad-split": (["eval", "llama3-tiny", "--data", "{t}/good", "--split", "99,0,1"], 1, "--split 99,0,1", []),
    "eval-usage": (["eval", "--packing", "nosuch"], 2, "nosuch", []),
    "train-missing-config": (["train", "{t}/missing.yaml"], 1, "no such file or folder: {t}/missing.yaml", []),
    "train-malformed-config": (["train", "{t}/bad.yaml"], 1, "{t}/bad.yaml:2: not valid YAML", []),
    "train-unknown-model": (["train", "--model", "nosuch", "--data", "{t}/good", "--save", "{t}/out"], 1,
                            "unknown model 'nosuch'", ["{t}/out"]),
    "train-missing-data": (["train", "--model", "llama3-tiny", "--data", "{t}/missing", "--save", "{t}/out"], 1,
                           "no such file or folder: {t}/missing.bin", ["{t}/out"]),
    "train-data-forms-tried": (["train", "--model", "llama3-tiny", "--data", "{t}/goo", "--save", "{t}/out"], 1,
                               "tried {t}/goo.bin/.idx and {t}/goo_text_document.bin/.idx", ["{t}/out"]),
    "train-sft-pretraining-data": (["train", "--model", "llama3-tiny", "--sft", "--data", "{t}/good", "--save",
                                    "{t}/out"], 1,
                                   "{t}/good.bin/.idx is there but {t}/good_loss_mask_document.bin/.idx is not, so it "
                                   "is not SFT data", ["{t}/out"]),
    "train-usage": (["train", "--nosuch-flag", "1"], 2, "--nosuch-flag", []),
    "rl-list-usage": (["rl", "list", "extra"], 2, "extra", []),
    "rl-unknown-trainer": (["rl", "nosuch"], 2, "invalid choice: 'nosuch'", []),
    "rl-reward-missing-data": (["rl", "reward", "--model", "llama3-tiny", "--data", "{t}/missing.jsonl", "--save",
                                "{t}/out"], 1, "no such file or folder: {t}/missing.jsonl", ["{t}/out"]),
    "rl-reward-bad-record": (["rl", "reward", "--model", "llama3-tiny", "--data", "{t}/pairs_bad.jsonl", "--save",
                              "{t}/out"], 1, "{t}/pairs_bad.jsonl:1", ["{t}/out"]),
    "rl-reward-unknown-model": (["rl", "reward", "--model", "nosuch", "--data", "{t}/pairs_bad.jsonl", "--save",
                                 "{t}/out"], 1, "nosuch", ["{t}/out"]),
    "rl-ppo-missing-prompts": (["rl", "ppo", "--actor", "llama3-tiny", "--reward", "rule:contains=1", "--prompts",
                                "{t}/missing.jsonl", "--save", "{t}/out"], 1,
                               "no such file or folder: {t}/missing.jsonl", ["{t}/out"]),
    "rl-ppo-unknown-actor": (["rl", "ppo", "--actor", "nosuch", "--reward", "rule:contains=1", "--prompts",
                              "{t}/prompts_bad.jsonl", "--save", "{t}/out"], 1, "unknown model 'nosuch'", ["{t}/out"]),
    "rl-ppo-usage": (["rl", "ppo", "--actor", "llama3-tiny"], 2, "--reward", []),
    "plugin-new-unknown-source": (["plugin", "new", "myarch", "--from-config", "nosucharch", "--output", "{t}/out"], 1,
                                  "--from-config nosucharch: not a folder", ["{t}/out"]),
    "plugin-new-claimed": (["plugin", "new", "myarch", "--from-config", "LlamaForCausalLM", "--output", "{t}/out"], 1,
                           "already claimed by family 'llama'", ["{t}/out"]),
    "plugin-new-unknown-like": (["plugin", "new", "myarch", "--from-config", "helium", "--like", "nosuch", "--output",
                                 "{t}/out"], 1, "--like nosuch: no installed family of that name", ["{t}/out"]),
}


@pytest.mark.megatron
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case, files, capsys):
    argv, expected, named, outputs = CASES[case]
    fill = lambda s: s.replace("{t}", str(files))  # noqa: E731
    code, text = run([fill(a) for a in argv], capsys)
    assert code == expected, text
    assert "Traceback" not in text, text
    assert fill(named) in text, text
    if expected == 1:
        lines = [line for line in text.splitlines() if line.startswith("pai-zoo: error: ")]
        assert len(lines) == 1, text
    for output in outputs:
        assert not os.path.exists(fill(output)), output


def test_every_subcommand_is_covered():
    from pai_zoo.cli import COMMANDS

    covered = {argv[0] for argv, *_ in CASES.values()}
    assert covered == set(COMMANDS)
    assert {argv[1] for argv, *_ in CASES.values() if argv[0] in ("dataset", "rl")} >= {"inspect", "merge", "list",
                                                                                      "reward", "ppo"}
    assert any("--sft" in argv for argv, *_ in CASES.values())


def test_debug_shows_the_traceback(tmp_path, capsys):
    code, text = run(["--debug", "dataset", "inspect", tmp_path / "missing"], capsys)
    assert code == 1 and "Traceback" in text and f"no such file or folder: {tmp_path / 'missing.idx'}" in text


@pytest.mark.parametrize("argv", [["dataset", "inspect", "MISSING"], ["dataset", "merge", "MISSING", "MISSING2",
                                                                      "--output-prefix", "OUT"]])
def test_console_script_prints_one_line_and_a_hint(argv, tmp_path, pai_zoo_script):
    argv = [str(tmp_path / a) if a.isupper() else a for a in argv]
    proc = subprocess.run([pai_zoo_script, *argv], capture_output=True, text=True, timeout=300)
    assert proc.returncode == 1 and "Traceback" not in proc.stderr + proc.stdout
    hint = "hint: give the PREFIX that pai-zoo preprocess wrote (PREFIX.bin and PREFIX.idx)"
    tried = f"{tmp_path / 'MISSING'}.bin/.idx and {tmp_path / 'MISSING_text_document'}.bin/.idx"
    assert proc.stderr.splitlines() == [f"pai-zoo: error: no such file or folder: {tmp_path / 'MISSING.idx'} "
                                        f"(dataset {tmp_path / 'MISSING'}: tried {tried})", hint]
    assert not list(tmp_path.iterdir())
