"""``pai_zoo.export_hf_weights`` / ``import_hf_weights``: weights out of and into a live, sharded megatron-core model
(2 gloo ranks of the shared worker group at TP=2, PP=2 and EP=2), checked against ``convert --to hf`` of the same
model saved by megatron-core, against transformers' logits and against the PEFT file pai-zoo writes."""
from __future__ import annotations

from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

import pai_zoo
from pai_zoo.conversion.entry import convert


def tensors(folder) -> dict:
    out = {}
    for file in sorted(Path(folder).glob("*.safetensors")):
        out.update(load_file(file))
    return out


@pytest.fixture(scope="module")
def sources(tmp_path_factory):
    """preset -> (HF folder, megatron-core checkpoint converted from it)."""
    out = {}
    for preset, overrides in (("qwen2-tiny", {}), ("qwen3-moe-tiny", {}), ("qwen2-4-layers", {"num_hidden_layers": 4})):
        root = tmp_path_factory.mktemp(preset)
        pai_zoo.load(preset.replace("-4-layers", "-tiny"), backend="hf", seed=3, **overrides).model.save_pretrained(
            root / "hf")
        convert(root / "hf", root / "mcore", "mcore")
        out[preset] = (root / "hf", root / "mcore")
    return out


IDS = torch.tensor([[5, 1, 7, 2, 9, 3, 11, 4]])


# -- on every rank of the worker group --------------------------------------------------------------------------
def _build(checkpoint, tp=1, pp=1, ep=1, vpp=1):
    """``checkpoint``'s model with this layout (``vpp`` > 1: a list of virtual-pipeline chunks), its weights loaded
    by megatron-core's own loader."""
    from megatron.core import parallel_state

    from pai_zoo.families.registry import get_registry
    from pai_zoo.formats import mcore_dist
    from pai_zoo.formats.megatron_folder import iteration_dir
    from pai_zoo.mcore import dist_ckpt
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.compat import ensure_model_parallel

    torch.set_num_threads(1)
    if parallel_state.model_parallel_is_initialized():
        parallel_state.destroy_model_parallel()
    experts = {"expert_model_parallel_size": ep, "expert_tensor_parallel_size": 1} if ep > 1 else {}
    ensure_model_parallel(tp, pp, virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None, **experts)
    config, record = mcore_dist.mcore_config_of(checkpoint)
    chunks = []
    for i in range(vpp):
        stage = i if vpp > 1 else None
        overrides = {**experts,
                     **({"virtual_pipeline_model_parallel_size": vpp} if vpp > 1 else {})}
        chunks.append(build_gpt_model(
            get_registry().family(config.family), config, padded_vocab_size=record.get("padded_vocab_size"),
            pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=stage is None, vp_stage=stage),
            post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=stage is None, vp_stage=stage),
            vp_stage=stage, **overrides).eval())
    model = chunks if vpp > 1 else chunks[0]
    dist_ckpt.load_model_weights(model, iteration_dir(checkpoint))
    return model


def export_worker(checkpoint, tp, pp, ep, vpp, save):
    """Every rank's export (copies) and peak bytes; the model saved into ``save`` by megatron-core."""
    import shutil

    from megatron.core import dist_checkpointing

    from pai_zoo.formats import mcore_dist
    from pai_zoo.mcore.dist_ckpt import model_sharded_state

    model = _build(checkpoint, tp, pp, ep, vpp)
    stream = pai_zoo.export_hf_weights(model)
    got = {}
    for name, tensor in stream:
        got[name] = tensor.clone()
        del tensor
    save, source = Path(save), Path(checkpoint)  # as a training run with this layout saves it
    if torch.distributed.get_rank() == 0:
        (save / mcore_dist.RELEASE).mkdir(parents=True)
        for name in (mcore_dist.TRACKER, mcore_dist.PAI_ZOO_CONFIG):
            shutil.copy2(source / name, save / name)
        shutil.copytree(source / mcore_dist.HF_DIR, save / mcore_dist.HF_DIR)
    torch.distributed.barrier()
    chunks = model if isinstance(model, list) else [model]
    dist_checkpointing.save({f"model{i}": model_sharded_state(c) for i, c in enumerate(chunks)},
                            str(save / mcore_dist.RELEASE))
    return got, stream.peak_bytes


