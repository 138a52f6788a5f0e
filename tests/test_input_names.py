"""Names that come from input stay inside their folder, and messages name the right thing.

* ``preprocess --json-keys``: a key names an output file (``PREFIX_{key}_document.bin``); one with a path separator,
  ``..``, a NUL or nothing is refused in one line naming the flag and the value, before anything is written.
* image paths in vision SFT records (``train --sft`` on a JSONL, ``dataset prepare``): an absolute path, ``..`` or a
  symbolic link leading out of the data file's folder is refused with ``file:line`` and the field.
* an ``.idx`` without its ``.bin`` names the missing ``.bin`` (``dataset inspect``, ``eval --data``,
  ``train --data``); a JSON error gives Python's whole message and the column.
"""
from __future__ import annotations

import json
import os
from pathlib import Path

import numpy as np
import pytest

from pai_zoo.cli import main
from pai_zoo.data.indexed import IndexedDatasetWriter
from pai_zoo.plugin.errors import DataError, SettingError

pytestmark = [pytest.mark.usefixtures("fresh_registry")]
no_megatron = pytest.mark.no_megatron


def run(argv, capsys) -> tuple[int, str]:
    try:
        code = main([str(a) for a in argv])
    except SystemExit as exc:
        code = exc.code
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, err


def _tree(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*"))


# -- --json-keys ---------------------------------------------------------------------------------------------------
@no_megatron
@pytest.mark.parametrize("key, why", [
    ("../../../PT", "holds a path separator"), ("/abs/PT", "holds a path separator"),
    ("a\\b", "holds a path separator"), ("..", "holds '..'"), ("", "is empty"), ("a\0b", "holds a NUL character"),
])
def test_json_keys_must_be_plain_names(key, why, tmp_path, capsys):
    (tmp_path / "in").mkdir()
    (tmp_path / "in" / "c.jsonl").write_text(json.dumps({"text": "hi", key: "x"}) + "\n")
    out = tmp_path / "deep" / "er" / "out"
    out.parent.mkdir(parents=True)
    before = _tree(tmp_path)
    if "\0" in key:  # argv cannot hold a NUL: the library call
        from pai_zoo.data.preprocess import preprocess

        with pytest.raises(SettingError, match=r"--json-keys 'a\\x00b': holds a NUL character; "):
            preprocess([tmp_path / "in" / "c.jsonl"], out, "llama3-tiny", json_keys=[key])
    else:
        code, err = run(["preprocess", "--input", tmp_path / "in" / "c.jsonl", "--output-prefix", out,
                         "--tokenizer", "llama3-tiny", "--json-keys", "text", key], capsys)
        assert code == 1
        assert err.strip() == (f"pai-zoo: error: --json-keys {key!r}: {why}; a key names the output file "
                               "PREFIX_{key}_document.bin inside the --output-prefix folder, so it must be a plain "
                               "name (no '/', '\\', '..' or NUL)")
    assert _tree(tmp_path) == before  # nothing written, inside or outside the folder


@no_megatron
def test_json_keys_plain_names_still_work(tmp_path, capsys):
    (tmp_path / "c.jsonl").write_text(json.dumps({"text": "hi", "my.key-2": "there"}) + "\n")
    code, err = run(["preprocess", "--input", tmp_path / "c.jsonl", "--output-prefix", tmp_path / "o",
                     "--tokenizer", "llama3-tiny", "--json-keys", "text", "my.key-2"], capsys)
    assert code == 0, err
    assert (tmp_path / "o_my.key-2_document.bin").is_file() and (tmp_path / "o_text_document.idx").is_file()


# -- image paths in vision records -----------------------------------------------------------------------------
def _png(path: Path) -> Path:
    from PIL import Image

    Image.new("RGB", (4, 4), (255, 0, 0)).save(path)
    return path


def _chat(image) -> dict:
    return {"messages": [{"role": "user", "content": [{"type": "image", "image": image},
                                                      {"type": "text", "text": "What is it?"}]},
                         {"role": "assistant", "content": "Red."}]}


@pytest.fixture
def vision_folder(tmp_path) -> Path:
    """``data/`` with an image inside and a link leading out to ``secret.png`` beside it."""
    data = tmp_path / "data"
    data.mkdir()
    _png(data / "ok.png")
    _png(tmp_path / "secret.png")
    os.symlink(tmp_path / "secret.png", data / "link.png")
    (data / "sub").mkdir()
    _png(data / "sub" / "in.png")
    os.symlink(data / "sub" / "in.png", data / "inner_link.png")  # a link that stays inside is fine
    return data


@no_megatron
@pytest.mark.parametrize("record, field, why", [
    (_chat("{secret}"), "messages[0].content[0].image", "is absolute"),
    (_chat("../secret.png"), "messages[0].content[0].image", "holds '..'"),
    (_chat("sub/../../secret.png"), "messages[0].content[0].image", "holds '..'"),
    (_chat("link.png"), "messages[0].content[0].image", "resolves outside the folder (a symbolic link)"),
    ({"image": "../secret.png", "conversations": [{"from": "human", "value": "<image>\nx"},
                                                  {"from": "gpt", "value": "y"}]}, "image", "holds '..'"),
    ({"images": ["ok.png", "link.png"], "conversations": [{"from": "human", "value": "<image><image>x"},
                                                          {"from": "gpt", "value": "y"}]}, "images[1]",
     "resolves outside the folder (a symbolic link)"),
])
def test_image_paths_stay_in_the_data_folder(record, field, why, vision_folder):
    from pai_zoo.data.vision_sft import read_vision_records

    secret = str(vision_folder.parent / "secret.png")
    text = json.dumps(record).replace("{secret}", secret)
    data = vision_folder / "chats.jsonl"
    data.write_text(json.dumps(_chat("ok.png")) + "\n" + text + "\n")
    given = json.loads(text)
    value = (given.get("images") or [given.get("image")])[-1] if "conversations" in given else \
        given["messages"][0]["content"][0]["image"]
    with pytest.raises(DataError) as caught:
        read_vision_records(data)
    assert str(caught.value) == (f"{data}:2: {field} {value!r} {why}; image paths are relative to the data file's "
                                 f"folder {vision_folder} and stay inside it")


@no_megatron
def test_image_paths_inside_the_folder_are_read(vision_folder):
    from pai_zoo.data.vision_sft import read_vision_records

    data = vision_folder / "chats.jsonl"
    data.write_text("".join(json.dumps(_chat(p)) + "\n" for p in ("ok.png", "sub/in.png", "inner_link.png")))
    images = [images for _, _, images in read_vision_records(data)]
    assert images == [[str(vision_folder / "ok.png")], [str(vision_folder / "sub" / "in.png")],
                      [str(vision_folder / "inner_link.png")]]


def test_dataset_prepare_refuses_an_image_outside(vision_folder, capsys):
    data = vision_folder / "chats.jsonl"
    data.write_text(json.dumps(_chat("ok.png")) + "\n" + json.dumps(_chat("../secret.png")) + "\n")
    code, err = run(["dataset", "prepare", data, "--output", vision_folder.parent / "shards"], capsys)
    assert code == 1
    assert err.strip() == (f"pai-zoo: error: {data}:2: messages[0].content[0].image '../secret.png' holds '..'; "
                           f"image paths are relative to the data file's folder {vision_folder} and stay inside it")
    assert not (vision_folder.parent / "shards").exists()


# -- an .idx without its .bin ----------------------------------------------------------------------------------
@pytest.fixture
def half_pair(tmp_path) -> Path:
    """``d/corpus_text_document.idx`` whose ``.bin`` is gone."""
    (tmp_path / "d").mkdir()
    with IndexedDatasetWriter(tmp_path / "d" / "corpus_text_document", np.int32) as writer:
        writer.add_document([1, 2, 3])
    (tmp_path / "d" / "corpus_text_document.bin").unlink()
    return tmp_path / "d"


@no_megatron
@pytest.mark.parametrize("argv", [
    ["dataset", "inspect", "{p}"],
    ["dataset", "inspect", "{p}_text_document"],
    ["eval", "llama3-tiny", "--backend", "hf", "--data", "{p}"],
    ["train", "--model", "llama3-tiny", "--data", "{p}", "--save", "{d}/run", "--train-iters", "1"],
], ids=["inspect", "inspect-full-name", "eval", "train"])
def test_idx_without_bin_names_the_bin(argv, half_pair, capsys):
    prefix = half_pair / "corpus"
    code, err = run([a.format(p=prefix, d=half_pair) for a in argv], capsys)
    assert code == 1
    first = err.strip().splitlines()[0]
    assert first.startswith(f"pai-zoo: error: no such file or folder: {prefix}_text_document.bin ("), first
    assert not (half_pair / "run").exists()


# -- JSON errors in full ---------------------------------------------------------------------------------------
@no_megatron
def test_json_error_is_whole(tmp_path, capsys):
    """Python's msg for a raw control character ends "... at": the message goes on with the column and the
    character found there."""
    (tmp_path / "c.jsonl").write_text('{"text": "fine"}\n{"text": "split\tline"}\n')  # a raw tab
    code, err = run(["preprocess", "--input", tmp_path / "c.jsonl", "--output-prefix", tmp_path / "o",
                     "--tokenizer", "llama3-tiny"], capsys)
    assert code == 1
    assert err.strip() == (f"pai-zoo: error: {tmp_path}/c.jsonl:2: malformed JSON: Invalid control character at "
                           "column 16 (found '\\t')")
    (tmp_path / "d.jsonl").write_text('{"text": "fine",}\n')
    code, err = run(["preprocess", "--input", tmp_path / "d.jsonl", "--output-prefix", tmp_path / "o",
                     "--tokenizer", "llama3-tiny"], capsys)
    assert err.strip() == (f"pai-zoo: error: {tmp_path}/d.jsonl:1: malformed JSON: Expecting property name enclosed "
                           "in double quotes at column 17 (found '}')")


@no_megatron
def test_tokenizer_config_json_error_is_whole(tmp_path):
    from pai_zoo.plugin.errors import TokenizerError
    from pai_zoo.tokenizers.config import read_tokenizer_config

    (tmp_path / "tokenizer_config.json").write_text('{\n  "eos_token": "</s>"\n  "bos_token": "<s>"\n}')
    with pytest.raises(TokenizerError) as caught:
        read_tokenizer_config(tmp_path)
    assert str(caught.value) == (f"{tmp_path}/tokenizer_config.json: malformed JSON: Expecting ',' delimiter at "
                                 "line 3 column 3 (found '\"')")


@no_megatron
def test_sft_loss_mask_idx_without_bin_names_the_bin(tmp_path):
    """train --sft --data: a loss-mask .idx whose .bin is gone is named, not called 'not SFT data'."""
    from pai_zoo.data.prefix import resolve_sft_prefix
    from pai_zoo.plugin.errors import NoSuchPathError

    for name in ("x_text_document", "x_loss_mask_document"):
        with IndexedDatasetWriter(tmp_path / name, np.int32) as writer:
            writer.add_document([1, 2, 3])
    (tmp_path / "x_loss_mask_document.bin").unlink()
    with pytest.raises(NoSuchPathError) as caught:
        resolve_sft_prefix(tmp_path / "x")
    assert str(caught.value).startswith(f"no such file or folder: {tmp_path}/x_loss_mask_document.bin (--data ")


@no_megatron
def test_json_errors_elsewhere_are_whole(tmp_path, capsys):
    """A config.json (convert, info ...) and a --prompts file (generate) with a raw control character: the message
    says what was found, never ends with Python's dangling "... at"."""
    (tmp_path / "m").mkdir()
    (tmp_path / "m" / "config.json").write_text('{"model_type": "lla\tma"}')
    code, err = run(["info", tmp_path / "m"], capsys)
    assert code == 1
    assert err.strip() == (f"pai-zoo: error: {tmp_path}/m/config.json: invalid JSON at line 1 column 20: Invalid "
                           "control character (found '\\t')")
    (tmp_path / "p.jsonl").write_text('{"prompt": "a\tb"}\n')
    code, err = run(["generate", "--model", "llama3-tiny", "--prompts", tmp_path / "p.jsonl", "--max-new-tokens", "1",
                     "--output", tmp_path / "o.jsonl"], capsys)
    assert code == 1
    assert err.strip() == (f"pai-zoo: error: {tmp_path}/p.jsonl:1: malformed JSON: Invalid control character "
                           "(found '\\t') at column 14")


@no_megatron
@pytest.mark.parametrize("record, field, why", [
    ({"prompt": "which color?", "images": ["/etc/hostname"]}, "images[0]", "is absolute"),
    ({"prompt": "which color?", "images": ["ok.png", "../secret.png"]}, "images[1]", "holds '..'"),
    ({"prompt": [{"role": "user", "content": [{"type": "image", "image": "../../x.png"}]}]}, "image", "holds '..'"),
])
def test_generate_prompt_images_stay_in_the_prompts_folder(record, field, why, tmp_path, capsys):
    """generate --prompts: a record's image paths are read inside the prompts file's folder, checked before the
    model loads (an unknown model would be named otherwise)."""
    (tmp_path / "prompts.jsonl").write_text(json.dumps({"prompt": "hi"}) + "\n" + json.dumps(record) + "\n")
    code = main(["generate", "--model", "llama3-tiny", "--prompts", tmp_path / "prompts.jsonl", "--output",
                 tmp_path / "out.jsonl", "--chat"])
    err = capsys.readouterr().err
    assert code == 1 and "Traceback" not in err
    assert f"{tmp_path / 'prompts.jsonl'}:2: {field} " in err and why in err, err
    assert not (tmp_path / "out.jsonl").exists()
