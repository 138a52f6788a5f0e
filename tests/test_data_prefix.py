"""One data-prefix rule (pai_zoo.data.prefix): ``PREFIX`` or ``PREFIX_text_document`` everywhere a dataset is
read (``train --data``, ``train --sft --data``, ``dataset inspect``/``merge``), and errors that list the pairs there."""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from pai_zoo.data.indexed import IndexedDatasetWriter
from pai_zoo.data.prefix import resolve_prefix, resolve_sft_prefix
from pai_zoo.plugin.errors import DataError, NoSuchPathError
from pai_zoo.training.config import TrainConfig
from pai_zoo.training.data import check_data, resolved_prefixes
from pai_zoo_conformance.cli_runs import main_result as _cli

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]  # tests/conftest.py


def _write(prefix: Path, documents=([1, 2, 3], [4, 5])) -> Path:
    with IndexedDatasetWriter(prefix, np.int32, {}) as writer:
        for doc in documents:
            writer.add_document(doc)
    return prefix


@pytest.fixture
def data(tmp_path) -> Path:
    """``austen_text_document`` (pretraining), ``chat_text_document`` + ``chat_loss_mask_document`` (SFT)."""
    _write(tmp_path / "austen_text_document")
    _write(tmp_path / "chat_text_document", [[1, 2, 3, 4]])
    _write(tmp_path / "chat_loss_mask_document", [[0, 0, 1, 1]])
    return tmp_path


@pytest.mark.parametrize("given", ["austen", "austen_text_document", "austen_text_document.bin",
                                   "austen_text_document.idx", "austen.idx"])
def test_either_form_names_the_pretraining_dataset(data, given):
    assert resolve_prefix(data / given) == data / "austen_text_document"


def test_a_prefix_that_exists_as_given_wins(data):
    _write(data / "austen")
    assert resolve_prefix(data / "austen") == data / "austen"


@pytest.mark.parametrize("given", ["chat", "chat_text_document", "chat_loss_mask_document", "chat_text_document.idx"])
def test_every_form_names_the_sft_dataset(data, given):
    assert resolve_sft_prefix(data / given) == data / "chat"


def test_missing_dataset_names_the_forms_tried_and_the_pairs_nearby(data):
    with pytest.raises(NoSuchPathError) as info:
        resolve_prefix(data / "aust", what="--data", first=".bin")
    message = str(info.value)
    assert message.startswith(f"no such file or folder: {data / 'aust.bin'} (--data {data / 'aust'}: tried ")
    assert f"{data / 'aust'}.bin/.idx and {data / 'aust_text_document'}.bin/.idx" in message
    # names starting alike come first; the others are left out when there are such
    assert info.value.hint == (f"datasets (.bin/.idx pairs) in {data}: {data / 'austen_text_document'}; give one of "
                               "them as --data (PREFIX or PREFIX_text_document)")


def test_missing_dataset_without_a_name_alike_lists_every_pair_there(data):
    with pytest.raises(NoSuchPathError) as info:
        resolve_prefix(data / "zzz")
    for name in ("austen_text_document", "chat_loss_mask_document", "chat_text_document"):
        assert str(data / name) in info.value.hint


def test_a_folder_lists_the_pairs_inside_it(data):
    with pytest.raises(NoSuchPathError) as info:
        resolve_prefix(data)
    assert str(data / "austen_text_document") in info.value.hint


def test_half_a_pair_names_the_missing_file(data):
    (data / "half.bin").write_bytes(b"")
    with pytest.raises(NoSuchPathError, match=r"no such file or folder: .*half\.idx"):
        resolve_prefix(data / "half", first=".bin")


def test_pretraining_data_given_as_sft_says_it_is_not_sft_data(data):
    with pytest.raises(DataError, match=r"austen_text_document\.bin/\.idx is there but .*austen_loss_mask_document"
                                        r"\.bin/\.idx is not, so it is not SFT data"):
        resolve_sft_prefix(data / "austen")


def test_train_check_data_accepts_both_forms(data):
    for given in ("austen", "austen_text_document"):
        check_data(TrainConfig(model="m", data=[str(data / given)], save="out"))
    for given in ("chat", "chat_text_document"):
        check_data(TrainConfig(model="m", data=[str(data / given)], save="out", sft=True))
    assert resolved_prefixes(["0.5", str(data / "austen"), "0.5", str(data / "chat")][1::2]) == [
        str(data / "austen_text_document"), str(data / "chat_text_document")]


def test_train_missing_data_lists_the_pairs(data):
    with pytest.raises(NoSuchPathError) as info:
        check_data(TrainConfig(model="m", data=[str(data / "austin")], save="out"))
    assert f"no such file or folder: {data / 'austin.bin'}" in str(info.value)
    # 'austin' starts like nothing there, so every pair is listed
    assert str(data / "austen_text_document") in info.value.hint and str(data / "chat_text_document") in info.value.hint




def test_dataset_inspect_and_merge_take_the_short_form(data, capsys):
    code, out, err = _cli(["dataset", "inspect", data / "austen"], capsys)
    assert code == 0, err
    assert f"dataset:               {data / 'austen_text_document'}" in out and "documents:             2" in out
    code, out, err = _cli(["dataset", "merge", data / "austen", data / "austen_text_document",
                           "--output-prefix", data / "both"], capsys)
    assert code == 0 and "4 documents" in out, err


def test_dataset_inspect_of_a_missing_prefix_is_one_line_with_the_pairs(data, capsys):
    code, out, err = _cli(["dataset", "inspect", data / "aus"], capsys)
    assert code == 1 and "Traceback" not in out + err
    lines = err.splitlines()
    assert lines[0].startswith(f"pai-zoo: error: no such file or folder: {data / 'aus.idx'} (dataset {data / 'aus'}: "
                               f"tried {data / 'aus'}.bin/.idx and {data / 'aus_text_document'}.bin/.idx)")
    assert lines[1] == (f"hint: datasets (.bin/.idx pairs) in {data}: {data / 'austen_text_document'}; give one of "
                        "them as dataset (PREFIX or PREFIX_text_document)")


@pytest.mark.megatron
def test_the_dataset_builders_read_either_form(data, tmp_path):
    from pai_zoo.training.data import build_pretraining_datasets, build_sft_datasets

    _write(data / "long_text_document", [list(range(1, 40))] * 8)
    for given in ("long", "long_text_document"):
        cfg = TrainConfig(model="m", data=[str(data / given)], save="out", sequence_length=8, split="100,0,0")
        train, _ = build_pretraining_datasets(cfg, 64, 0, (4, 0), tmp_path / f"cache_{given}")
        assert len(train) >= 4
    for given in ("chat", "chat_loss_mask_document"):
        train, _ = build_sft_datasets(TrainConfig(model="m", data=[str(data / given)], save="out", sft=True,
                                                  split="100,0,0"))
        assert train.text.prefix.endswith("chat_text_document") and len(train) == 1
