"""``pai-zoo train``: continued pretraining and SFT on megatron-core's own engine.

The pieces are megatron-core's: ``GPTModel`` in ``DistributedDataParallel``,
``get_megatron_optimizer``, ``OptimizerParamScheduler`` (linear warm-up, cosine decay),
``get_forward_backward_func`` (gradient accumulation and pipeline schedules),
``finalize_model_grads`` and ``dist_checkpointing``. pai-zoo adds the model source (preset, HF
folder, Megatron checkpoint), the data order, the logs and exact resume.

What a run reports (rank 0): a start-up summary before step 1 (model, parameters, layout, steps, tokens per step,
warm-up, data, where the logs and checkpoints go), one line per logged step with an ETA (or a progress bar on a
terminal), one line per checkpoint save. SIGINT (Ctrl-C) or SIGTERM stops the run after the step in progress (a
second signal at once) with :class:`~pai_zoo.util.interrupt.Interrupted` (exit 130 / 143 from the command line);
nothing half-written is left, and the same command resumes from the last checkpoint.

Checkpoints: ``keep_last`` N keeps the newest N ``iter_*`` folders (and the one the run resumed from);
``save_optim=False`` saves the weights, scheduler, RNG and data position without the optimizer state. A run resumed
from such a checkpoint warns and starts the optimizer's moments from zero (the schedule and data continue).

Extending (``extend``): a run may be resumed with a larger budget (``train_tokens``). The learning-rate schedule is
then recomputed for the new number of steps (the same warm-up steps, decay to ``min_learning_rate`` at the new last
step) and continues from the step reached: the learning rate jumps from where the old schedule left it to the new
schedule's value at that step and decays again over the remaining steps. Without ``extend`` a changed budget is
refused, and a smaller budget is refused always.
"""
from __future__ import annotations

import json
import math
import shutil
import time
from functools import partial
from pathlib import Path

import torch

from ..checkpoint import tokenizer_files
from ..conversion import mtp_choice
from ..errors import PaiZooError
from ..fp8_blocks import open_weights
from ..handle import load_mcore_weights, resolve
from ..hf import config_dict, hf_config, hf_config_from_mcore
from ..lora import run as lora_run
from ..lora.peft_format import read_peft_adapter
from ..lora.settings import LORA_RECORD, LoraError
from ..lora.targets import lora_targets, select, to_mcore_form
from ..mapping import MappingContext
from ..mcore import dist_ckpt, import_megatron
from ..mcore.build import build_gpt_model, mask_padded_vocab
from ..mcore.compat import ensure_model_parallel
from ..mcore.flops import model_flops_per_token, peak_flops
from ..mcore.lora import add_lora
from ..mcore.mtp import mtp_layers_of, start_loss_tracking, take_losses
from ..mcore.parallel_sizes import check_layout, check_world
from ..registry import get_registry
from ..run_checkpoint import iteration_name, latest_iteration, load_checkpoint, prune_checkpoints, save_checkpoint
from ..tokenizers.names import model_files_folder, model_tokenizer
from ..util.dist import rank, world_size
from ..util.files import write_text_atomic
from ..util.interrupt import Interrupted, StopRequest
from ..util.metrics import MetricsLog
from ..util.progress import ETA
from . import data, optim
from .config import TrainConfig, TrainConfigError
from .data import check_data
from .display import StepDisplay, StepMetrics, format_metrics, short_count

#: Settings that must not change when a run is resumed (the budget, train_tokens, may grow with ``extend``).
RESUME_INVARIANTS = ("global_batch_size", "sequence_length", "data", "split", "seed", "sft", "train_tokens",
                     "warmup_tokens", "learning_rate", "min_learning_rate", "peft", "lora_rank", "lora_alpha",
                     "lora_dropout", "lora_target_modules", "use_rslora", "peft_init", "freeze_language_model",
                     "freeze_vision_model", "freeze_vision_projection")
