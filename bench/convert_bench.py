"""Conversion benchmark: a ~1.1B-parameter Llama-architecture checkpoint in bf16, HF -> mcore -> HF.

Generates random weights locally (TinyLlama-1.1B's shape: 22 layers, hidden 2048, GQA 32/4,
vocabulary 32000), written as sharded safetensors; ``--case moe``: a ~0.95B-parameter Mixtral-architecture
mixture of experts instead (16 layers, hidden 1024, GQA 16/4, 16 experts of width 1024 per layer, top-2,
vocabulary 32000; 768 per-expert tensors); ``--case moe-fp8``: that mixture of experts with 18 layers (~1.07B
parameters) stored as the FP8 block-scaled releases are (float8_e4m3fn projections and experts with float32
``weight_scale_inv`` per 128x128 block; embeddings, norms, router and head in bf16), converted HF -> mcore (each
weight dequantized while it streams) and back with ``--quantize fp8-block``.
Then, on the same disk:

* copies the safetensors bytes with a plain file copy (the physical limit),
* converts HF -> Megatron-Core and Megatron-Core -> HF, each in a fresh process that reports
  its wall time and its peak resident memory above the interpreter and imports,

and prints GB/s, peak RSS and the ratio of each conversion's time to the copy's. Targets
(issue #3): within 2x of the copy, peak RSS under 1.5 GB. Run: ``python bench/convert_bench.py``.
"""
from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

CONFIG = {
    "model_type": "llama", "architectures": ["LlamaForCausalLM"], "vocab_size": 32000, "hidden_size": 2048,
    "intermediate_size": 5632, "num_hidden_layers": 22, "num_attention_heads": 32, "num_key_value_heads": 4,
    "max_position_embeddings": 2048, "rms_norm_eps": 1e-5, "rope_theta": 10000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
}

#: ``--case moe``: Mixtral's layout, 16 experts per layer (~0.95B parameters).
MOE_CONFIG = {
    "model_type": "mixtral", "architectures": ["MixtralForCausalLM"], "vocab_size": 32000, "hidden_size": 1024,
    "intermediate_size": 1024, "num_hidden_layers": 16, "num_attention_heads": 16, "num_key_value_heads": 4,
    "num_local_experts": 16, "num_experts_per_tok": 2, "router_aux_loss_coef": 0.02, "sliding_window": None,
    "max_position_embeddings": 4096, "rms_norm_eps": 1e-5, "rope_theta": 1000000.0, "hidden_act": "silu",
    "tie_word_embeddings": False, "bos_token_id": 1, "eos_token_id": 2, "torch_dtype": "bfloat16",
}

#: ``--case moe-fp8``: the MoE case deeper (18 layers, ~1.07B parameters), in FP8 blocks.
MOE_FP8_CONFIG = {**MOE_CONFIG, "num_hidden_layers": 18,
                  "quantization_config": {"activation_scheme": "dynamic", "fmt": "e4m3", "quant_method": "fp8",
                                          "weight_block_size": [128, 128]}}

CHILD = r"""
import json, sys, time
import torch
torch.set_num_threads(2)
import pai_zoo, pai_zoo.conversion, megatron.core.models.gpt, transformers  # the imports, before the baseline
from pai_zoo.mcore.compat import ensure_model_parallel
ensure_model_parallel()
def status(field):
    for line in open("/proc/self/status"):
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024

open("/proc/self/clear_refs", "w").write("5")  # reset the high-water mark to the current RSS
base = status("VmRSS")
t = time.perf_counter()
report = pai_zoo.conversion.convert(sys.argv[1], sys.argv[2], sys.argv[3], progress=False,
                                    **({"quantize": sys.argv[4]} if len(sys.argv) > 4 else {}))
seconds = time.perf_counter() - t
peak = status("VmHWM")
print(json.dumps({"seconds": seconds, "bytes": report.bytes, "tensors": report.tensors,
                  "peak_mb": peak, "baseline_mb": base}))
"""


