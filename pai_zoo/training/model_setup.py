"""What a training run builds before its first step: the model it trains, checked against the run folder.

:class:`ModelSetup` is the part of :class:`~pai_zoo.training.trainer.Trainer` that decides and builds the model: the
vision-language freezing choices, LoRA's settings against the base and the run folder, the multi-token-prediction
layers the run trains, whether a run folder may be resumed with these settings (or extended), the megatron-core
model chunks loaded from the source, and the description (``pai_zoo.json``, ``hf/``, ``train_config.json``)
written beside the checkpoints. The steps, evaluation, saving and resuming are the trainer's own.
"""
from __future__ import annotations

import shutil
from pathlib import Path

import torch

from .. import formats
from ..conversion.entry import mtp_choice
from ..families.registry import get_registry
from ..formats import mcore_dist, training_run
from ..formats.hf_folder import generation_config_file, tokenizer_files
from ..formats.peft_adapter import read_peft_adapter
from ..hf.models import hf_config_from_mcore
from ..lora import run as lora_run
from ..lora.adapters import add_lora
from ..lora.settings import LoraError
from ..lora.targets import lora_targets, select, to_mcore_form
from ..mcore.build import build_gpt_model, mask_padded_vocab
from ..mcore.mtp import mtp_layers_of, start_loss_tracking
from ..models.handle import load_mcore_weights
from ..plugin.errors import PaiZooError
from ..tables.mapping import MappingContext
from ..tokenizers.names import model_tokenizer
from ..util.dist import rank, world_size
from . import data
from .config import TrainConfig, TrainConfigError

#: Settings that must not change when a run is resumed (the budget, train_tokens, may grow with ``extend``).
RESUME_INVARIANTS = ("global_batch_size", "sequence_length", "data", "split", "seed", "sft", "train_tokens",
                     "warmup_tokens", "learning_rate", "min_learning_rate", "peft", "lora_rank", "lora_alpha",
                     "lora_dropout", "lora_target_modules", "use_rslora", "peft_init", "freeze_language_model",
                     "freeze_vision_model", "freeze_vision_projection")
#: the defaults of settings added after runs were saved without them
_ABSENT_BEFORE = {"peft": None, "lora_rank": 8, "lora_alpha": 16.0, "lora_dropout": 0.0, "lora_target_modules": None,
                  "use_rslora": False, "peft_init": None, "freeze_language_model": False, "freeze_vision_model": False,
                  "freeze_vision_projection": False}

#: the settings that give the budget: with ``extend`` they may grow.
BUDGET = ("train_tokens", "train_iters")


def _steps_of(settings: dict) -> int | None:
    """The number of steps of a run's saved settings (``train_config.json``), None if they do not say."""
    from dataclasses import fields

    known = {f.name for f in fields(TrainConfig)}
    try:
        return TrainConfig(**{k: v for k, v in settings.items() if k in known}).train_steps
    except (TypeError, ValueError, ZeroDivisionError, PaiZooError):
        return None



def _world() -> tuple[int, int]:
    return rank(), world_size()


def model_overrides(cfg: TrainConfig, num_layers: int) -> dict:
    """The ``TransformerConfig`` fields a run's scale settings set (sequence and context parallelism, the virtual
    pipeline, expert parallelism, recompute), beside the per-token loss the trainer uses."""
    overrides = {"calculate_per_token_loss": True, "mtp_loss_scaling_factor": cfg.mtp_loss_scaling_factor,
                 **cfg.recompute_overrides(num_layers)}
    if cfg.sequence_parallel:
        overrides["sequence_parallel"] = True
    if (cfg.virtual_pipeline_model_parallel_size or 1) > 1:
        overrides["virtual_pipeline_model_parallel_size"] = cfg.virtual_pipeline_model_parallel_size
        # Megatron-LM's defaults for the interleaved schedule: overlapped, unbatched p2p (its send/recv pairs keep
        # the forward and backward directions apart when the previous and next stage are one rank, at PP 2)
        overrides.update(overlap_p2p_comm=True, batch_p2p_comm=False)
    if cfg.context_parallel_size > 1:
        overrides["context_parallel_size"] = cfg.context_parallel_size
    if cfg.expert_model_parallel_size > 1:
        overrides["expert_model_parallel_size"] = cfg.expert_model_parallel_size
    return overrides


def _device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


