"""``pai_zoo.load``: one entry point for presets, families and checkpoint folders, in both backends."""
from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from .. import formats
from ..families.family import Family
from ..families.registry import get_registry
from ..formats.hf_folder import CONFIG, read_config
from ..formats.integrity import verify_checkpoint
from ..formats.megatron_folder import TRACKER, iteration_dir
from ..hf import models as hf
from ..lora.run import adapter_source, check_base
from ..lora.settings import LoraError
from ..mcore import import_megatron
from ..mcore.parallel_sizes import check_layout
from ..plugin.config_map import McoreConfig
from ..plugin.errors import PaiZooError, PaiZooWarning, SettingError, UnknownModelError
from ..plugin.vision import check_vision_inputs
from ..tables.mapping import TO_MCORE, MappingContext
from ..tokenizers.names import model_files_folder, model_tokenizer
from ..util.dist import is_rank0, shared_temporary_folder, single_process_env
from ..util.hub import hub_paths, local_path
from .state_dicts import hf_state_dict, load_hf_checkpoint_state, load_into, mcore_tensors, mcore_to_hf

BACKENDS = ("mcore", "hf")


@dataclass
class ModelHandle:
    """A loaded model and what belongs with it.

    ``model`` is a megatron-core ``GPTModel`` (backend ``"mcore"``) or a transformers model
    (``"hf"``); ``config`` is that backend's own config (``TransformerConfig`` or the
    transformers config); ``hf_config`` and ``mcore_config`` are both translations, always
    present; ``tokenizer`` is set when the checkpoint carries one, and for a test preset
    (``llama3-tiny``) it is the family's test tokenizer (see :func:`pai_zoo.tokenizers.names.model_tokenizer`).
    """

    model: Any
    family: Family
    backend: str
    hf_config: Any
    mcore_config: McoreConfig
    tokenizer: Any = None
    checkpoint: Path | None = None
    files: Path | None = None  # the folder of its tokenizer and processor files (a checkpoint's, a test preset's)

    @property
    def config(self):
        return self.model.config

    @property
    def vocab_size(self) -> int:
        return self.mcore_config["vocab_size"]

    def logits(self, input_ids, attention_mask=None, pixel_values=None, image_grid_thw=None, pixel_values_videos=None,
               video_grid_thw=None, second_per_grid_ts=None, **processor_outputs):
        """Next-token logits ``FloatTensor[batch, seq, vocab]``, vocabulary padding trimmed.

        ``attention_mask`` (``[batch, seq]``, 1 = real token) handles padded batches: padding is
        masked out and each row's positions count from its first real token, in both backends.
        A vision-language family also takes transformers' own inputs (``pixel_values``, ``image_grid_thw``,
        ``pixel_values_videos``, ``video_grid_thw``, ``second_per_grid_ts``: :data:`pai_zoo.vision.VISION_INPUTS`),
        as its processor makes them, and the other outputs of its processor that the family reads
        (``processor_outputs``: :attr:`pai_zoo.vision.VisionSpec.inputs`, such as Gemma 3's ``token_type_ids``); its
        position ids are the family's (:attr:`pai_zoo.vision.VisionSpec.positions`).
        """
        import torch

        from ..mcore.forward import causal_mask

        input_ids = torch.as_tensor(input_ids)
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        vision = check_vision_inputs(self.family, {
            "pixel_values": pixel_values, "image_grid_thw": image_grid_thw, "pixel_values_videos": pixel_values_videos,
            "video_grid_thw": video_grid_thw, "second_per_grid_ts": second_per_grid_ts, **processor_outputs})
        with torch.no_grad():
            if self.backend == "hf":
                if self.family.vision is not None:
                    out = self._hf_vision_logits(input_ids, attention_mask, vision)
                else:
                    positions = None if attention_mask is None else causal_mask(input_ids, attention_mask)[1]
                    out = self.model(input_ids=input_ids, attention_mask=attention_mask,
                                     position_ids=positions).logits
            else:
                from ..mcore.pipeline import forward_logits

                positions = None
                if self.family.vision is not None and self.family.vision.positions is not None:
                    positions = self.family.vision.positions(self.mcore_config, input_ids, attention_mask, **{
                        k: vision.get(k) for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")})
                out = forward_logits(self.model, input_ids, attention_mask, positions, **vision)
        return out[..., : self.vocab_size]

    def _hf_vision_logits(self, input_ids, attention_mask, vision):
        """transformers' vision-language forward: its own position ids (``get_rope_index``), with the token types
        its processor gives (``mm_token_type_ids``) made from the placeholder ids."""

        from ..mcore.forward import causal_mask

        spec = self.family.vision
        types = self.hf_vision_inputs(input_ids)
        kwargs = {k: v for k, v in vision.items() if v is not None}
        if spec.positions is None:  # plain positions: each row's counted from its first real token
            positions = None if attention_mask is None else causal_mask(input_ids, attention_mask)[1]
            return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions,
                              **{**types, **kwargs}).logits
        spec.positions(self.mcore_config, input_ids, attention_mask, **{  # the same refusals
            k: kwargs.get(k) for k in ("image_grid_thw", "video_grid_thw", "second_per_grid_ts")})
        if not kwargs:  # text only: transformers counts positions from 0 on every row; padding as the mcore side
            positions = None if attention_mask is None else spec.positions(self.mcore_config, input_ids, attention_mask)
            return self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
        return self.model(input_ids=input_ids, attention_mask=attention_mask, **{**types, **kwargs}).logits

    def hf_vision_inputs(self, input_ids) -> dict:
        """The keyword arguments the transformers forward needs besides the processor's pixels, made from the
        prompt (:attr:`pai_zoo.vision.VisionSpec.hf_inputs`; by default Qwen's :meth:`vision_token_types`)."""
        spec = self.family.vision
        return self.vision_token_types(input_ids) if spec.hf_inputs is None else spec.hf_inputs(
            self.mcore_config, input_ids)

    def vision_token_types(self, input_ids) -> dict:
        """``{"mm_token_type_ids": ...}``: text 0, image 1, video 2 per token, as transformers' Qwen2-VL processor
        gives them (its model needs them for M-RoPE)."""
        import torch

        ids = self.family.vision.placeholders(self.mcore_config)
        types = torch.zeros_like(input_ids, dtype=torch.int32)
        types[input_ids == ids["image"]] = 1
        types[input_ids == ids["video"]] = 2
        return {"mm_token_type_ids": types}

    def hf_state_dict(self) -> dict:
        """The weights under Hugging Face names (converted when the backend is megatron-core)."""
        if self.backend == "hf":
            return dict(self.model.state_dict())

        return mcore_to_hf(self.family, self.mcore_config, mcore_tensors(self.model))


@dataclass
class Source:
    """What :func:`load` was pointed at: the family, its HF config dict and, for a checkpoint,
    its folder and kind (``"hf"`` folder or ``"mcore"`` distributed checkpoint); for a preset, its name."""

    family: Family
    hf_config: dict
    path: Path | None = None
    kind: str = "preset"
    mcore_config: McoreConfig | None = None
    record: dict | None = None
    preset: str | None = None
    tokenizer_dir: Path | None = None  # kind "megatron-lm": the folder given as tokenizer= (or args.tokenizer_model)
    iteration: int | str | None = None  # kind "megatron-lm": the saved iteration read (None: the tracker's)
    format: str | None = None  # the folder's format (pai_zoo.formats.detect)
    weights_folder: Path | None = None  # kind "mcore": the iteration folder megatron-core's loader reads

    def open_megatron(self):
        """The Megatron checkpoint (kinds ``"mcore"`` and ``"megatron-lm"``) as a ``MegatronCheckpoint``."""
        from .megatron_checkpoint import open_megatron

        described = self.kind == "megatron-lm" and self.mcore_config is not None  # resolve read its args
        return open_megatron(self.path, self.family, reference=self.tokenizer_dir, iteration=self.iteration,
                             format=self.format, config=self.mcore_config if described else None,
                             record=self.record if described else None)


def resolve(name_or_path, checkpoint=None, *, tokenizer=None, iteration=None, revision=None) -> Source:
    """Work out what ``name_or_path`` (and ``checkpoint``) name; see :func:`load`. A folder's format is
    :func:`pai_zoo.formats.detect`'s. A Hugging Face Hub id (``org/name``, no local path) is its snapshot in the
    Hugging Face cache, downloaded when missing (:mod:`pai_zoo.util.hub`; ``revision`` picks a branch, tag or
    commit)."""
    name_or_path, checkpoint, tokenizer = hub_paths(revision, name_or_path, checkpoint, tokenizer=tokenizer)
    registry = get_registry()
    name = str(name_or_path)
    path = Path(checkpoint) if checkpoint is not None else Path(name)
    family = None
    if checkpoint is None and registry.is_preset(name):
        family, config = registry.preset(name)
        return Source(family, config, preset=name)
    if registry.is_family(name):
        family = registry.family(name)
        if checkpoint is None:
            return Source(family, dict(family.presets[family.tiny]))
    elif checkpoint is not None and registry.is_preset(name):
        family = registry.preset(name)[0]
    elif checkpoint is not None:
        raise UnknownModelError(registry._unknown(name))
    if checkpoint is None and not path.is_dir():
        raise UnknownModelError(registry._unknown(name))
    try:
        kind = formats.detect(path, iteration=iteration)
    except formats.UnknownFormatError as exc:
        raise UnknownModelError(f"checkpoint {path}: no config.json (Hugging Face) or {TRACKER} (Megatron-Core) "
                                f"there ({str(exc).removeprefix(f'{path}: ')})") from None
    if kind == "lora-run":
        raise LoraError(f"{path}: a LoRA run holds adapters, not a model; load its base with the adapter "
                        f"(pai_zoo.load(BASE, adapter={str(path)!r}), generate BASE --adapter {path}), or merge it "
                        f"(pai-zoo convert {path} DIR --to hf --merge-lora)")
    if kind == "rl-run":
        path = path / "actor"
        kind = formats.detect(path, iteration=iteration)
    if kind in formats.MEGATRON_LM + formats.PAI_ZOO_MCORE + ("hf",):  # each file whole: a truncated one is named
        verify_checkpoint(path, kind, iteration)
    if kind in formats.MEGATRON_LM or (iteration is not None and kind in formats.PAI_ZOO_MCORE):
        from .megatron_checkpoint import describe

        kind = "megatron-lm" if kind in formats.PAI_ZOO_MCORE else kind  # pai-zoo's, at another iteration
        info = describe(path, family=family.name if family else None, reference=tokenizer, iteration=iteration,
                        format=kind)
        info.checkpoint.close()
        _warn(info.derived.notes)
        family, config = info.derived.family, info.derived.config
        tokenizer_dir = Path(tokenizer) if tokenizer else info.derived.reference
        return Source(family, hf.config_dict(hf.hf_config_from_mcore(family, config)), path, "megatron-lm", config,
                      info.record(), tokenizer_dir=tokenizer_dir, iteration=iteration, format=kind)
    if kind in formats.PAI_ZOO_MCORE:
        with formats.open_checkpoint(path, format=kind) as opened:
            record, weights_folder = opened.record, opened.folder
        config = McoreConfig(**record["mcore_config"])
        family = family or registry.family(config.family)
        return Source(family, hf.config_dict(hf.hf_config_from_mcore(family, config)), path, "mcore", config, record,
                      format=kind, weights_folder=weights_folder)
    if kind == "hf":
        config = read_config(path)
        family = family or registry.family_for_hf_config(config, where=str(path / CONFIG))
        return Source(family, config, path, "hf", format=kind)
    raise UnknownModelError(f"{path}: a {kind} folder holds no model to load; give it as adapter= with its base")


def _warn(notes: list[str]) -> None:
    import warnings


    for note in notes:
        if note.startswith("warning: "):
            warnings.warn(note.removeprefix("warning: "), PaiZooWarning, stacklevel=3)


def load(
    name_or_path,
    backend: str = "mcore",
    checkpoint=None,
    *,
    dtype=None,
    seed: int = 0,
    tensor_parallel_size: int | None = None,
    pipeline_parallel_size: int | None = None,
    tokenizer=None,
    iteration=None,
    mtp: bool = False,
    adapter=None,
    revision=None,
    **overrides,
) -> ModelHandle:
    """Load a model as a :class:`ModelHandle`.

    ``name_or_path`` is a preset (``"llama3-tiny"``), a family name or alias (with
    ``checkpoint=`` a folder; alone it builds the family's tiny preset), a Hugging Face
    checkpoint folder (family detected from its ``config.json``), a Megatron-Core checkpoint
    written by ``pai-zoo convert`` (family and config from its ``pai_zoo.json``) or one that Megatron-LM wrote
    (``torch_dist`` or legacy ``torch``; family and config from its args, ``tokenizer`` the original HF folder
    with the tokenizer and the config.json fields Megatron does not store, ``iteration`` a saved iteration
    other than the tracker's). Without a
    checkpoint the weights are random (seeded by ``seed``). ``overrides`` replace HF config
    fields (``num_hidden_layers=4``). ``backend="mcore"`` gives a megatron-core ``GPTModel``,
    ``backend="hf"`` a transformers model. Under ``torchrun``, ``tensor_parallel_size`` and
    ``pipeline_parallel_size`` shard the megatron-core model (from a Megatron-Core checkpoint). ``mtp=True``
    builds the megatron-core model with its multi-token-prediction layers (``model.mtp``, as training does) and
    loads them; by default they are left out, as transformers leaves them out. ``adapter``: a LoRA run folder
    (``train --peft lora --save RUN``, checked to be trained on this base) or a Hugging Face PEFT LoRA folder,
    applied without merging (megatron-core: pai-zoo's adapters, :mod:`pai_zoo.lora.adapters`; transformers: PEFT's
    ``PeftModel``, for a PEFT folder). ``name_or_path`` (or ``checkpoint``) may be a Hugging Face Hub id,
    ``"org/name"``: its snapshot in the Hugging Face cache, downloaded when missing, at ``revision`` (a branch, tag
    or commit; default the default branch); ``tokenizer`` and ``adapter`` too, at their default branch (docs/hub.md).
    """
    import torch


    if backend not in BACKENDS:
        raise SettingError(f"backend={backend!r}: use one of {', '.join(BACKENDS)} (megatron-core or transformers)")
    source = resolve(name_or_path, checkpoint, tokenizer=tokenizer, iteration=iteration, revision=revision)
    adapter = local_path(adapter)  # a Hub id: its snapshot (default branch)
    family = source.family
    if overrides and source.kind in ("mcore", "megatron-lm"):
        raise PaiZooError(
            f"{source.path}: config overrides {sorted(overrides)} cannot change a trained Megatron checkpoint"
        )
    config = {**source.hf_config, **overrides}
    hf_config = hf.hf_config(family, config)
    mcore_config = source.mcore_config or family.to_mcore_config(hf.config_dict(hf_config))
    dtype = dtype or torch.float32
    if mtp and (backend == "hf" or not mcore_config.get("mtp_num_layers")):
        why = "transformers' models have none" if backend == "hf" else "its config counts none"
        raise SettingError(f"{source.path}: mtp=True needs a megatron-core model with multi-token-prediction layers "
                           f"({why}); load it with mtp=False")
    torch.manual_seed(seed)
    if backend == "hf":
        model = _load_hf(source, hf_config, dtype, mcore_config)
        if adapter is not None:
            model = _hf_adapter(model, adapter)
    else:
        model = _load_mcore(source, mcore_config, dtype, seed, tensor_parallel_size, pipeline_parallel_size, mtp)
        if adapter is not None:
            _mcore_adapter(model, source, mcore_config, adapter)

    tokenizer = model_tokenizer(source, mcore_config["vocab_size"])
    return ModelHandle(model, family, backend, hf_config, mcore_config, tokenizer, source.path,
                       model_files_folder(source))


def _mcore_adapter(model, source: Source, config: McoreConfig, adapter) -> None:
    from ..lora.adapters import add_lora

    settings, adapters, record = adapter_source(adapter, source.family, config)
    if record is not None:
        if source.path is None:
            raise LoraError(f"{adapter}: a LoRA run adapts the base at {record['base']['path']}; load that, not a "
                            "preset")
        check_base(record, source.path, adapter)
    add_lora(model, source.family, config, settings, adapters=adapters, where=str(adapter))
    model.eval()


def _hf_adapter(model, adapter):
    kind = _adapter_format(adapter)
    if kind != "peft":
        how = (f"convert it first: pai-zoo convert {adapter} DIR --to hf-peft" if kind == "lora-run"
               else "give a PEFT adapter folder (adapter_config.json)")
        raise LoraError(f"{adapter}: backend 'hf' applies a PEFT adapter folder; {how}")
    try:
        from peft import PeftModel
    except ImportError:
        raise LoraError(f"{adapter}: backend 'hf' applies adapters with PEFT, which is not installed "
                        "(pip install peft), or use backend='mcore'") from None
    return PeftModel.from_pretrained(model, str(adapter)).eval()


def _adapter_format(adapter) -> str | None:
    try:
        return formats.detect(adapter)
    except PaiZooError:
        return None


def _load_hf(source: Source, hf_config, dtype, mcore_config: McoreConfig):
    if source.kind == "hf":
        # the folder's tensors as pai_zoo.formats reads them (encodings such as FP8 blocks decoded), given to
        # transformers' own loading, which fuses and ties them as from_pretrained does
        import copy

        import torch

        plain = copy.deepcopy(hf_config)
        if getattr(plain, "quantization_config", None):
            del plain.quantization_config
        with torch.device("meta"):  # the concrete class (from_pretrained with a state dict needs it)
            cls = type(hf.build_hf_model(source.family, plain, dtype))
        with formats.open_checkpoint(source.path, dtype=dtype, format="hf") as weights:
            state = {name: weights.read(name) for name in weights.names()}
        return load_hf_checkpoint_state(cls, plain, state, dtype, f"{source.path} -> transformers")
    if source.kind not in ("mcore", "megatron-lm"):
        return hf.build_hf_model(source.family, hf_config, dtype)
    import torch

    with torch.device("meta"):  # the model's checkpoint names, without memory
        skeleton = hf.build_hf_model(source.family, hf_config, dtype)
    names = hf_state_dict(skeleton, mcore_config, source.family).keys()
    with source.open_megatron() as checkpoint:
        state = {k: v.to(dtype) for k, v in checkpoint.hf_tensors(expected=names, mtp=False)}
    return load_hf_checkpoint_state(type(skeleton), hf_config, state, dtype, f"{source.path} -> transformers")


def _load_mcore(source: Source, config: McoreConfig, dtype, seed: int, tp: int | None, pp: int | None,
                mtp: bool = False):
    import_megatron()  # megatron-core's CPU notices silenced
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

    from ..mcore.build import build_gpt_model
    from ..mcore.compat import ensure_model_parallel

    check_layout(config, tp or 1, pp or 1)  # an invalid tp/pp names the valid ones, before any process group
    from ..mcore.biased_experts import expert_tensor_parallel_size

    ensure_model_parallel(tp or 1, pp or 1, expert_tensor_parallel_size=expert_tensor_parallel_size(config))
    have = (
        parallel_state.get_tensor_model_parallel_world_size(),
        parallel_state.get_pipeline_model_parallel_world_size(),
    )
    if (tp or have[0], pp or have[1]) != have:
        raise PaiZooError(
            f"megatron's parallel state is already set up with tp={have[0]}, pp={have[1]}; asked for tp={tp}, pp={pp}"
        )
    model_parallel_cuda_manual_seed(seed)
    padded = source.record.get("padded_vocab_size") if source.record else None
    model = build_gpt_model(
        source.family, config, dtype, padded_vocab_size=padded, parallel_output=False,
        pre_process=parallel_state.is_pipeline_first_stage(), post_process=parallel_state.is_pipeline_last_stage(),
        mtp=mtp,
    )
    if source.record and source.record.get("head"):  # a reward model / critic (pai_zoo.mcore.heads)
        from ..mcore.heads import attach_score_head

        attach_score_head(model)
    if source.kind in ("hf", "megatron-lm") and have != (1, 1):  # converted into a scratch folder first
        with shared_temporary_folder("pai-zoo-load-") as scratch:
            load_mcore_weights(model, source, config, dtype, scratch / "mcore")
    else:
        load_mcore_weights(model, source, config, dtype)
    return model.eval()


def load_mcore_weights(model, source: Source, config: McoreConfig, dtype, scratch: Path | None = None) -> None:
    """Fill a (possibly TP/PP-sharded) megatron-core ``model`` (or a list of virtual-pipeline model chunks)
    from ``source``'s checkpoint.

    A Megatron-Core checkpoint is read by megatron-core's own loader (any saved layout). A
    Hugging Face folder is streamed through the family's table into a single-process model;
    for a sharded model it is first converted into ``scratch`` (by global rank 0, removed
    afterwards) and loaded from there. A preset has no weights to load.
    """
    import shutil
    import subprocess
    import sys

    import torch
    from megatron.core import parallel_state

    from ..mcore.dist_ckpt import load_model_weights
    from ..mcore.mtp import has_mtp

    # one process holds the whole model: no TP/PP and no expert parallelism (EP ranks hold a share of the experts)
    single = (parallel_state.get_model_parallel_group().size() == 1
              and parallel_state.get_expert_model_parallel_world_size() == 1)
    if source.kind == "mcore":
        load_model_weights(model, source.weights_folder or iteration_dir(source.path))
    elif source.kind == "megatron-lm" and single:
        with source.open_megatron() as checkpoint:
            state = {k: v for k, v in checkpoint.mcore_tensors() if has_mtp(model) or not k.startswith("mtp.")}
        load_into(model, {k: v.to(dtype) for k, v in state.items()}, f"{source.path} -> megatron-core")
    elif source.kind == "hf" and single:
        checkpoint = formats.open_checkpoint(source.path, dtype=dtype, format="hf")
        table = get_registry().weight_map(source.family, config)
        target = mcore_tensors(model)
        ctx = MappingContext.from_config(config, padded_vocab_size=model_vocab_rows(model), mtp=has_mtp(model))
        ctx = ctx.named_as(target)
        held = table.mtp_layers_held(ctx, checkpoint.names())
        if held and not ctx.mtp_layers:  # MTP layers the model leaves out (inference, or training without them)
            ctx = replace(ctx, dropped_mtp_layers=held)
        state = dict(table.iter_convert(TO_MCORE, ctx, checkpoint.get, checkpoint.names(), target.keys()))
        load_into(model, {k: v.to(dtype) for k, v in state.items()}, f"{source.path} -> megatron-core")
    elif source.kind in ("hf", "megatron-lm"):
        if scratch is None:
            raise PaiZooError(f"{source.path}: a Hugging Face folder loads into one process; for tp/pp > 1 "
                              f"convert it first (pai-zoo convert {source.path} DST --to mcore)")
        rank0 = is_rank0()
        failed = torch.zeros(1)
        if rank0:
            shutil.rmtree(scratch, ignore_errors=True)
            # In a process of its own: the converter lays tensors out with a single-process megatron state.
            command = [
                sys.executable,
                "-m",
                "pai_zoo.cli",
                "convert",
                str(source.path),
                str(scratch),
                "--to",
                "mcore",
                "--family",
                source.family.name,
                "--tp",
                str(parallel_state.get_tensor_model_parallel_world_size()),
                "--pp",
                str(parallel_state.get_pipeline_model_parallel_world_size()),
            ]
            if config.get("num_moe_experts"):
                command += ["--ep", str(parallel_state.get_expert_model_parallel_world_size()),
                            "--etp", str(parallel_state.get_expert_tensor_parallel_world_size())]
            if source.tokenizer_dir is not None:
                command += ["--tokenizer", str(source.tokenizer_dir)]
            if source.iteration is not None:
                command += ["--iteration", str(source.iteration)]
            proc = subprocess.run(command, capture_output=True, text=True, env=single_process_env())
            failed[0] = proc.returncode != 0
        torch.distributed.all_reduce(failed)
        if failed.item():
            raise PaiZooError(f"{source.path}: conversion for tp/pp > 1 failed"
                              + (f": {proc.stderr.strip().splitlines()[-1]}" if rank0 and proc.stderr.strip() else ""))
        load_model_weights(model, iteration_dir(scratch))
        torch.distributed.barrier()
        if rank0:
            shutil.rmtree(scratch, ignore_errors=True)


def model_vocab_rows(model) -> int | None:
    """The padded vocabulary of a megatron-core model (``None`` on a middle pipeline stage)."""
    from megatron.core import parallel_state

    for module in (getattr(model, "embedding", None), getattr(model, "output_layer", None)):
        weight = getattr(getattr(module, "word_embeddings", module), "weight", None)
        if weight is not None:
            return weight.shape[0] * parallel_state.get_tensor_model_parallel_world_size()
    return None
