"""``pai-zoo train``: continued pretraining and SFT on megatron-core's own engine.

The pieces are megatron-core's: ``GPTModel`` in ``DistributedDataParallel``,
``get_megatron_optimizer``, ``OptimizerParamScheduler`` (linear warm-up, cosine decay),
``get_forward_backward_func`` (gradient accumulation and pipeline schedules),
``finalize_model_grads`` and ``dist_checkpointing``. pai-zoo adds the model source (preset, HF
folder, Megatron checkpoint), the data order, the logs and exact resume.

What a run reports (rank 0): a start-up summary before step 1 (model, parameters, layout, steps, tokens per step,
warm-up, data, where the logs and checkpoints go), one line per logged step with an ETA (or a progress bar on a
terminal), one line per checkpoint save. SIGINT (Ctrl-C), SIGTERM or SIGUSR1 (SLURM's pre-emption warning) stops
the run after the step in progress, which is saved first (unless that step was just saved), with
:class:`~pai_zoo.util.interrupt.Interrupted` (exit 130 / 143 / 138 from the command line); a second signal stops at
once, leaving the previous checkpoint. Nothing half-written is left, and the same command resumes from the last
checkpoint.

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

import math
import time
from functools import partial
from pathlib import Path

import torch

from ..formats import training_run
from ..formats.training_run import iteration_name, latest_iteration
from ..hf.models import config_dict, hf_config
from ..mcore import import_megatron
from ..mcore.biased_experts import expert_tensor_parallel_size
from ..mcore.compat import ensure_model_parallel
from ..mcore.flops import model_flops_per_token, peak_flops
from ..mcore.mtp import take_losses
from ..mcore.parallel_sizes import check_layout, check_world
from ..models.handle import resolve
from ..models.tokenizer_fit import check_tokenizer_fit
from ..plugin.errors import PaiZooError
from ..tokenizers.names import model_files_folder, model_tokenizer
from ..util.dist import check_shared_folder
from ..util.interrupt import Interrupted, StopAtOnce, StopRequest, saved_line
from ..util.metrics import MetricsLog
from ..util.progress import ETA
from ..util.trackers import TRACKERS_FILE, Trackers
from . import data, optim
from .config import TrainConfig, TrainConfigError
from .data import check_data
from .display import StepDisplay, StepMetrics, format_metrics, short_count
from .model_setup import ModelSetup, _device, _world
from .run_checkpoint import load_checkpoint, prune_checkpoints, save_checkpoint
from .save_dir import check_save_dir, cleanup_on_failure

METRICS_FILE = training_run.METRICS_FILE


class Trainer(ModelSetup):
    """One training run. ``Trainer(cfg).run()`` trains (or resumes) and returns the last metrics."""

    def __init__(self, cfg: TrainConfig, echo=print):
        self.cfg = cfg
        self.echo = echo
        self.save_dir = Path(cfg.save)

    # -- set-up -------------------------------------------------------------------------------
    def _source(self):
        try:
            source = resolve(self.cfg.model, revision=self.cfg.revision)
        except PaiZooError as e:
            raise TrainConfigError(f"--model {self.cfg.model}: {e}") from None
        check_tokenizer_fit(source, ok=self.cfg.tokenizer_mismatch_ok, where=self.cfg.model)  # before the model
        return source

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
        check_layout(self.mcore_config, cfg.tensor_parallel_size, cfg.pipeline_parallel_size,
                     cp=cfg.context_parallel_size, error=TrainConfigError)
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
                              expert_model_parallel_size=cfg.expert_model_parallel_size,
                              expert_tensor_parallel_size=expert_tensor_parallel_size(self.mcore_config))
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
        check_shared_folder(self.save_dir, cfg.given("save"))  # several nodes: every one sees --save (shared FS)
        self._build_model(source)
        self._build_optimizer()
        self._build_data()

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
        length = self.last_length = batches[0].tokens.shape[1]
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

    def _stopped_setting_up(self) -> str:
        latest = self._latest()
        if latest is None:
            return "interrupted while setting up, before step 1; nothing was saved; rerun the same command to start"
        return (f"interrupted while setting up; last checkpoint {self.save_dir / iteration_name(latest)}; rerun the "
                f"same command to resume from step {latest}")

    def _stopped(self, step: int) -> str:
        """The line of a second signal, which stops at once: the checkpoint the run resumes from."""
        latest = self._latest()
        if latest is None:
            return f"interrupted at step {step}; no checkpoint yet; rerun the same command to start"
        return (f"interrupted at step {step}; last checkpoint {self.save_dir / iteration_name(latest)}; rerun the "
                f"same command to resume from step {latest}")

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
        """Train (or resume); a run that fails before its first save removes the --save folder it created."""
        check_save_dir(self.save_dir, force=self.cfg.force, model=self.cfg.model, option="--save")
        created = not self.save_dir.exists()
        try:
            with StopAtOnce(lambda: self._stopped_setting_up() if _world()[0] == 0 else ""):
                return self._run()  # the steps' loop catches the signals itself (a step in progress is saved)
        except BaseException:
            if _world()[0] == 0:
                cleanup_on_failure(self.save_dir, created)
            raise

    def _run(self) -> dict:
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
        trackers = self._trackers(start)
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
                    trackers.log(last, self._tracker_extras(metrics))
                    if log is not None and (
                        metrics.step % cfg.log_interval == 0 or metrics.step == cfg.train_steps or "eval_loss" in last
                    ):
                        log.write(last)
                        left = eta.seconds(metrics.step)
                        if bar.enabled:
                            bar.show(last, left)
                        else:
                            self.echo(format_metrics(last, cfg.train_steps, left))
                    saved = None
                    if metrics.step % cfg.save_interval == 0 or metrics.step == cfg.train_steps:
                        saved = self.save(metrics.step)
                    if metrics.step < cfg.train_steps and stop.requested():  # every rank agrees, and saves
                        saved = saved or self.save(metrics.step)
                        raise Interrupted(stop.signum, saved_line(done, saved) if self.rank == 0 else "")
        finally:
            bar.close()
            self.bar = None
            if log is not None:
                log.close()
            trackers.close()
        return last

    def _trackers(self, start: int) -> Trackers:
        """TensorBoard and W&B (``--tensorboard-dir``, ``--wandb-project``), written by the last pipeline stage's
        first tensor- and data-parallel rank; a run resumed (or restarted) in its folder continues its curves."""
        again = self.resumed_from is not None or (self.save_dir / TRACKERS_FILE).is_file()
        return Trackers(self.cfg.trackers(), self.save_dir, start if again else None, config=self.cfg.to_dict())

    def _tracker_extras(self, metrics: StepMetrics) -> dict:
        """Megatron-LM's scalars beside the log line's: ``batch-size``, ``samples vs steps`` and ``throughput``
        (model TFLOP/s per process, pai-zoo's MFU count: :func:`~pai_zoo.mcore.flops.model_flops_per_token`)."""
        extras = {"batch-size": self.cfg.global_batch_size,
                  "samples vs steps": metrics.step * self.cfg.global_batch_size}
        length = self.last_length
        try:
            flops = model_flops_per_token(self.mcore_config, length)
        except (KeyError, TypeError, AttributeError):  # a config the FLOPs count does not cover
            return extras
        return {**extras, "throughput": metrics.tokens_per_s * flops / self.world / 1e12}


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
