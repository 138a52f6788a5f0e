"""``pai-zoo train`` at scale on the CPU (gloo, 2 processes): sequence parallelism, the distributed optimizer (also
with overlapped gradient reduce and parameter gather), the interleaved pipeline schedule and activation recompute
repeat one process's losses; a distributed-optimizer run
killed with SIGKILL resumes with the same losses and converts to HF; checkpoints reshard TP2 -> TP1 and
DP2 (distributed optimizer) -> DP1; impossible combinations are refused before any work.

The model has unusual shapes: 6 heads of head_dim 16 over a hidden size of 72 (head_dim != hidden / heads), 2
key/value groups (GQA ratio 3), a vocabulary of 300 (not a multiple of 128), 4 layers (PP 2 x VPP 2)."""
from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import time
from pathlib import Path

import pytest
import torch

from pai_zoo.testing.torchrun import torchrun
from pai_zoo.training.config import TrainConfig, TrainConfigError
from pai_zoo_conformance.cli_runs import run_cli, run_cli_on_ranks

REPO = Path(__file__).resolve().parents[1]
#: the issue's tolerance for a loss series against one process (float32, 8 Adam steps)
LOSS_ATOL = 1e-4
STEPS, GBS, SEQ = 8, 4, 32
ODD = dict(vocab_size=300, num_hidden_layers=4, hidden_size=72, num_attention_heads=6, num_key_value_heads=2,
           head_dim=16, intermediate_size=160)

#: case -> settings on top of :func:`settings`; every case runs as 2 gloo processes in one torchrun launch
CASES = {
    "tp2_sp": {"tensor_model_parallel_size": 2, "sequence_parallel": True},
    "dp2_distopt": {"use_distributed_optimizer": True},
    "dp2_distopt_overlap": {"use_distributed_optimizer": True, "overlap_grad_reduce": True,
                            "overlap_param_gather": True, "save_interval": 8},
    "pp2_vpp2": {"pipeline_model_parallel_size": 2, "virtual_pipeline_model_parallel_size": 2, "save_interval": 8},
    "full_recompute": {"recompute_granularity": "full", "recompute_method": "uniform", "recompute_num_layers": 2,
                       "save_interval": 8},
    "selective_recompute": {"recompute_granularity": "selective", "save_interval": 8},
}
RECOMPUTE = ("full_recompute", "selective_recompute")


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    import pai_zoo
    from pai_zoo.data import toy
    from pai_zoo.data.preprocess import preprocess

    root = tmp_path_factory.mktemp("scale")
    toy.write_tokenizer(root / "hf", vocab_size=300)
    pai_zoo.load("llama3-tiny", backend="hf", seed=3, **ODD).model.save_pretrained(root / "hf")
    corpus = toy.write_corpus(root / "corpus.jsonl", documents=150)
    preprocess([corpus], root / "toy", str(root / "hf"), append_eod=True, progress=False)
    return root


def settings(setup, save, **extra) -> dict:
    return {"model": str(setup / "hf"), "data": [str(setup / "toy_text_document")], "save": str(save),
            "global_batch_size": GBS, "batch_size": 1, "seq_length": SEQ, "train_iters": STEPS, "warmup_iters": 1,
            "lr": 3e-3, "min_lr": 3e-4, "save_interval": 4, "progress": False, **extra}


def flags(values: dict) -> list[str]:
    """``settings`` as ``pai-zoo train`` flags."""
    out = []
    for key, value in values.items():
        if key == "progress":
            out.append("--no-progress")
        elif value is True:
            out.append("--" + key.replace("_", "-"))
        else:
            out += ["--" + key.replace("_", "-"), *(map(str, value) if isinstance(value, list) else [str(value)])]
    return out


def _env():
    return {**os.environ, "OMP_NUM_THREADS": "1"}


def _launch(*args) -> list[str]:
    return [*torchrun(2), *args]


def train(values: dict, nproc: int = 1, check=True):
    """``pai-zoo train`` in this process, or on the session's 2 worker ranks (``nproc=2``, as under torchrun)."""
    argv = ["train", *flags(values)]
    proc = run_cli_on_ranks(argv, timeout=600) if nproc == 2 else run_cli(argv)
    if check and proc.returncode != 0:
        raise AssertionError(f"failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-5000:]}")
    return proc


def losses(save) -> list[float]:
    return [json.loads(line)["loss"] for line in (Path(save) / "metrics.jsonl").read_text().splitlines()]


def max_delta(got, want) -> float:
    assert len(got) == len(want), (got, want)
    return max(abs(a - b) for a, b in zip(got, want))


@pytest.fixture(scope="module")
def baseline(setup):
    save = setup / "baseline"
    train(settings(setup, save))
    return losses(save)


