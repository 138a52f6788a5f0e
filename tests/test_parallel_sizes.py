"""TP/PP sizes: an invalid --tp/--pp lists the valid ones (convert, train, generate, pai_zoo.load), and a layout
larger than the world without torchrun is one error line with the torchrun command to run instead."""
from __future__ import annotations

import pytest

import pai_zoo
from pai_zoo.cli import main
from pai_zoo.mcore.parallel_sizes import check_tp, check_world, torchrun_command, valid_pp_sizes, valid_tp_sizes
from pai_zoo.plugin.errors import PaiZooError

pytestmark = [pytest.mark.usefixtures("fresh_registry"), pytest.mark.no_megatron]


@pytest.fixture(autouse=True)
def no_torchrun(monkeypatch):
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK"):
        monkeypatch.delenv(name, raising=False)


def test_valid_sizes():
    assert valid_tp_sizes(3, 3) == [1, 3]
    assert valid_tp_sizes(6, 3) == [1, 3, 6]  # 6 ranks: each kv group replicated on 2
    assert valid_tp_sizes(4, 2) == [1, 2, 4]
    assert valid_tp_sizes(8, 1) == [1, 2, 4, 8]
    assert valid_tp_sizes(4) == [1, 2, 4]  # no GQA: the groups are the heads
    assert valid_pp_sizes(6) == [1, 2, 3, 6]
    with pytest.raises(PaiZooError, match=r"--tp 2 does not fit the model.s 3 key/value head groups .*--tp: 1, 3$"):
        check_tp(2, 3, 3)


def test_layout_larger_than_the_world_gives_the_torchrun_command():
    with pytest.raises(PaiZooError) as info:
        check_world(3, 1, world=1)
    message = str(info.value)
    assert "\n" not in message and "torchrun --nproc-per-node 3 YOUR_SCRIPT.py" in message
    check_world(2, 2, world=4)
    check_world(2, 1, world=4)  # 2-way data parallel
    with pytest.raises(PaiZooError, match="needs a multiple of 4 processes .* not 6"):
        check_world(2, 2, world=6)
    assert torchrun_command(2, ["generate", "--prompt", "a b"]) == \
        "torchrun --nproc-per-node 2 -m pai_zoo.cli generate --prompt 'a b'"


def test_generate_tp_in_one_process_says_torchrun(capsys):
    argv = ["generate", "--model", "llama3-tiny", "--prompt", "Hello there", "--tp", "3"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err
    assert "run: torchrun --nproc-per-node 3 -m pai_zoo.cli generate --model llama3-tiny --prompt 'Hello there' " \
           "--tp 3" in err


@pytest.fixture(scope="module")
def hf_and_data(tmp_path_factory):
    """A tiny Llama (4 heads, 2 key/value groups, 2 layers) with the toy tokenizer, and a toy corpus."""
    from pai_zoo_conformance.toy_runs import write_toy_model_and_data

    return write_toy_model_and_data(tmp_path_factory.mktemp("tp"), documents=20)


@pytest.mark.megatron
def test_convert_invalid_tp_lists_the_valid_ones(hf_and_data, tmp_path, capsys):
    assert main(["convert", str(hf_and_data / "hf"), str(tmp_path / "m"), "--to", "mcore", "--tp", "3"]) == 1
    assert "--tp 3 does not fit the model's 2 key/value head groups (4 attention heads); valid --tp: 1, 2, 4" \
        in capsys.readouterr().err
    assert main(["convert", str(hf_and_data / "hf"), str(tmp_path / "m"), "--to", "mcore", "--pp", "3"]) == 1
    assert "valid --pp: 1, 2" in capsys.readouterr().err
    assert not (tmp_path / "m").exists()


@pytest.mark.megatron
def test_load_invalid_tp_lists_the_valid_ones():
    with pytest.raises(PaiZooError, match="valid --tp: 1, 2, 4"):
        pai_zoo.load("llama3-tiny", tensor_parallel_size=3)


def _train(root, save, *extra):
    return ["train", "--model", str(root / "hf"), "--data", str(root / "toy_text_document"), "--save", str(save),
            "--global-batch-size", "4", "--batch-size", "1", "--seq-length", "16", "--train-tokens", "128",
            "--warmup-tokens", "16", "--no-progress", *extra]


@pytest.mark.megatron
def test_train_tp(hf_and_data, tmp_path, capsys):
    assert main(_train(hf_and_data, tmp_path / "a", "--tp", "3")) == 1
    assert "valid --tp: 1, 2, 4" in capsys.readouterr().err
    argv = _train(hf_and_data, tmp_path / "b", "--tp", "2")
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "Traceback" not in err, err
    assert "--tp 2 needs 2 processes and this is one (not under torchrun); run: torchrun --nproc-per-node 2 " \
           f"-m pai_zoo.cli train --model {hf_and_data / 'hf'}" in err
