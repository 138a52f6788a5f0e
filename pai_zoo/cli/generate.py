"""``pai-zoo generate``: complete prompts from JSON Lines into JSON Lines, or stream one ``--prompt``."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from ..generation import GenerationError, SamplingParams, generate, read_prompts
from ..generation.images import record_images, with_image_paths
from ..mcore.parallel_sizes import check_world
from ..models.handle import load, resolve
from ..models.tokenizer_fit import check_tokenizer_fit
from ..plugin.errors import SettingError
from ..util.dist import is_rank0
from ..util.outputs import check_output, output_file
from ._checks import check_inputs, check_model_name
from ._common import add_command, add_revision, defaults, hub_args, registry

#: prompts per forward pass when the command line does not say
BATCH_SIZE = 8


def add_parser(subparsers) -> None:
    sampling = defaults(SamplingParams)
    p = add_command(subparsers, "generate", "complete prompts (JSON Lines in and out, or one streamed --prompt)")
    p.add_argument("--model", required=True, help="Megatron checkpoint (pai-zoo's or Megatron-LM's), Hugging Face "
                                                  "folder or Hub id (org/name), or preset")
    p.add_argument("--tokenizer", metavar="DIR", help="Megatron-LM checkpoint: the original HF folder (its tokenizer "
                                                      "and config.json)")
    p.add_argument("--iteration", help="Megatron checkpoint: a saved iteration other than the tracker's")
    add_revision(p, "--model")
    p.add_argument("--prompts", help='JSON Lines: {"prompt": ...} (or {"messages": [...]} with --chat) per line')
    p.add_argument("--output", help="JSON Lines: each input record plus completion, token_ids, stop_reason (must "
                                    "not exist unless --force)")
    p.add_argument("--force", action="store_true", help="replace --output if it exists")
    p.add_argument("--prompt", help="one prompt; the completion is streamed to stdout")
    p.add_argument("--image", action="append", metavar="PATH",
                   help="an image for --prompt (repeatable, in order): a vision-language model reads it where the "
                        "prompt's placeholder stands, or, with --chat, before the text. In --prompts files: an "
                        '"images" list per record, or {"type": "image", "image": PATH} entries in a chat\'s '
                        "content (paths relative to the file)")
    p.add_argument("--video", action="append", metavar="PATH",
                   help="a video for --prompt (repeatable, in order): a folder of frames (image files, sorted by "
                        "name) or a video file (needs a decoder: pip install av); read where the prompt's video "
                        'placeholder stands or, with --chat, before the text. In --prompts files: a "videos" list '
                        'per record, or {"type": "video", "video": PATH} entries in a chat\'s content')
    p.add_argument("--max-new-tokens", type=int, default=sampling["max_new_tokens"])
    p.add_argument("--temperature", type=float, default=sampling["temperature"], help="0 = greedy")
    p.add_argument("--top-k", type=int, default=sampling["top_k"],
                   help="sample from the k most likely tokens (0 = all)")
    p.add_argument("--top-p", type=float, default=sampling["top_p"],
                   help="nucleus sampling probability mass (1.0 = all)")
    p.add_argument("--seed", type=int, default=sampling["seed"], help="seed for reproducible sampling")
    p.add_argument("--chat", action="store_true", help="apply the tokenizer's chat template (ChatML if it has none)")
    p.add_argument("--batch-size", type=int, default=BATCH_SIZE, help="prompts per forward pass")
    p.add_argument("--stop", nargs="+", metavar="S", help="strings that end a completion")
    p.add_argument("--truncate", choices=("left",), help="drop the oldest prompt tokens that do not fit the context")
    p.add_argument("--backend", choices=("mcore", "hf"), default="mcore")
    p.add_argument("--tp", type=int, default=1, help="tensor-parallel size (run under torchrun)")
    p.add_argument("--adapter", metavar="DIR",
                   help="apply a LoRA adapter without merging: a LoRA run folder (train --peft lora) or a Hugging "
                        "Face PEFT folder")
    p.add_argument("--threads", type=int, help="torch CPU threads")
    p.add_argument("--tokenizer-mismatch-ok", action="store_true",
                   help="go on with a tokenizer that does not fit the model's config (another model's vocabulary "
                        "or special-token ids), which is refused otherwise")
    p.set_defaults(func=run)


def run(args, out=None) -> int:
    """Prompts from JSON Lines to JSON Lines, or one ``--prompt`` streamed to ``out`` (stdout). The
    output file appears only when every prompt is done (written to a temporary name, renamed at the
    end). Under ``torchrun`` with ``--tp N`` rank 0 writes."""

    out = out or sys.stdout
    if (args.prompt is None) == (args.prompts is None):
        raise GenerationError("give either --prompt TEXT or --prompts FILE.jsonl --output OUT.jsonl")
    if args.prompts is not None and args.output is None:
        raise GenerationError("--prompts needs --output OUT.jsonl")
    if args.tp < 1:
        raise GenerationError(f"--tp must be positive (got {args.tp})")

    check_world(args.tp)  # --tp 3 in one process: the torchrun command to use, before anything loads
    hub_args(args, "model")  # Hub ids: their snapshots in the Hugging Face cache
    check_model_name(args.model, registry())  # the flags' values were checked as argparse read them (_checks)
    check_inputs((args.tokenizer, "--tokenizer"), (args.adapter, "--adapter"), (args.prompts, "--prompts"),
                 *((image, "--image") for image in args.image or ()),
                 *((video, "--video") for video in args.video or ()))
    if any(not stop for stop in args.stop or ()):
        raise SettingError("--stop: give non-empty strings")
    if (args.image or args.video) and args.prompt is None:
        raise GenerationError("--image and --video go with --prompt; a --prompts file names its images and videos "
                              "per record")
    if args.output is not None:  # exists, not writable: refused before anything loads
        check_output(args.output, force=args.force, flag="--output", echo=is_rank0())
    if args.prompt is not None:
        paths, clips = list(args.image or ()), list(args.video or ())
        content = [*({"type": "image", "image": p} for p in paths), *({"type": "video", "video": v} for v in clips),
                   {"type": "text", "text": args.prompt}]
        chat = [{"role": "user", "content": content if paths or clips else args.prompt}]
        images = [[] if args.chat else paths]  # a chat names its images and videos in its content
        videos = [[] if args.chat else clips]
        records = [("--prompt", {"prompt": args.prompt}, chat if args.chat else args.prompt)]
    else:
        records = read_prompts(args.prompts, chat=args.chat)
        images = [record_images(record, Path(args.prompts).parent, where) for where, record, _ in records]
        videos = [record_images(record, Path(args.prompts).parent, where, "videos") for where, record, _ in records]
        records = [(where, record, with_image_paths(prompt, Path(args.prompts).parent, where))
                   for where, record, prompt in records]
    labels = [where for where, _, _ in records]
    prompts = [prompt for _, _, prompt in records]
    check_tokenizer_fit(resolve(args.model, tokenizer=args.tokenizer, iteration=args.iteration),  # before it loads
                        ok=args.tokenizer_mismatch_ok, where=args.model)
    import torch


    if args.threads:
        torch.set_num_threads(args.threads)
    handle = load(args.model, backend=args.backend, tensor_parallel_size=args.tp if args.tp > 1 else None,
                  tokenizer=args.tokenizer, iteration=args.iteration, adapter=args.adapter)
    rank0 = is_rank0()
    options = dict(max_new_tokens=args.max_new_tokens, temperature=args.temperature, top_k=args.top_k,
                   top_p=args.top_p, seed=args.seed, stop=tuple(args.stop or ()), chat=args.chat,
                   truncate=args.truncate, batch_size=args.batch_size, images=images, videos=videos)
    if args.prompt is not None:
        def stream(_index, delta):
            if rank0:
                out.write(delta)
                out.flush()

        [result] = generate(handle, prompts, on_text=stream, labels=labels, **options)
        if rank0:
            out.write("\n")
            print(f"[{result.stop_reason}: {len(result.token_ids)} tokens]", file=sys.stderr)
        return 0
    results = generate(handle, prompts, labels=labels, **options)
    if rank0:
        target = Path(args.output)
        with output_file(target, force=args.force) as temporary, open(temporary, "w", encoding="utf-8") as sink:
            for (_, record, _), result in zip(records, results):
                sink.write(json.dumps({**record, **result.to_json()}, ensure_ascii=False) + "\n")
        print(f"generated {len(results)} completions ({sum(len(r.token_ids) for r in results)} tokens) -> {target}",
              file=sys.stderr)
    return 0