@pytest.fixture(scope="module")
def scaled(setup, pai_zoo_workers):
    """Every case of :data:`CASES`, one after the other on the session's 2 worker ranks
    (tests/train_scale_worker.py)."""
    cases = {name: settings(setup, setup / name, **extra) for name, extra in CASES.items()}
    file = setup / "cases.json"
    file.write_text(json.dumps(cases))
    spec = importlib.util.spec_from_file_location("train_scale_worker", REPO / "tests" / "train_scale_worker.py")
    worker = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(worker)
    pai_zoo_workers.run(worker.train_cases, str(file), timeout=900)
    return {name: setup / name for name in CASES}


@pytest.mark.parametrize("case", list(CASES))
def test_scale_settings_repeat_one_process(scaled, baseline, case):
    save = scaled[case]
    assert max_delta(losses(save), baseline) <= LOSS_ATOL, (case, losses(save), baseline)
    calls = json.loads((save / "recompute_calls.json").read_text())
    # megatron-core's recompute (tensor_parallel.checkpoint) ran in the recompute cases, and only there
    assert (calls > 0) == (case in RECOMPUTE), (case, calls)


def test_the_plans_counts_equal_what_each_rank_built(scaled):
    """``pai-zoo train --plan``'s parameters per rank against megatron-core's TP2, PP2 x VPP2 and DP2 builds."""
    from pai_zoo.families.registry import get_registry
    from pai_zoo.hf import models as hf
    from pai_zoo.training.plan import stage_parameters

    family, values = get_registry().preset("llama3-tiny")
    config = family.to_mcore_config(hf.config_dict(hf.hf_config(family, {**values, **ODD})))
    for case, tp, pp, vpp in (("tp2_sp", 2, 1, 1), ("pp2_vpp2", 1, 2, 2), ("dp2_distopt", 1, 1, 1)):
        stages = stage_parameters(config, tp, pp, vpp)
        ranks = json.loads((scaled[case] / "parameters_per_rank.json").read_text())
        assert len(ranks) == 2
        for rank in ranks:
            assert rank["parameters"] == stages[rank["pp"]].parameters, (case, rank, stages)


def test_full_recompute_runs_once_per_group_of_layers(scaled):
    """uniform, 2 layers per group: 2 groups of the 4 layers per micro-batch forward; selective: one per layer."""
    micro = GBS // 2  # DP 2
    full = json.loads((scaled["full_recompute"] / "recompute_calls.json").read_text())
    selective = json.loads((scaled["selective_recompute"] / "recompute_calls.json").read_text())
    assert full == STEPS * micro * 2 and selective == STEPS * micro * 4, (full, selective)


@pytest.mark.parametrize("case, to", [("tp2_sp", {}), ("dp2_distopt", {"use_distributed_optimizer": True})],
                         ids=["tp2-to-tp1", "dp2-distopt-to-dp1"])
def test_a_checkpoint_resumes_with_another_layout(setup, scaled, baseline, case, to, tmp_path):
    """Step 4 of a 2-process run resumed by one process: megatron-core reshards the weights and the optimizer
    state (the distributed optimizer's in its fully reshardable format); steps 5-8 repeat the baseline's."""
    save = tmp_path / case
    shutil.copytree(scaled[case], save, ignore=shutil.ignore_patterns("iter_0000008"))
    (save / "latest_checkpointed_iteration.txt").write_text("4")
    proc = train(settings(setup, save, **to))
    assert "resuming" in proc.stdout and "resharded from TP" in proc.stdout, proc.stdout
    got = losses(save)
    assert got[:4] == losses(scaled[case])[:4]
    assert max_delta(got, baseline) <= LOSS_ATOL, (got, baseline)


def test_switching_the_distributed_optimizer_on_resume_is_refused(tmp_path):
    from pai_zoo.formats.training_run import CONFIG_FILE
    from pai_zoo.training.trainer import Trainer

    before = TrainConfig(model="m", data=["d"], save=str(tmp_path), use_distributed_optimizer=True)
    (tmp_path / CONFIG_FILE).write_text(json.dumps(before.to_dict()))
    with pytest.raises(TrainConfigError) as e:
        Trainer(TrainConfig(model="m", data=["d"], save=str(tmp_path)))._check_resume_compatible()
    assert "use_distributed_optimizer: True -> False" in str(e.value) and "format of its own" in str(e.value)
    assert "resume with --use-distributed-optimizer" in e.value.hint
    Trainer(before)._check_resume_compatible()  # the same setting resumes