def import_worker(checkpoint, hf_folder, tp, pp, whole_model):
    """Rank 0's logits after importing ``hf_folder``'s transformers model into a zeroed TP x PP model."""
    from pai_zoo.models.handle import load

    torch.set_num_threads(1)
    handle = load(checkpoint, backend="mcore", tensor_parallel_size=tp, pipeline_parallel_size=pp)
    with torch.no_grad():
        for p in handle.model.parameters():
            p.zero_()
    hf = pai_zoo.load(hf_folder, backend="hf").model
    pai_zoo.import_hf_weights(handle.model, hf if whole_model else hf.state_dict().items())
    return handle.logits(IDS)


def adapters_worker(checkpoint, save):
    """A TP=2 model with LoRA adapters (B drawn by global row, so that every layout holds the same adapter): its
    adapters-only export, and the adapters saved by megatron-core as a LoRA run saves them."""
    from megatron.core import dist_checkpointing

    from pai_zoo.lora.adapters import adapters_of, add_lora, sharded_state
    from pai_zoo.lora.settings import LoraSettings
    from pai_zoo.models.handle import load

    torch.set_num_threads(1)
    handle = load(checkpoint, backend="mcore", tensor_parallel_size=2)
    model = handle.model
    origin = model.pai_zoo_origin
    add_lora(model, origin.family, origin.config, LoraSettings(rank=4, alpha=8.0), seed=5)
    with torch.no_grad():
        for name, (pair, parallel, tp, rank) in adapters_of(model).items():
            b = pair.lora_B
            rows = torch.arange(b.shape[0]) + (rank * b.shape[0] if parallel == "column" else 0)
            b.copy_(torch.sin(rows[:, None] * 0.37 + torch.arange(b.shape[1]) * 1.3 + len(name)))
    got = {n: t.clone() for n, t in pai_zoo.export_hf_weights(model, adapters_only=True)}
    dist_checkpointing.save(sharded_state(model), str(save))
    return got, handle.logits(IDS)


# -- the tests ---------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("preset,tp,pp,ep,vpp", [("qwen2-tiny", 2, 1, 1, 1), ("qwen2-tiny", 1, 2, 1, 1),
                                                  ("qwen3-moe-tiny", 1, 1, 2, 1), ("qwen3-moe-tiny", 2, 1, 2, 1),
                                                  ("qwen2-4-layers", 1, 2, 1, 2)])
def test_export_equals_convert_to_hf_bit_for_bit(sources, tmp_path, pai_zoo_workers, preset, tp, pp, ep, vpp):
    _, checkpoint = sources[preset]
    results = pai_zoo_workers.run(export_worker, str(checkpoint), tp, pp, ep, vpp, str(tmp_path / "saved"))
    convert(tmp_path / "saved", tmp_path / "hf", "hf")
    written = tensors(tmp_path / "hf")
    assert written and (preset == "qwen3-moe-tiny" or "lm_head.weight" not in written)  # tied: left out
    for got, _ in results:  # every rank receives every tensor
        assert got.keys() == written.keys()
        for name, tensor in written.items():
            assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
            assert torch.equal(got[name], tensor), name
    # memory: below the model's largest layer plus its largest tensor, both taken from the single-process model
    whole = pai_zoo.load(checkpoint).model
    size = {n: t.numel() * t.element_size() for n, t in whole.state_dict().items() if not n.endswith("extra_state")}
    layers = {}
    for name, nbytes in size.items():
        key = ".".join(name.split(".")[:3]) if name.startswith("decoder.layers.") else name
        layers[key] = layers.get(key, 0) + nbytes
    bound = max(layers.values()) + max(size.values())
    for _, peak in results:
        assert 0 < peak <= bound, (peak, bound)


