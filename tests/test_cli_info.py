"""``pai-zoo info CHECKPOINT``: a Hugging Face or Megatron folder prints what ``inspect`` prints, then the family's
info; names keep working, and a registered name wins over a folder of the same name."""
from __future__ import annotations

import pytest

import pai_zoo
from pai_zoo.cli import main
from pai_zoo.conversion.entry import convert
from pai_zoo.models.inspection import inspect_checkpoint

pytestmark = pytest.mark.usefixtures("fresh_registry")


@pytest.fixture(scope="module")
def folders(tmp_path_factory):
    root = tmp_path_factory.mktemp("info")
    pai_zoo.load("llama3-tiny", backend="hf", seed=0).model.save_pretrained(root / "hf")
    convert(root / "hf", root / "mcore", "mcore")
    return root


@pytest.mark.parametrize("kind", ["hf", "mcore"])
def test_info_of_a_checkpoint_folder_is_inspect_then_the_family(folders, kind, capsys):
    assert main(["info", str(folders / kind)]) == 0
    out = capsys.readouterr().out
    inspected = "\n".join(inspect_checkpoint(folders / kind).lines())
    assert out.startswith(inspected + "\n\n"), out
    family = out[len(inspected):]
    assert "family:        llama" in family and "presets:" in family and "weight map" in family
    assert main(["inspect", str(folders / kind)]) == 0
    assert capsys.readouterr().out == inspected + "\n"


def test_a_folder_in_the_working_directory_and_a_name(folders, monkeypatch, capsys):
    monkeypatch.chdir(folders)
    assert main(["info", "hf"]) == 0
    assert capsys.readouterr().out.startswith("checkpoint:   hf\nformat:       Hugging Face")
    (folders / "llama").mkdir(exist_ok=True)  # a folder named like a family: the family wins
    assert main(["info", "llama"]) == 0
    assert capsys.readouterr().out.startswith("family:        llama")


def test_a_folder_that_is_no_checkpoint(tmp_path, capsys):
    assert main(["info", str(tmp_path)]) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and f"{tmp_path}: not a checkpoint folder" in err