def tensor_plan(c: dict) -> list[tuple[str, tuple[int, ...]]]:
    """The checkpoint's tensors (names and shapes) for config ``c``: Llama's, or Mixtral's per-expert ones."""
    h, f, v, kv = c["hidden_size"], c["intermediate_size"], c["vocab_size"], c["num_key_value_heads"]
    d = h // c["num_attention_heads"]
    experts = c.get("num_local_experts", 0)
    plan = [("model.embed_tokens.weight", (v, h))]
    for i in range(c["num_hidden_layers"]):
        p = f"model.layers.{i}."
        plan += [(p + "input_layernorm.weight", (h,)), (p + "self_attn.q_proj.weight", (h, h)),
                 (p + "self_attn.k_proj.weight", (kv * d, h)), (p + "self_attn.v_proj.weight", (kv * d, h)),
                 (p + "self_attn.o_proj.weight", (h, h)), (p + "post_attention_layernorm.weight", (h,))]
        if experts:
            moe = p + "block_sparse_moe."
            plan.append((moe + "gate.weight", (experts, h)))
            for e in range(experts):
                plan += [(f"{moe}experts.{e}.w1.weight", (f, h)), (f"{moe}experts.{e}.w3.weight", (f, h)),
                         (f"{moe}experts.{e}.w2.weight", (h, f))]
        else:
            plan += [(p + "mlp.gate_proj.weight", (f, h)), (p + "mlp.up_proj.weight", (f, h)),
                     (p + "mlp.down_proj.weight", (h, f))]
    plan += [("model.norm.weight", (h,)), ("lm_head.weight", (v, h))]
    return plan


def _fp8(name: str, shape) -> bool:
    """What the FP8 releases store in FP8: the decoder layers' projections and experts (not norms or the router)."""
    return len(shape) == 2 and name.startswith("model.layers.") and not name.endswith("gate.weight")


def generate(folder: Path, shard_size: str, config: dict = CONFIG) -> int:
    """Random bf16 weights of ``config`` written tensor by tensor (FP8 blocks with their scales where its
    ``quantization_config`` says so); returns the bytes written."""
    import torch

    from pai_zoo.formats.encodings.fp8_blocks import quantize, scale_name, scale_shape
    from pai_zoo.formats.hf_folder import SafetensorsWriter

    plan, fp8 = tensor_plan(config), "quantization_config" in config
    entries = []
    for n, shape in plan:
        if fp8 and _fp8(n, shape):
            entries += [(n, shape, torch.float8_e4m3fn), (scale_name(n), scale_shape(shape), torch.float32)]
        else:
            entries.append((n, shape, torch.bfloat16))
    folder.mkdir(parents=True)
    writer = SafetensorsWriter(folder, entries, shard_size)
    gen = torch.Generator().manual_seed(0)
    for name, shape in plan:
        weight = (torch.randn(shape, generator=gen) * 0.02).to(torch.bfloat16)
        if fp8 and _fp8(name, shape):
            q, inv = quantize(weight)
            writer.write(name, q)
            writer.write(scale_name(name), inv)
        else:
            writer.write(name, weight)
    writer.close()
    (folder / "config.json").write_text(json.dumps(config, indent=2))
    return writer.total_size