def test_distributed_optimizer_resumes_after_sigkill_and_converts_to_hf(setup, scaled, tmp_path):
    import pai_zoo
    from pai_zoo.conversion.entry import convert

    save = tmp_path / "killed"
    values = settings(setup, save, use_distributed_optimizer=True)
    proc = subprocess.Popen([*_launch("-m", "pai_zoo.cli"), "train", *flags(values)], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL, env=_env(), start_new_session=True)
    metrics = save / "metrics.jsonl"
    deadline = time.time() + 300
    while time.time() < deadline and proc.poll() is None:
        if metrics.is_file() and len(metrics.read_text().splitlines()) >= 6:
            break
        time.sleep(0.05)
    assert proc.poll() is None, "the run ended before it could be killed"
    # torchrun and both trainers: torch's elastic agent starts each trainer in a session of its own, so killing
    # torchrun's process group alone leaves them running on (racing the resumed run for iter_N.tmp)
    import psutil

    tree = [psutil.Process(proc.pid), *psutil.Process(proc.pid).children(recursive=True)]
    for process in tree:
        process.kill()
    proc.wait()
    psutil.wait_procs(tree[1:], timeout=60)
    assert (save / "latest_checkpointed_iteration.txt").read_text() == "4"
    resumed = train(values, nproc=2)
    assert "resuming" in resumed.stdout
    assert losses(save) == losses(scaled["dp2_distopt"])  # step for step, bit for bit
    convert(save, tmp_path / "hf", to="hf")
    ids = torch.randint(0, 300, (2, 20), generator=torch.Generator().manual_seed(0))
    trained = pai_zoo.load(save, backend="mcore").logits(ids)
    assert (pai_zoo.load(tmp_path / "hf", backend="hf").logits(ids) - trained).abs().max().item() <= 1e-4
    assert (pai_zoo.load(setup / "hf", backend="hf").logits(ids) - trained).abs().max().item() > 1e-2


# ---------------------------------------------------------------------------------------------
# settings under Megatron-LM's names, and the combinations refused before any work
# ---------------------------------------------------------------------------------------------
def test_megatron_lm_names_as_flags_and_yaml(tmp_path):
    from pai_zoo.cli import build_parser, parse
    from pai_zoo.cli.train import GIVEN

    argv = ["--use-distributed-optimizer", "--sequence-parallel", "--recompute-granularity", "full",
            "--recompute-method", "block", "--recompute-num-layers", "3", "--virtual-pipeline-model-parallel-size",
            "2", "--context-parallel-size", "2", "--expert-model-parallel-size", "4", "--overlap-grad-reduce",
            "--overlap-param-gather", "--transformer-impl", "transformer_engine", "--tensor-model-parallel-size", "8",
            "--pipeline-model-parallel-size", "4"]
    args = parse(build_parser(), ["train", *argv])
    from_flags = TrainConfig.load(None, getattr(args, GIVEN))
    file = tmp_path / "run.yaml"
    file.write_text("use_distributed_optimizer: true\nsequence_parallel: true\nrecompute_granularity: full\n"
                    "recompute_method: block\nrecompute_num_layers: 3\nvirtual_pipeline_model_parallel_size: 2\n"
                    "context_parallel_size: 2\nexpert_model_parallel_size: 4\noverlap_grad_reduce: true\n"
                    "overlap_param_gather: true\ntransformer_impl: transformer_engine\n"
                    "tensor_model_parallel_size: 8\npipeline_model_parallel_size: 4\n")
    from_yaml = TrainConfig.load(file)
    for c in (from_flags, from_yaml):
        assert (c.use_distributed_optimizer, c.sequence_parallel, c.overlap_grad_reduce, c.overlap_param_gather) == \
            (True, True, True, True)
        assert (c.recompute_granularity, c.recompute_method, c.recompute_num_layers) == ("full", "block", 3)
        assert (c.virtual_pipeline_model_parallel_size, c.context_parallel_size, c.expert_model_parallel_size) == \
            (2, 2, 4)
        assert (c.transformer_impl, c.tensor_parallel_size, c.pipeline_parallel_size) == ("transformer_engine", 8, 4)
    assert TrainConfig.load(None, {"--recompute-activations": True}).recompute == "selective"  # the short form
    assert TrainConfig(recompute_granularity="full", recompute_method="block").recompute_overrides(8) == \
        {"recompute_granularity": "full", "recompute_method": "block", "recompute_num_layers": 8}


