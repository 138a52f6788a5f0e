"""``pai-zoo convert SRC DST --to mcore|hf``: Hugging Face folder <-> Megatron-Core checkpoint."""
from __future__ import annotations

from ..conversion.checks import check_request
from ..conversion.settings import DEFAULTS, QUANTIZE_CHOICES
from ..models.verification import VERIFY_TOLERANCES
from ._common import add_command, add_revision, hub_args

#: exit code of a conversion whose ``--verify`` comparison failed
VERIFY_FAILED = 3


def add_parser(subparsers) -> None:
    p = add_command(subparsers, "convert", "convert a Hugging Face folder <-> a Megatron-Core checkpoint")
    p.add_argument("src", help="Hugging Face folder or Hub id, org/name (--to mcore) or Megatron checkpoint, "
                               "pai-zoo's or Megatron-LM's (--to hf; a Megatron-LM one also --to mcore)")
    p.add_argument("dst", help="output folder (must not exist unless --force)")
    add_revision(p, "SRC")
    p.add_argument("--to", required=True, choices=("mcore", "hf", "hf-peft"),
                   help="mcore, hf, or hf-peft: a LoRA run's adapters as a Hugging Face PEFT folder")
    p.add_argument("--family", help="family name (default: detected from config.json / pai_zoo.json / the args)")
    p.add_argument("--tokenizer", metavar="DIR",
                   help="Megatron-LM source: copy this folder's tokenizer files; when it is the original HF folder, "
                        "its config.json supplies token ids, the true vocabulary and other fields Megatron "
                        "does not store (default: args.tokenizer_model when it is a folder)")
    p.add_argument("--iteration", help="Megatron source: the saved iteration to read, a number or 'release' "
                                       "(default: latest_checkpointed_iteration.txt)")
    p.add_argument("--tp", type=int, default=DEFAULTS.tp, help="tensor-parallel size the checkpoint is laid out for")
    p.add_argument("--pp", type=int, default=DEFAULTS.pp, help="pipeline-parallel size the checkpoint is laid out for")
    p.add_argument("--ep", type=int, default=DEFAULTS.ep,
                   help="expert-parallel size a mixture-of-experts checkpoint is laid out for (divides the experts)")
    p.add_argument("--etp", type=int, help="expert-tensor-parallel size (default: --tp)")
    p.add_argument("--dtype", choices=("bf16", "fp16", "fp32"),
                   help="store tensors in this dtype (default: as the source)")
    p.add_argument("--quantize", choices=QUANTIZE_CHOICES,
                   help="--to hf: write FP8 block-scaled weights (float8_e4m3fn with 128x128 weight_scale_inv, as "
                        "DeepSeek-V3 and Qwen3-FP8 publish them), reusing an FP8 source's scales where the weights "
                        "are unchanged; mxfp4: gpt-oss's MXFP4 experts (*_blocks, *_scales), an MXFP4 source's bytes "
                        "where the weights are unchanged (default: plain weights, --dtype)")
    p.add_argument("--no-mtp", action="store_true",
                   help="leave out the multi-token-prediction layers (num_nextn_predict_layers: DeepSeek-V3's and "
                        "GLM-4.5's model.layers.{num_hidden_layers}.*); a note says what was dropped")
    p.add_argument("--merge-lora", action="store_true",
                   help="a LoRA run, --to hf: its base with the adapters merged (W + alpha/r B A, as PEFT's "
                        "merge_and_unload)")
    p.add_argument("--max-shard-size", default=DEFAULTS.max_shard_size,
                   help="largest safetensors shard (--to hf), e.g. 5GB, 500MB")
    p.add_argument("--force", action="store_true", help="replace DST if it exists")
    p.add_argument("--verify", action="store_true",
                   help="compare both sides' logits on a sample prompt: OK when max |delta logits| <= "
                        "atol + rtol x max |logits|, per dtype (fp32 %s, fp16 %s, bf16 %s as atol,rtol; the "
                        "coarser stored dtype applies where --dtype changed it); exit %d if they differ"
                        % (*(",".join(f"{x:g}" for x in VERIFY_TOLERANCES[d]) for d in ("fp32", "fp16", "bf16")),
                           VERIFY_FAILED))
    p.add_argument("--verify-tolerance", metavar="ATOL[,RTOL]",
                   help="--verify with this rule instead: max |delta logits| <= ATOL + RTOL x max |logits| "
                        "(RTOL 0 when left out); implies --verify")
    p.set_defaults(func=run)


def run(args) -> int:
    hub_args(args, "src")  # a Hub id: its snapshot in the Hugging Face cache
    # the source, the flags that go together and DST, refused before torch and megatron-core are imported
    check_request(args.src, args.dst, args.to, family=args.family, tp=args.tp, pp=args.pp, dtype=args.dtype,
                  force=args.force, tokenizer=args.tokenizer, iteration=args.iteration,
                  verify_tolerance=args.verify_tolerance, ep=args.ep, etp=args.etp, quantize=args.quantize,
                  merge_lora=args.merge_lora)
    from ..conversion.entry import convert, describe_verification

    report = convert(
        args.src, args.dst, args.to, family=args.family, tp=args.tp, pp=args.pp, dtype=args.dtype,
        force=args.force, max_shard_size=args.max_shard_size, verify=args.verify or args.verify_tolerance is not None,
        progress=None, tokenizer=args.tokenizer, iteration=args.iteration, verify_tolerance=args.verify_tolerance,
        quantize=args.quantize, no_mtp=args.no_mtp, merge_lora=args.merge_lora,
        ep=args.ep, etp=args.etp,
    )
    for note in report.notes:
        print(note)
    rate = report.bytes / report.seconds / 1e9 if report.seconds else 0.0
    print(f"converted {report.src} -> {report.dst} ({report.family}, to {report.to}): {report.tensors} tensors, "
          f"{report.bytes / 1e9:.3f} GB in {report.seconds:.1f} s ({rate:.2f} GB/s)")
    if report.verification is not None:
        print(describe_verification(report.verification))
    return 0 if report.ok else VERIFY_FAILED