@pytest.mark.parametrize("preset,tp,pp,whole_model", [("qwen2-tiny", 2, 1, False), ("qwen2-tiny", 1, 2, False),
                                                       ("qwen3-moe-tiny", 2, 1, True)])
def test_import_gives_transformers_logits(sources, tmp_path, pai_zoo_workers, preset, tp, pp, whole_model):
    from pai_zoo.models.verification import compare_logits

    _, checkpoint = sources[preset]
    other = tmp_path / "other"  # other weights than the checkpoint's, so that the import must replace them all
    pai_zoo.load(preset, backend="hf", seed=11).model.save_pretrained(other)
    logits = pai_zoo_workers.run(import_worker, str(checkpoint), str(other), tp, pp, whole_model)[0]
    expected = pai_zoo.load(other, backend="hf").logits(IDS)
    result = compare_logits(expected, logits, "fp32")
    assert result["ok"], result


def test_adapters_only_export_equals_the_peft_file_that_peft_applies_as_pai_zoo(sources, tmp_path, pai_zoo_workers):
    from peft import PeftModel

    from pai_zoo.families.registry import get_registry
    from pai_zoo.formats.mcore_dist import DistCheckpointReader, mcore_config_of
    from pai_zoo.formats.peft_adapter import write_peft_adapter
    from pai_zoo.lora.settings import LoraSettings
    from pai_zoo.lora.targets import lora_targets, to_hf_form
    from pai_zoo.models.verification import compare_logits
    from pai_zoo.tables.mapping import MappingContext

    hf_folder, checkpoint = sources["qwen2-tiny"]
    (tmp_path / "run").mkdir()
    results = pai_zoo_workers.run(adapters_worker, str(checkpoint), str(tmp_path / "run"))
    # what convert RUN --to hf-peft does with a run's saved adapters (pai_zoo.conversion.lora_export)
    reader = DistCheckpointReader(tmp_path / "run")
    keys = [k for k in reader.keys() if k.startswith("decoder.") and ".lora_adapters." in k]  # as run_adapters reads
    saved = {k: reader.read(k, (0,) * len(reader.global_shape(k)), reader.global_shape(k)) for k in keys}
    config, _ = mcore_config_of(checkpoint)
    family = get_registry().family(config.family)
    hf = to_hf_form(saved, lora_targets(get_registry().weight_map(family, config)), config,
                    MappingContext.from_config(config))
    write_peft_adapter(tmp_path / "peft", LoraSettings(rank=4, alpha=8.0), hf, base=str(checkpoint), family=family)
    written = load_file(tmp_path / "peft" / "adapter_model.safetensors")
    assert any(n.endswith("q_proj.lora_B.weight") for n in written)
    for got, _ in results:
        assert got.keys() == written.keys()
        for name, tensor in written.items():
            assert got[name].dtype == tensor.dtype and torch.equal(got[name], tensor), name
    base = pai_zoo.load(hf_folder, backend="hf").model
    with torch.no_grad():
        plain = base(IDS).logits
        expected = PeftModel.from_pretrained(base, tmp_path / "peft").eval()(IDS).logits
    assert (expected - plain).abs().max() > 1e-2  # the adapters change the logits
    result = compare_logits(expected, results[0][1], "fp32")
    assert result["ok"], result


def test_import_names_the_bad_tensor(sources):
    _, checkpoint = sources["qwen2-tiny"]
    handle = pai_zoo.load(checkpoint)
    good = dict(pai_zoo.export_hf_weights(handle.model))
    name = "model.layers.1.mlp.up_proj.weight"
    cases = {
        "missing": ({k: v for k, v in good.items() if k != name}, f"{name}: missing"),
        "extra": ({**good, "model.layers.9.mlp.up_proj.weight": good[name]}, "model.layers.9.mlp.up_proj.weight: "),
        "shape": ({**good, name: good[name][:-1]}, f"{name}: shape"),
    }
    for what, (pairs, start) in cases.items():
        with pytest.raises(pai_zoo.MappingError) as info:
            pai_zoo.import_hf_weights(handle, pairs)
        assert str(info.value).startswith(start) and "\n" not in str(info.value), (what, str(info.value))
