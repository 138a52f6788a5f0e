"""Live weight export benchmark: ``pai_zoo.export_hf_weights`` (streaming the HF-named tensors out of the live
megatron-core model) against the way through disk (megatron-core's ``dist_checkpointing.save`` of the model,
``pai-zoo convert --to hf``, then reading the safetensors back one tensor at a time), on a ~1.1B-parameter
Llama-architecture model (TinyLlama-1.1B's shape: 22 layers, hidden 2048, GQA 32/4, vocabulary 32000) built with
random weights, single process, in the same run.

For each way it reports the wall time and the peak resident memory above the live model (``/proc/self/status``
VmHWM after resetting the high-water mark); the consumer touches each tensor and drops it, as an inference engine's
``load_weights`` copies it into its own buffers. Then it checks that both ways gave the same tensors, bit for bit.
Run: ``OMP_NUM_THREADS=1 python bench/export_bench.py`` (``--dtype bf16`` halves the ~4.4 GB of fp32 weights).
"""
from __future__ import annotations

import argparse
import json
import shutil
import tempfile
import time
from pathlib import Path

CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 2048,
    "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2,
}


def status(field: str) -> float:
    """A ``/proc/self/status`` field in MB."""
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise KeyError(field)


def reset_peak() -> float:
    """Reset the high-water mark to the current RSS; returns the current RSS (MB)."""
    open("/proc/self/clear_refs", "w").write("5")
    return status("VmRSS")


def consume(pairs) -> tuple[int, int]:
    """What an engine's ``load_weights`` does with each tensor, minus the copy: touch it, drop it."""
    count = nbytes = 0
    for _, tensor in pairs:
        count += 1
        nbytes += tensor.numel() * tensor.element_size()
        tensor.view(-1)[:1].item()
        del tensor
    return count, nbytes


def build(dtype, layers: int):
    import torch

    from pai_zoo.families.registry import get_registry
    from pai_zoo.hf import models as hf
    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.compat import ensure_model_parallel

    family = get_registry().family("llama")
    config = family.to_mcore_config(hf.config_dict(hf.hf_config(family, {**CONFIG, "num_hidden_layers": layers})))
    ensure_model_parallel()
    model = build_gpt_model(family, config, dtype, perform_initialization=False)
    gen = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for p in model.parameters():
            p.uniform_(-0.02, 0.02, generator=gen)
    return model, family, config


def through_disk(model, config, dtype, root: Path):
    """dist_checkpointing.save + convert --to hf + the safetensors read back tensor by tensor."""
    from megatron.core import dist_checkpointing
    from safetensors import safe_open

    import pai_zoo
    from pai_zoo.formats import mcore_dist

    mcore, out = root / "mcore", root / "hf"
    (mcore / mcore_dist.RELEASE).mkdir(parents=True)
    mcore_dist.write_pai_zoo_config(mcore, config, 1, 1, dtype, model.embedding.word_embeddings.weight.shape[0])
    (mcore / mcore_dist.TRACKER).write_text(mcore_dist.RELEASE)
    dist_checkpointing.save(model.sharded_state_dict(), str(mcore / mcore_dist.RELEASE))
    pai_zoo.convert(mcore, out, "hf", progress=False)

    def pairs():
        for file in sorted(out.glob("*.safetensors")):
            with safe_open(str(file), framework="pt") as f:
                for name in f.keys():
                    yield name, f.get_tensor(name)

    return consume(pairs()), out


def same(model, out: Path) -> bool:
    import torch
    from safetensors import safe_open

    import pai_zoo

    files = {}
    for file in sorted(out.glob("*.safetensors")):
        with safe_open(str(file), framework="pt") as f:
            files.update({n: file for n in f.keys()})
    seen = 0
    for name, tensor in pai_zoo.export_hf_weights(model):
        with safe_open(str(files[name]), framework="pt") as f:
            if not torch.equal(f.get_tensor(name), tensor):
                return False
        seen += 1
    return seen == len(files)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--dtype", default="fp32", choices=("fp32", "bf16"))
    parser.add_argument("--layers", type=int, default=CONFIG["num_hidden_layers"], help="a smaller model to try")
    parser.add_argument("--dir", default=None, help="scratch folder for the way through disk (default: a temp dir)")
    args = parser.parse_args()
    import torch

    import pai_zoo

    torch.set_num_threads(1)
    dtype = torch.float32 if args.dtype == "fp32" else torch.bfloat16
    t = time.perf_counter()
    model, family, config = build(dtype, args.layers)
    params = sum(p.numel() for p in model.parameters())
    layer = max(sum(p.numel() * p.element_size() for p in block.parameters()) for block in model.decoder.layers)
    largest = max(p.numel() * p.element_size() for p in model.parameters())
    print(f"model: {params / 1e9:.2f}B parameters, {args.dtype}, built in {time.perf_counter() - t:.0f}s; "
          f"largest layer {layer / 2**20:.0f} MB, largest tensor {largest / 2**20:.0f} MB", flush=True)

    base = reset_peak()
    t = time.perf_counter()
    stream = pai_zoo.export_hf_weights(model)
    (live_count, live_bytes) = consume(stream)
    live = {"seconds": time.perf_counter() - t, "peak_mb": status("VmHWM") - base,
            "peak_bytes_mb": stream.peak_bytes / 2**20, "tensors": live_count, "gb": live_bytes / 1e9}
    print("live export:", json.dumps(live), flush=True)

    root = Path(args.dir) if args.dir else Path(tempfile.mkdtemp(prefix="pai-zoo-export-bench-"))
    try:
        base = reset_peak()
        t = time.perf_counter()
        (disk_count, disk_bytes), out = through_disk(model, config, dtype, root)
        disk = {"seconds": time.perf_counter() - t, "peak_mb": status("VmHWM") - base, "tensors": disk_count,
                "gb": disk_bytes / 1e9}
        print("through disk:", json.dumps(disk), flush=True)
        identical = same(model, out)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    print(f"identical tensors: {identical}; time: disk / live = {disk['seconds'] / live['seconds']:.1f}x; "
          f"peak memory above the model: live {live['peak_mb']:.0f} MB, disk {disk['peak_mb']:.0f} MB "
          f"(disk / live = {disk['peak_mb'] / max(live['peak_mb'], 1):.1f}x); bound (largest layer + tensor) "
          f"{(layer + largest) / 2**20:.0f} MB")


if __name__ == "__main__":
    main()