@pytest.mark.parametrize("extra, world, message", [
    (dict(sequence_parallel=True), 2, "sequence_parallel True needs tensor_parallel_size > 1"),
    (dict(virtual_pipeline_model_parallel_size=2), 2, "needs pipeline_parallel_size > 1"),
    (dict(pipeline_parallel_size=2, virtual_pipeline_model_parallel_size=2, global_batch_size=3), 2,
     "needs the micro-batches per step (3 = global batch 3"),
    (dict(overlap_param_gather=True), 2, "overlap_param_gather True needs --use-distributed-optimizer"),
    (dict(recompute_method="block"), 1, "recompute_method block applies to recompute_granularity full only"),
    (dict(recompute_granularity="everything"), 1, "recompute_granularity everything: unknown value; expected one of "
                                                  "selective, full"),
    (dict(recompute_activations=True, recompute_granularity="full"), 1, "disagree"),
    (dict(transformer_impl="fused"), 1, "transformer_impl fused: unknown value"),
    (dict(context_parallel_size=2), 2, "megatron-core's context parallelism needs Transformer Engine's attention"),
    (dict(context_parallel_size=2), 3, "3 processes cannot hold tensor_parallel_size=1 x pipeline_parallel_size=1 x "
                                       "context_parallel_size=2"),
    (dict(expert_model_parallel_size=3), 2, "expert_model_parallel_size 3 must divide data-parallel"),
])
def test_impossible_combinations_are_refused_with_the_reason(extra, world, message):
    c = TrainConfig(model="m", data=["d"], save="s", global_batch_size=extra.pop("global_batch_size", 4), **extra)
    with pytest.raises(TrainConfigError) as e:
        c.validate(world)
    assert message in str(e.value)


@pytest.mark.skipif(torch.cuda.is_available(), reason="the refusals of the CPU")
@pytest.mark.parametrize("extra, message", [
    (["--context-parallel-size", "2", "--transformer-impl", "transformer_engine"],
     "(this machine has no GPU)"),
    (["--context-parallel-size", "2"], "(the local layer spec's attention cannot split a sequence)"),
    (["--transformer-impl", "transformer_engine"], "--transformer-impl transformer_engine needs a GPU"),
])
def test_cli_refuses_cp_and_te_on_the_cpu_before_any_work(tmp_path, capsys, extra, message):
    from pai_zoo.cli import main

    code = main(["train", "--model", "llama3-tiny", "--data", str(tmp_path / "d"), "--save", str(tmp_path / "o"),
                 *extra])
    err = capsys.readouterr().err
    assert code == 1 and message in err and "Traceback" not in err, err
    assert not (tmp_path / "o").exists()


@pytest.mark.parametrize("extra, message", [
    (dict(pipeline_parallel_size=2, virtual_pipeline_model_parallel_size=3), "the model's 4 layers do not divide "
                                                                             "into pipeline_parallel_size 2 x 3 "
                                                                             "chunks; valid sizes: 2"),
    (dict(recompute_granularity="full", recompute_num_layers=5), "more than the 4 layers of each pipeline chunk"),
    (dict(expert_model_parallel_size=2), "the model has no experts (not a MoE model)"),
])
def test_settings_that_do_not_fit_the_model_are_refused(extra, message):
    c = TrainConfig(model="m", data=["d"], save="s", **extra)
    with pytest.raises(TrainConfigError) as e:
        c.check_model(num_layers=4)
    assert message in str(e.value)


@pytest.mark.parametrize("preset, layers", [("qwen3_next-odd", "Gated DeltaNet"), ("nemotron_h-odd", "Mamba-2"),
                                            ("glm5-odd", "DeepSeek sparse attention")])
def test_context_parallelism_is_refused_for_layers_that_read_whole_sequences(preset, layers):
    """Before any model is built (a GPU run would otherwise fail inside the layer); a GPT model takes --cp."""
    from pai_zoo.families.registry import get_registry
    from pai_zoo.hf import models as hf
    from pai_zoo.mcore.parallel_sizes import check_layout

    def config(name):
        family, values = get_registry().preset(name)
        return family.to_mcore_config(hf.config_dict(hf.hf_config(family, values)))

    with pytest.raises(TrainConfigError) as e:
        check_layout(config(preset), cp=2, error=TrainConfigError)
    assert str(e.value) == (f"--cp 2: context parallelism is not supported for {layers} layers (they read the whole "
                            "sequence on one rank); leave --cp out")
    check_layout(config("llama3-tiny"), cp=2, error=TrainConfigError)


def test_tensor_parallel_experts_need_sequence_parallelism():
    """megatron-core's MoE layer refuses to train under TP without SP (a ValueError in the first forward): refused
    before any work, naming the flag; with --sequence-parallel, or on a dense model, it is fine."""
    c = TrainConfig(model="m", data=["d"], save="s", tensor_parallel_size=2)
    with pytest.raises(TrainConfigError) as e:
        c.check_model(num_layers=4, num_moe_experts=4)
    assert "tensor_parallel_size 2 on a mixture of experts needs --sequence-parallel" in str(e.value)
    c.check_model(num_layers=4)
    TrainConfig(model="m", data=["d"], save="s", tensor_parallel_size=2, sequence_parallel=True).check_model(4, 4)