def timed_copy(src: Path, dst: Path) -> float:
    """A plain copy of the safetensors files, made durable (fsync) as the converter's output is."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir()
    os.sync()
    start = time.perf_counter()
    for file in sorted(src.glob("*.safetensors")):
        shutil.copyfile(file, dst / file.name)
        with open(dst / file.name, "rb+") as f:
            os.fsync(f.fileno())
    return time.perf_counter() - start


def timed_user_copy(src: Path, dst: Path) -> float:
    """The same copy through user space (read + write, 64 MB at a time, fsync): what any
    converter that touches the bytes pays at least."""
    shutil.rmtree(dst, ignore_errors=True)
    dst.mkdir()
    os.sync()
    start = time.perf_counter()
    for file in sorted(src.glob("*.safetensors")):
        with open(file, "rb") as a, open(dst / file.name, "wb") as b:
            while chunk := a.read(64 << 20):
                b.write(chunk)
            b.flush()
            os.fsync(b.fileno())
    return time.perf_counter() - start


def run_conversion(src: Path, dst: Path, to: str, quantize: str | None = None) -> dict:
    shutil.rmtree(dst, ignore_errors=True)
    os.sync()
    argv = [sys.executable, "-c", CHILD, str(src), str(dst), to, *([quantize] if quantize else [])]
    out = subprocess.run(argv, capture_output=True, text=True,
                         env={**os.environ, "OMP_NUM_THREADS": "2"})
    if out.returncode != 0:
        raise SystemExit(f"conversion to {to} failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def _numel(shape) -> int:
    n = 1
    for d in shape:
        n *= d
    return n


def _fmt(values) -> str:
    return ", ".join(f"{v:.2f}" for v in values)


def same_tensors(a: Path, b: Path) -> bool:
    import torch

    from pai_zoo.formats.hf_folder import HFCheckpoint

    left, right = HFCheckpoint(a), HFCheckpoint(b)

    def same(x, y):
        return x.dtype == y.dtype and x.shape == y.shape and torch.equal(x.view(torch.uint8), y.view(torch.uint8))

    return set(left.names()) == set(right.names()) and all(same(left.get(n), right.get(n)) for n in left.names())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--workdir", help="folder on the disk to measure (default: a temporary folder)")
    parser.add_argument("--shard-size", default="1GB")
    parser.add_argument("--keep", action="store_true", help="keep the generated checkpoints")
    parser.add_argument("--rounds", type=int, default=3, help="interleaved rounds of copy and conversions (medians)")
    parser.add_argument("--case", choices=("dense", "moe", "moe-fp8"), default="dense",
                        help="dense: the Llama-shaped 1.1B model; moe: the Mixtral-shaped 0.95B one with 16 experts; "
                             "moe-fp8: an 18-layer 1.07B one in FP8 blocks")
    args = parser.parse_args()
    config = {"dense": CONFIG, "moe": MOE_CONFIG, "moe-fp8": MOE_FP8_CONFIG}[args.case]
    quantize = "fp8-block" if "quantization_config" in config else None
    work = Path(args.workdir or tempfile.mkdtemp(prefix="pai-zoo-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        t = time.perf_counter()
        size = generate(work / "hf", args.shard_size, config)
        plan = tensor_plan(config)
        kind = "FP8 block-scaled" if quantize else "bf16"
        print(f"generated {size / 1e9:.2f} GB of {kind} safetensors ({config['num_hidden_layers']} layers, "
              f"{config.get('num_local_experts', 0)} experts per layer, {len(plan)} tensors, "
              f"{sum(_numel(s) for _, s in plan) / 1e9:.2f}B parameters) in {time.perf_counter() - t:.1f} s")
        # The disk's write speed swings from run to run: interleave the runs and take medians.
        copies, user_copies, runs = [], [], {"mcore": [], "hf": []}
        for _ in range(args.rounds):
            copies.append(timed_copy(work / "hf", work / "copy"))
            user_copies.append(timed_user_copy(work / "hf", work / "copy"))
            runs["mcore"].append(run_conversion(work / "hf", work / "mcore", "mcore"))
            runs["hf"].append(run_conversion(work / "mcore", work / "hf-back", "hf", quantize))
        copy, user_copy = statistics.median(copies), statistics.median(user_copies)
        print(f"plain copy:    {copy:6.2f} s  {size / copy / 1e9:5.2f} GB/s  (shutil.copyfile; runs: {_fmt(copies)} s)")
        print(
            f"user copy:     {user_copy:6.2f} s  {size / user_copy / 1e9:5.2f} GB/s  "
            f"(read + write; runs: {_fmt(user_copies)} s)"
        )
        results = {}
        for to, rs in runs.items():
            seconds = statistics.median(r["seconds"] for r in rs)
            r = results[to] = {"seconds": seconds, "peak_mb": max(r["peak_mb"] for r in rs),
                               "above_mb": max(r["peak_mb"] - r["baseline_mb"] for r in rs)}
            print(f"to {to:<5}:     {seconds:6.2f} s  {size / seconds / 1e9:5.2f} GB/s  "
                  f"peak RSS {r['peak_mb']:6.0f} MB ({r['above_mb']:5.0f} MB above imports)  "
                  f"ratio to copy {seconds / copy:4.2f}x, to user copy {seconds / user_copy:4.2f}x  "
                  f"(runs: {_fmt(x['seconds'] for x in rs)} s)")
        identical = same_tensors(work / "hf", work / "hf-back")
        print(f"HF -> mcore -> HF bit-identical: {identical}")
        worst = max(r["seconds"] for r in results.values())
        peak = max(r["peak_mb"] for r in results.values())
        print(f"RESULT: worst ratio {worst / copy:.2f}x to shutil.copyfile, {worst / user_copy:.2f}x to a user-space "
              f"copy (target <= 2.0); peak RSS {peak:.0f} MB (target < 1536)")
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    main()