class ModelSetup:
    """The model-building half of the trainer (see the module docstring); it uses the trainer's ``cfg``,
    ``family``, ``mcore_config``, ``save_dir``, ``dtype`` and ``echo``."""

    def _check_vision_choices(self) -> None:
        """The freezing flags name parts a vision-language model has; layouts its tower does not support refused."""
        cfg, vision = self.cfg, self.family.vision
        freezing = [cfg.given(n) for n in ("freeze_language_model", "freeze_vision_model", "freeze_vision_projection")
                    if getattr(cfg, n)]
        if vision is None:
            if freezing:
                raise TrainConfigError(f"{freezing[0]}: family {self.family.name!r} has no vision tower")
            if data.is_vision_sft(cfg):
                raise TrainConfigError(f"--data {cfg.data[0]}: a JSON Lines file trains directly only on a "
                                       f"vision-language model; for {self.family.name!r} preprocess it first "
                                       "(pai-zoo preprocess --sft)")
            return
        if cfg.context_parallel_size > 1 or cfg.sequence_parallel:
            what = cfg.given("context_parallel_size" if cfg.context_parallel_size > 1 else "sequence_parallel")
            raise TrainConfigError(f"{what}: a vision-language model's image embeddings are placed over the whole "
                                   "sequence; train it without context or sequence parallelism")
        if cfg.freeze_vision_projection and not vision.projector_prefix:
            raise TrainConfigError(f"{cfg.given('freeze_vision_projection')}: family {self.family.name!r} names no "
                                   "projector apart from its tower")

    def _freeze(self, chunks) -> None:
        """``--freeze-language-model`` / ``--freeze-vision-model`` / ``--freeze-vision-projection``: those
        parameters keep ``requires_grad`` off, so megatron-core's DDP and optimizer leave them out."""
        cfg, vision = self.cfg, self.family.vision
        if vision is None:
            return
        projector, tower = vision.projector_prefix, vision.tower_prefix
        for chunk in chunks:
            for name, param in chunk.named_parameters():
                in_projector = bool(projector) and name.startswith(projector)
                in_tower = name.startswith(tower) and not in_projector
                part = "projection" if in_projector else "vision" if in_tower else "language"
                if getattr(cfg, {"projection": "freeze_vision_projection", "vision": "freeze_vision_model",
                                 "language": "freeze_language_model"}[part]):
                    param.requires_grad_(False)

    def _lora_choice(self, source):
        """``--peft lora``: the settings, checked against the base and the run folder before anything is built
        (``self.lora_init``: a ``--peft-init`` folder's adapters in mcore form)."""
        cfg, lora_record = self.cfg, training_run.is_lora_run(self.save_dir)
        try:
            settings = cfg.lora_settings()
        except LoraError as e:
            raise TrainConfigError(str(e)) from None
        self.lora_init = None
        if settings is None:
            if lora_record:
                raise TrainConfigError(f"{self.save_dir} holds a LoRA run; resume it with its --peft lora settings "
                                       "(or use another --save folder)")
            return None
        if source.kind not in ("hf", "mcore"):
            raise TrainConfigError(f"--model {cfg.model}: --peft lora adapts a base checkpoint folder (Hugging Face "
                                   "or pai-zoo Megatron-Core), which the run names by path and sha256; save the "
                                   f"{source.kind} model to a folder first")
        try:
            chosen = select(lora_targets(get_registry().weight_map(self.family, self.mcore_config)),
                            settings.targets, self.family.name)
            if lora_record:
                lora_run.check_base(lora_run.read_record(self.save_dir), source.path, self.save_dir)
        except LoraError as e:
            raise TrainConfigError(str(e)) from None
        self.lora_hf_targets = sorted({t.leaves[i] for t, idx in chosen.items() for i in idx})
        if cfg.peft_init is not None:
            try:
                _, adapters = read_peft_adapter(cfg.peft_init, self.family)
                ctx = MappingContext.from_config(self.mcore_config)
                self.lora_init = to_mcore_form(adapters, list(chosen), self.mcore_config, ctx)
            except LoraError as e:
                raise TrainConfigError(f"{cfg.given('peft_init')}: {e}") from None
        return settings

    def _with_mtp_choice(self, source):
        """The model's config with the multi-token-prediction layers the run trains (:meth:`TrainConfig.check_mtp`):
        none when ``mtp_num_layers`` is 0 or an HF folder holds none of their tensors (a note says so)."""
        config = self.mcore_config
        held = mtp_layers_of(config)
        if held and source.kind == "hf":
            weights = formats.open_checkpoint(source.path, format="hf")
            try:
                config, _, note = mtp_choice(source.path, self.family, config, weights.names(), no_mtp=False)
            finally:
                weights.close()
            if note and _world()[0] == 0:
                self.echo(note)
            held = mtp_layers_of(config)
        self.mtp_layers = self.cfg.check_mtp(held)
        return config if self.mtp_layers else config.without_mtp()

    def _check_resume_compatible(self) -> None:
        """Refuse to resume a run with other settings; with ``extend``, allow a larger budget (sets
        ``self.extending_from`` to the run's former number of steps)."""
        self.extending_from = None
        before = training_run.read_run_config(self.save_dir)
        if before is None:
            return
        now = self.cfg.to_dict()
        changed = [f"{k}: {before.get(k, _ABSENT_BEFORE.get(k))!r} -> {now[k]!r}" for k in RESUME_INVARIANTS
                   if k not in BUDGET and before.get(k, _ABSENT_BEFORE.get(k)) != now.get(k)]
        if changed:
            raise TrainConfigError(f"{self.save_dir} holds a run with other settings; resuming it with "
                                   f"{'; '.join(changed)} would not continue it (use another --save folder)")
        distopt = (bool(before.get("use_distributed_optimizer", False)), self.cfg.use_distributed_optimizer)
        if distopt[0] != distopt[1]:
            raise TrainConfigError(
                f"{self.save_dir} holds a run with use_distributed_optimizer: {distopt[0]} -> {distopt[1]}: "
                "megatron-core keeps the distributed optimizer's state in a format of its own, which the other "
                "optimizer cannot load (its fully reshardable format changes the layout, not the optimizer)",
                hint=f"resume with{'' if distopt[0] else 'out'} --use-distributed-optimizer (any TP/PP/DP layout), "
                     "or use another --save folder")
        old, new = _steps_of(before), self.cfg.train_steps
        if old is None or old == new:
            return
        budget = "; ".join(f"{k}: {before.get(k)!r} -> {now.get(k)!r}" for k in BUDGET if before.get(k) != now.get(k))
        if new < old:
            raise TrainConfigError(f"{self.save_dir} holds a run of {old} steps; {budget} ({new} steps) would shorten "
                                   "it, which a resume cannot do (use another --save folder)")
        if not self.cfg.extend:
            raise TrainConfigError(
                f"{self.save_dir} holds a run of {old} steps; resuming it with {budget} ({new} steps) would not "
                "continue it", hint="add --extend to continue the run to the larger budget (the learning-rate "
                "schedule is recomputed for the new steps), or use another --save folder")
        self.extending_from = old

    def _build_model(self, source) -> None:
        from megatron.core import parallel_state
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed


        cfg = self.cfg
        torch.manual_seed(cfg.seed)
        model_parallel_cuda_manual_seed(cfg.seed)
        padded = source.record.get("padded_vocab_size") if source.record else None
        vpp = cfg.virtual_pipeline_model_parallel_size or 1
        chunks = []
        for i in range(vpp):  # one model chunk per virtual pipeline stage (megatron-core's interleaved schedule)
            stage = i if vpp > 1 else None
            chunk = build_gpt_model(
                self.family, self.mcore_config, self.dtype,
                pre_process=parallel_state.is_pipeline_first_stage(ignore_virtual=stage is None, vp_stage=stage),
                post_process=parallel_state.is_pipeline_last_stage(ignore_virtual=stage is None, vp_stage=stage),
                padded_vocab_size=padded, parallel_output=True, vp_stage=stage, transformer_impl=cfg.transformer_impl,
                mtp=True, **model_overrides(cfg, self.mcore_config.num_layers),
            )
            mask_padded_vocab(chunk, self.mcore_config["vocab_size"])
            chunks.append(chunk)
        self.padded_vocab_size = padded or self.mcore_config.padded_vocab_size(cfg.tensor_parallel_size)
        model = chunks if vpp > 1 else chunks[0]
        resuming = self._latest() is not None
        if (not resuming or self.lora is not None) and source.kind != "preset":  # LoRA: the base is never saved
            load_mcore_weights(model, source, self.mcore_config, self.dtype, scratch=self.save_dir / ".init-mcore")
        if self.lora is not None:
            add_lora(model, self.family, self.mcore_config, self.lora, seed=self.cfg.seed, adapters=self.lora_init,
                     where=str(self.cfg.peft_init))
            if self.rank == 0 and not resuming:
                lora_run.write_record(self.save_dir, self.lora, source.path, source.kind, self.lora_hf_targets)
        self._freeze(chunks)
        if self.rank == 0:
            self._write_model_description(source)
        if torch.cuda.is_available():
            for chunk in chunks:
                chunk.cuda()
        self.chunks = chunks
        if self.mtp_layers:
            start_loss_tracking(self.mtp_layers, _device())
        self.model = model  # a GPTModel, or the list of chunks (what the optimizer and checkpoints take)

    def _write_model_description(self, source) -> None:
        """``pai_zoo.json`` and ``hf/`` beside the checkpoints (read by convert and load)."""

        mcore_dist.write_pai_zoo_config(self.save_dir, self.mcore_config, self.cfg.tensor_parallel_size,
                                       self.cfg.pipeline_parallel_size, self.dtype, self.padded_vocab_size)
        hf_dir = self.save_dir / mcore_dist.HF_DIR
        hf_dir.mkdir(exist_ok=True)
        origins = {"mcore": source.path / mcore_dist.HF_DIR if source.path else None, "hf": source.path,
                   "megatron-lm": getattr(source, "tokenizer_dir", None)}  # a Megatron-LM folder holds no tokenizer
        origin = origins.get(source.kind)
        hf_config_from_mcore(self.family, self.mcore_config).save_pretrained(hf_dir)
        if origin is not None:
            if generation_config_file(origin) is not None:
                shutil.copy2(generation_config_file(origin), hf_dir / generation_config_file(origin).name)
        else:  # a test preset's test tokenizer comes along, so the checkpoint reads text as the data did

            tokenizer = model_tokenizer(source, self.mcore_config["vocab_size"])
            origin = None if tokenizer is None else Path(tokenizer.path).parent
        for file in tokenizer_files(origin) if origin is not None else ():
            shutil.copy2(file, hf_dir / file.name)
        training_run.write_run_config(self.save_dir, self.cfg.to_dict())