#: the defaults of settings added after runs were saved without them
_ABSENT_BEFORE = {"peft": None, "lora_rank": 8, "lora_alpha": 16.0, "lora_dropout": 0.0, "lora_target_modules": None,
                  "use_rslora": False, "peft_init": None, "freeze_language_model": False, "freeze_vision_model": False,
                  "freeze_vision_projection": False}

METRICS_FILE = "metrics.jsonl"
CONFIG_FILE = "train_config.json"


def _world() -> tuple[int, int]:
    return rank(), world_size()


class Trainer:
    """One training run. ``Trainer(cfg).run()`` trains (or resumes) and returns the last metrics."""

    def __init__(self, cfg: TrainConfig, echo=print):
        self.cfg = cfg
        self.echo = echo
        self.save_dir = Path(cfg.save)

    # -- set-up -------------------------------------------------------------------------------
    def _source(self):
        try:
            return resolve(self.cfg.model)
        except PaiZooError as e:
            raise TrainConfigError(f"--model {self.cfg.model}: {e}") from None

    def setup(self) -> None:
        import_megatron()  # megatron-core's CPU notices silenced
        from megatron.core import parallel_state


        cfg = self.cfg
        _, world = _world()
        source = self._source()
        self.family = source.family
        self.mcore_config = source.mcore_config or self.family.to_mcore_config(
            config_dict(hf_config(self.family, source.hf_config)))

        self.mcore_config = self._with_mtp_choice(source)
        check_layout(self.mcore_config, cfg.tensor_parallel_size, cfg.pipeline_parallel_size, error=TrainConfigError)
        cfg.check_implementation()  # CP and TE where they cannot run: before the torchrun command below
        check_world(cfg.tensor_parallel_size, cfg.pipeline_parallel_size, world)  # one process: the torchrun command
        cfg.validate(world, self.mcore_config.get("max_sequence_length"))
        cfg.check_model(self.mcore_config.num_layers, self.mcore_config.get("num_moe_experts"))
        if cfg.transformer_impl not in self.family.backends:
            raise TrainConfigError(f"{cfg.given('transformer_impl')}: family {self.family.name!r} supports "
                                   f"{', '.join(self.family.backends)} (its own modules are local ones); use "
                                   "--transformer-impl local")

        self._check_vision_choices()
        check_data(cfg, self.mcore_config["vocab_size"])
        self.lora = self._lora_choice(source)
        self._check_resume_compatible()
        if cfg.bf16 and not torch.cuda.is_available():
            raise TrainConfigError("--bf16 needs a GPU (bfloat16 training with fp32 main weights); "
                                   "on the CPU train in float32")
        vpp = cfg.virtual_pipeline_model_parallel_size or 1
        ensure_model_parallel(cfg.tensor_parallel_size, cfg.pipeline_parallel_size, cfg.seed,
                              virtual_pipeline_model_parallel_size=vpp if vpp > 1 else None,
                              context_parallel_size=cfg.context_parallel_size,
                              expert_model_parallel_size=cfg.expert_model_parallel_size)
        self.rank, self.world = _world()
        self.dp_rank = parallel_state.get_data_parallel_rank()
        self.dp_size = parallel_state.get_data_parallel_world_size()
        self.microbatches = cfg.microbatches(self.world)
        self.first_stage = parallel_state.is_pipeline_first_stage()
        self.last_stage = parallel_state.is_pipeline_last_stage()
        self.dtype = torch.bfloat16 if cfg.bf16 else torch.float32
        self.vision_data = None
        if data.is_vision_sft(cfg):  # records and images processed before anything is written: a bad one stops here
            self.vision_data = data.build_vision_sft_datasets(
                cfg, self.family, self.mcore_config, model_tokenizer(source, self.mcore_config["vocab_size"]),
                model_files_folder(source))
        if self.rank == 0:
            self.save_dir.mkdir(parents=True, exist_ok=True)
        torch.distributed.barrier()
        self._build_model(source)
        self._build_optimizer()
        self._build_data()

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
        cfg, record_file = self.cfg, self.save_dir / LORA_RECORD
        try:
            settings = cfg.lora_settings()
        except LoraError as e:
            raise TrainConfigError(str(e)) from None
        self.lora_init = None
        if settings is None:
            if record_file.is_file():
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
            if record_file.is_file():
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
            weights = open_weights(source.path)
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
        file = self.save_dir / CONFIG_FILE
        if not file.is_file():
            return
        before = json.loads(file.read_text())
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

        dist_ckpt.write_pai_zoo_config(self.save_dir, self.mcore_config, self.cfg.tensor_parallel_size,
                                       self.cfg.pipeline_parallel_size, self.dtype, self.padded_vocab_size)
        hf_dir = self.save_dir / dist_ckpt.HF_DIR
        hf_dir.mkdir(exist_ok=True)
        origins = {"mcore": source.path / dist_ckpt.HF_DIR if source.path else None, "hf": source.path,
                   "megatron-lm": getattr(source, "tokenizer_dir", None)}  # a Megatron-LM folder holds no tokenizer
        origin = origins.get(source.kind)
        hf_config_from_mcore(self.family, self.mcore_config).save_pretrained(hf_dir)
        if origin is not None:
            for name in ("generation_config.json",):
                if (origin / name).is_file():
                    shutil.copy2(origin / name, hf_dir / name)
        else:  # a test preset's test tokenizer comes along, so the checkpoint reads text as the data did

            tokenizer = model_tokenizer(source, self.mcore_config["vocab_size"])
            origin = None if tokenizer is None else Path(tokenizer.path).parent
        for file in tokenizer_files(origin) if origin is not None else ():
            shutil.copy2(file, hf_dir / file.name)
        write_text_atomic(self.save_dir / CONFIG_FILE, json.dumps(self.cfg.to_dict(), indent=2) + "\n")

    def _build_optimizer(self) -> None:
        cfg = self.cfg
        self.ddp, self.optimizer, self.scheduler = optim.megatron_optimizer(
            self.model, lr=cfg.learning_rate, min_lr=cfg.min_learning_rate, weight_decay=cfg.weight_decay,
            adam_beta1=cfg.adam_beta1, adam_beta2=cfg.adam_beta2, adam_eps=cfg.adam_eps, clip_grad=cfg.clip_grad,
            warmup_steps=cfg.warmup_steps, decay_steps=cfg.train_steps, decay_style=cfg.lr_decay_style,
            use_distributed_optimizer=cfg.use_distributed_optimizer, overlap_grad_reduce=cfg.overlap_grad_reduce,
            overlap_param_gather=cfg.overlap_param_gather,
        )
        self.ddps = self.ddp if isinstance(self.ddp, list) else [self.ddp]

    def _build_data(self) -> None:
        cfg = self.cfg
        # evaluation k (k = 1, 2 ...: at step k x eval_interval) reads validation batches (k-1) x eval_iters on, as
        # Megatron-LM's validation iterator does: the first evaluation reads the first validation samples
        eval_batches = cfg.train_steps // cfg.eval_interval * cfg.eval_iters if cfg.eval_interval else 0
        if self.vision_data is not None:
            train, valid = self.vision_data
        elif cfg.sft:
            train, valid = data.build_sft_datasets(cfg)
        else:
            eod = self._eod_id()
            train, valid = data.build_pretraining_datasets(
                cfg, self.mcore_config["vocab_size"], eod,
                (cfg.train_steps * cfg.global_batch_size, eval_batches * cfg.global_batch_size),
                self.save_dir / "data_cache")
        fixed = cfg.pipeline_parallel_size > 1 or not cfg.sft
        self.train_batches = data.BatchSchedule(train, cfg, self.dp_rank, self.dp_size, fixed)
        self.valid_batches = data.BatchSchedule(valid, cfg, self.dp_rank, self.dp_size, fixed) if valid else None
        if cfg.eval_interval and valid is None and self.rank == 0:
            self.echo(f"note: split {cfg.split} leaves no validation data; evaluation is off")

    def _eod_id(self) -> int:
        extra = self.mcore_config.hf_extra
        eos = extra.get("eos_token_id")
        if isinstance(eos, list):
            eos = eos[0] if eos else None
        return int(eos) if eos is not None else 0

    # -- running ------------------------------------------------------------------------------
    def _latest(self) -> int | None:
        return latest_iteration(self.save_dir)

    def _forward_step(self, data_iterator, model):
        batch = next(data_iterator)
        if self.cfg.context_parallel_size > 1:  # this rank's part of each sequence (megatron-core's CP split)
            from megatron.core.utils import get_batch_on_this_cp_rank

            parts = get_batch_on_this_cp_rank({"tokens": batch.tokens, "labels": batch.labels,
                                               "loss_mask": batch.loss_mask, "position_ids": batch.position_ids})
            output = model(parts["tokens"], parts["position_ids"], None, labels=parts["labels"],
                           **({"loss_mask": parts["loss_mask"]} if self.mtp_layers else {}))
            return output, partial(_loss, parts["loss_mask"])
        # TE's attention is causal by its mask type; an SFT batch's document mask still goes in
        mask = None if self.cfg.transformer_impl == "transformer_engine" and not self.cfg.sft else batch.attention_mask
        output = model(batch.tokens, batch.position_ids, mask, labels=batch.labels,
                       **({"loss_mask": batch.loss_mask} if self.mtp_layers else {}),  # MTP's loss mask
                       **(batch.vision or {}))  # a vision-language batch's images, read by the first stage
        return output, partial(_loss, batch.loss_mask)

    def _run_batches(self, batches, forward_only: bool) -> tuple[float, float]:
        """Forward (and backward) over micro-batches; returns the global (loss sum, target tokens)."""
        from megatron.core.pipeline_parallel import get_forward_backward_func

        if torch.cuda.is_available():
            batches = [b.to("cuda") for b in batches]
        length = batches[0].tokens.shape[1]
        # the interleaved schedule reads each chunk's micro-batches from an iterator of its own
        data = iter(batches) if len(self.ddps) == 1 else [iter(batches) for _ in self.ddps]
        reduced = get_forward_backward_func()(
            forward_step_func=self._forward_step, data_iterator=data, model=self.ddps,
            num_microbatches=len(batches), seq_length=length, micro_batch_size=self.cfg.batch_size,
            forward_only=forward_only,
        )
        from megatron.core import parallel_state

        totals = torch.zeros(2, dtype=torch.float64, device=_device())
        if self.last_stage and parallel_state.get_tensor_model_parallel_rank() == 0:
            for item in reduced:
                totals += item["lm loss"].to(torch.float64)
        torch.distributed.all_reduce(totals)
        return totals[0].item(), totals[1].item()

    def train_step(self, step: int) -> StepMetrics:
        start = time.perf_counter()
        for ddp in self.ddps:
            ddp.zero_grad_buffer()
        self.optimizer.zero_grad()
        batches = self.train_batches.microbatches(step, self.microbatches)
        length = batches[0].tokens.shape[1]
        loss_sum, tokens = self._run_batches(batches, forward_only=False)
        mtp_losses = ()
        if self.mtp_layers:
            from megatron.core import parallel_state

            mtp_losses = tuple(take_losses(
                len(batches), self.last_stage and parallel_state.get_tensor_model_parallel_rank() == 0,
                self.dp_size * self.cfg.context_parallel_size))
        ok, grad_norm, _ = self.optimizer.step()
        if not ok:
            raise PaiZooError(f"step {step + 1}: the optimizer step failed (non-finite gradients)")
        self.scheduler.step(increment=1)
        elapsed = time.perf_counter() - start
        step_tokens = self.cfg.global_batch_size * length
        return StepMetrics(step + 1, loss_sum / max(tokens, 1), self.optimizer.param_groups[0]["lr"],
                           float(grad_norm or 0.0), step_tokens / elapsed, elapsed, int(tokens),
                           self._mfu(step_tokens / elapsed, length), mtp_losses)

    def evaluate(self, step: int) -> float:
        for ddp in self.ddps:
            ddp.eval()
        loss_sum = tokens = 0.0
        with torch.no_grad():
            for i in range(self.cfg.eval_iters):
                batches = self.valid_batches.microbatches(
                    (step // self.cfg.eval_interval - 1) * self.cfg.eval_iters + i, self.microbatches)
                s, n = self._run_batches(batches, forward_only=True)
                loss_sum, tokens = loss_sum + s, tokens + n
        for ddp in self.ddps:
            ddp.train()
        return loss_sum / max(tokens, 1)

    def _mfu(self, tokens_per_s: float, length: int) -> float | None:
        """Model FLOPs utilisation on a GPU (6N + attention FLOPs per token over the peak)."""
        if not torch.cuda.is_available():
            return None

        peak = peak_flops(torch.cuda.get_device_name(), self.dtype)
        if peak is None:
            return None
        return tokens_per_s * model_flops_per_token(self.mcore_config, length) / (peak * self.world)

    def save(self, step: int) -> Path:
        """Save ``step`` (every rank), then drop the checkpoints beyond ``keep_last``; rank 0 reports it."""
        start = time.perf_counter()
        path = save_checkpoint(self.save_dir, step, self.model, self.optimizer, self.scheduler,
                               {"consumed_samples": step * self.cfg.global_batch_size,
                                "train_config": self.cfg.to_dict()}, save_optim=self.cfg.save_optim)
        seconds = time.perf_counter() - start
        removed = prune_checkpoints(self.save_dir, self.cfg.keep_last, protect=(step, self.resumed_from))
        if self.rank == 0:
            line = f"saved checkpoint {path.name} (step {step}{'' if self.cfg.save_optim else ', weights only'}) " \
                   f"in {seconds:.1f} s"
            if removed:
                line += f"; removed {', '.join(p.name for p in removed)} (keep last {self.cfg.keep_last})"
            self._say(line)
        return path

    def _say(self, line: str) -> None:
        """One line on rank 0, on its own line when the progress bar is showing."""
        bar = getattr(self, "bar", None)
        if bar is not None:
            bar.break_line()
        self.echo(line)

    def parameter_count(self, trainable: bool = False) -> int:
        """The model's parameters over all tensor- and pipeline-parallel ranks (a collective), each counted once and
        without Megatron's vocabulary padding (which depends on the TP size): the Hugging Face model's count
        (``trainable``: only those that get gradients, LoRA's adapters in a LoRA run)."""
        from megatron.core import parallel_state

        tp_rank = parallel_state.get_tensor_model_parallel_rank()
        vocab = self.mcore_config["vocab_size"]
        count = 0
        named = [(chunk, name, p) for chunk in self.chunks for name, p in chunk.named_parameters()]
        for chunk, name, p in named:
            if trainable and not p.requires_grad:
                continue
            if getattr(p, "shared_embedding", False) and not chunk.pre_process:
                continue  # the output layer tied to the first stage's embedding
            sharded = getattr(p, "tensor_model_parallel", False)
            if not sharded and tp_rank != 0:
                continue  # a copy on every tensor-parallel rank
            if name.endswith(("word_embeddings.weight", "output_layer.weight")) and p.dim() == 2:
                rows = p.shape[0]  # this rank's rows of the padded vocabulary: count the real ones
                first = tp_rank * rows if sharded else 0
                count += max(0, min(rows, vocab - first)) * p.shape[1]
            else:
                count += p.numel()
        total = torch.tensor([count], dtype=torch.int64, device=_device())
        torch.distributed.all_reduce(total, group=parallel_state.get_model_parallel_group())
        return int(total.item())

    def summary(self, parameters: int, trainable: int | None = None) -> list[str]:
        """The start-up lines: what is trained, how, for how long, on what, and where it goes (``trainable``: a
        LoRA run's adapter parameters)."""
        cfg = self.cfg
        prefixes, weights = cfg.data_blend()
        data = ", ".join(prefixes) if weights is None else ", ".join(f"{w:g} x {p}" for w, p in zip(weights, prefixes))
        checkpoints = f"{self.save_dir}/iter_* every {cfg.save_interval} steps and at the end"
        checkpoints += f", keeping the last {cfg.keep_last}" if cfg.keep_last else ""
        checkpoints += "; weights only (no optimizer state)" if not cfg.save_optim else ""
        scheduler = self.scheduler
        return [
            f"model: {cfg.model} ({self.family.name}), {parameters:,} parameters ({short_count(parameters)}), "
            f"{'bfloat16' if cfg.bf16 else 'float32'}",
            f"layout: {self.world} process{'es' if self.world > 1 else ''} = TP {cfg.tensor_parallel_size} x "
            f"PP {cfg.pipeline_parallel_size} x DP {self.dp_size}; {self.microbatches} micro-batch"
            f"{'es' if self.microbatches > 1 else ''} of {cfg.batch_size} per step (global batch "
            f"{cfg.global_batch_size})",
            f"steps: {cfg.train_steps} x {cfg.tokens_per_step:,} tokens per step ({cfg.global_batch_size} x "
            f"{cfg.sequence_length}) = {cfg.train_steps * cfg.tokens_per_step:,} tokens; warm-up "
            f"{scheduler.lr_warmup_steps} step{'' if scheduler.lr_warmup_steps == 1 else 's'}, learning rate "
            f"{scheduler.max_lr:g} {scheduler.lr_decay_style} to {scheduler.min_lr:g}",
            f"data: {data}{' (SFT)' if cfg.sft else ''}",
            f"logs: {self.save_dir / METRICS_FILE}; checkpoints: {checkpoints}",
        ] + ([] if trainable is None else [
            f"LoRA: rank {self.lora.rank}, alpha {self.lora.alpha:g}{' (rsLoRA)' if self.lora.use_rslora else ''}, "
            f"dropout {self.lora.dropout:g} on {', '.join(self.lora_hf_targets)}"
            f"{' from ' + str(self.cfg.peft_init) if self.cfg.peft_init else ''}; trainable {trainable:,} of "
            f"{parameters + trainable:,} parameters ({100 * trainable / (parameters + trainable):.2f}%); the base is "
            "frozen and the checkpoints hold the adapters"])

    def _stopped(self, step: int) -> str:
        latest = self._latest()
        where = f"last checkpoint {iteration_name(latest)}" if latest is not None else "no checkpoint yet"
        return f"interrupted at step {step}; {where}; rerun the same command to {'resume' if latest else 'start'}"

    def _resume(self) -> int:
        """Load the latest checkpoint (if any) and say what continues; returns the step to start from."""
        cfg = self.cfg
        self.resumed_from = self._latest()
        if self.resumed_from is None:
            return 0
        if self.extending_from is not None:  # the schedule of the new budget (see the module docstring)
            self.scheduler.override_opt_param_scheduler = True
        state = load_checkpoint(self.save_dir, self.model, self.optimizer, self.scheduler)
        start = int(state["iteration"])
        if self.rank == 0:
            if self.extending_from is not None:
                sch = self.scheduler
                self.echo(f"extending the run from step {start} ({self.extending_from} planned) to step "
                          f"{cfg.train_steps}: the learning-rate schedule is recomputed for {cfg.train_steps} steps "
                          f"(warm-up {sch.lr_warmup_steps}, {sch.lr_decay_style} decay to {sch.min_lr:g} at step "
                          f"{cfg.train_steps}) and continues from step {start} at "
                          f"{self.optimizer.param_groups[0]['lr']:.3e}")
            else:
                self.echo(f"resuming {self.save_dir} at step {start} of {cfg.train_steps}")
            saved = state.get("resharded_from")
            if saved:
                self.echo(f"resharded from TP {saved.get('tp')} x PP {saved.get('pp')} x DP {saved.get('dp')} to TP "
                          f"{cfg.tensor_parallel_size} x PP {cfg.pipeline_parallel_size} x DP {self.dp_size} "
                          "(megatron-core's dist_checkpointing; the random states restart from the seed)")
            if not state.get("has_optimizer", True):
                self.echo(f"warning: {iteration_name(start)} holds no optimizer state (saved with --no-save-optim): "
                          "the optimizer restarts (Adam moments from zero); the weights, schedule and data continue")
        return start

    def run(self) -> dict:
        self.setup()
        cfg = self.cfg
        parameters = self.parameter_count()
        trainable = self.parameter_count(trainable=True) if self.lora is not None else None
        parameters -= trainable or 0  # the model's own count; the adapters are counted apart
        if self.rank == 0:
            for line in self.summary(parameters, trainable):
                self.echo(line)
        start = self._resume()
        if start >= cfg.train_steps:
            if self.rank == 0:
                self.echo(f"{self.save_dir}: already trained for {cfg.train_steps} steps (to train on, rerun with "
                          "a larger --train-tokens and --extend)")
            return {}
        log = MetricsLog(self.save_dir / METRICS_FILE, start) if self.rank == 0 else None
        self.bar = bar = StepDisplay(cfg.train_steps, cfg.progress if self.rank == 0 else False)
        eta = ETA(start, cfg.train_steps)
        done = start
        for ddp in self.ddps:
            ddp.train()
        last: dict = {}
        stop = StopRequest(lambda: self._stopped(done) if self.rank == 0 else "")
        try:
            with stop:
                for step in range(start, cfg.train_steps):
                    metrics = self.train_step(step)
                    last = metrics.as_dict()
                    if cfg.eval_interval and self.valid_batches and metrics.step % cfg.eval_interval == 0:
                        last["eval_loss"] = self.evaluate(metrics.step)
                        last["eval_ppl"] = math.exp(min(last["eval_loss"], 50.0))
                    done = metrics.step
                    if log is not None and (
                        metrics.step % cfg.log_interval == 0 or metrics.step == cfg.train_steps or "eval_loss" in last
                    ):
                        log.write(last)
                        left = eta.seconds(metrics.step)
                        if bar.enabled:
                            bar.show(last, left)
                        else:
                            self.echo(format_metrics(last, cfg.train_steps, left))
                    if metrics.step % cfg.save_interval == 0 or metrics.step == cfg.train_steps:
                        self.save(metrics.step)
                    if metrics.step < cfg.train_steps and stop.requested():
                        raise Interrupted(stop.signum, self._stopped(done) if self.rank == 0 else "")
        finally:
            bar.close()
            self.bar = None
            if log is not None:
                log.close()
        return last


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


def _device():
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _loss(loss_mask, output):
    """megatron's per-token loss contract: (loss sum, target tokens, values to report)."""
    losses = output.float().reshape(-1)
    mask = loss_mask.reshape(-1).to(losses.device)
    loss_sum = (losses * mask).sum()
    tokens = mask.sum().to(torch.int)
    return loss_sum, tokens, {"lm loss": torch.stack([loss_sum.detach(), tokens.to(loss_sum.dtype)])}


def train(cfg: TrainConfig, echo=print) -> dict:
    """Run (or resume) training; see :class:`Trainer`."""
    return Trainer(cfg, echo).run()
