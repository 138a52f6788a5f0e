"""``pai-zoo train --plan``: the memory of a run on each GPU, before launching it (no training, no torch).

For the model, the layout (TP x PP x CP x DP, virtual pipeline) and the settings, per rank of the fullest
pipeline stage:

* parameters and gradients: the rank's share of megatron-core's layers (counted as megatron-core builds them:
  tensor-parallel weights split, norms and row-parallel biases replicated, the padded vocabulary split over TP,
  the word embeddings on the first stage, the output layer and final norm on the last, a tied output layer copied
  to the last stage under PP); parameters in the run's dtype, gradients in fp32 (megatron-core's grad buffer with
  ``grad_reduce_in_fp32``);
* the Adam state: fp32 main weights (with bf16 parameters) and two moments, 12 or 8 bytes a parameter, all on
  each rank, or divided over the data-parallel ranks with the distributed optimizer;
* activations per micro-batch and layer by Korthikanti et al. (2022), "Reducing Activation Recomputation in
  Large Transformer Models": ``s b h (10 + 24/t + 5 a s / (h t))`` bytes, ``s b h / t (34 + 5 a s / h)`` with
  sequence parallelism, without the attention term under selective recompute, ``2 s b h`` (the layer's input;
  divided by ``t`` with SP) under full recompute; the first pipeline stage holds ``min(pp, micro-batches)``
  micro-batches in flight (1F1B; times ``1 + (pp - 1) / (pp v)`` interleaved), plus the fp32 logits of one
  micro-batch on the last stage. An estimate: the allocator's fragmentation and communication buffers come on top.

With ``--peft lora`` the base is frozen: gradients and Adam state are the adapters' only (each rank's share: A
replicated and B split for a column-parallel base, the reverse for a row-parallel one), the weights are the base's
plus the adapters', and the activations stay those of full training (the frozen layers still keep their inputs for
the backward pass that reaches the adapters below them; the adapters' own rank-r activations are left out).
"""
from __future__ import annotations

from dataclasses import dataclass

from ..families.registry import get_registry
from ..lora.targets import lora_targets, select
from ..tables.layer_kinds import layer_parameter_counts, layer_parts, recurrent_state_bytes

GIB = 1024**3


@dataclass(frozen=True)
class StageParams:
    """Parameters on one tensor-parallel rank of one pipeline rank (all its virtual-pipeline chunks)."""

    pp_rank: int
    layers: int
    parameters: int


def layer_parameters(config, tp: int = 1) -> int:
    """One transformer layer's parameters on one tensor-parallel rank, as megatron-core's local/TE GPT layer
    builds them (dense MLP; column-parallel biases split, row-parallel biases and norms replicated); the first
    layer's of a hybrid model (:func:`pai_zoo.training.layer_kinds.layer_parameter_counts` gives every layer's)."""
    return layer_parameter_counts(config, tp)[0]


def stage_parameters(config, tp: int = 1, pp: int = 1, vpp: int = 1) -> list[StageParams]:
    """Each pipeline rank's parameters on one tensor-parallel rank (the layer split of megatron-core: an equal
    number of layers per rank, interleaved over the virtual stages)."""
    a = config.arch
    h, layers = a["hidden_size"], config.num_layers
    vocab = config.padded_vocab_size(tp) // tp * h
    norm = h * (2 if a.get("normalization", "LayerNorm") == "LayerNorm" else 1)
    per_layer = layer_parameter_counts(config, tp)  # each layer's, by its kind (hybrid models mix kinds)
    out = []
    for rank in range(pp):
        count = sum(per_layer[rank * (layers // pp):(rank + 1) * (layers // pp)])
        if rank == 0:
            count += vocab
            if a.get("position_embedding_type", "learned_absolute") == "learned_absolute":
                count += int(a.get("max_sequence_length", 4096)) * h
        if rank == pp - 1:
            count += norm  # the final norm
            if not config.tied_embeddings or pp > 1:
                count += vocab  # the output layer (under PP a tied one is a copy on the last stage)
        out.append(StageParams(rank, layers // pp, count))
    return out


def _projection_shapes(target, config) -> list[tuple[int, int]]:
    """(out, in) of each HF projection fused into ``target``'s linear."""
    a = config.arch
    h, heads, groups, kv = a["hidden_size"], config.num_attention_heads, config.num_query_groups, config.kv_channels
    ffn = a.get("ffn_hidden_size") or 4 * h
    if "shared_experts" in target.in_module:
        ffn = int(a.get("moe_shared_expert_intermediate_size") or ffn)
    name, n = target.megatron_name, len(target.hf)
    if name == "linear_qkv":
        rows = [heads * kv, groups * kv, groups * kv] if n == 3 else [kv * (heads + 2 * groups)]
        return [(r, h) for r in rows]
    if name == "linear_proj":
        return [(h, heads * kv)]
    if name == "linear_fc1":
        return [(ffn, h)] * n if n > 1 else [(ffn * (2 if a.get("gated_linear_unit") else 1), h)]
    if name == "linear_fc2":
        return [(h, ffn)]
    return []


def lora_layer_parameters(config, settings, tp: int = 1) -> int:
    """One decoder layer's LoRA parameters on one tensor-parallel rank (``settings``: a run's
    :class:`~pai_zoo.lora.settings.LoraSettings`)."""
    family = get_registry().family(config.family)
    chosen = select(lora_targets(get_registry().weight_map(family, config)), settings.targets, family.name)
    r, count = settings.rank, 0
    for target, which in chosen.items():
        if target.row.layer_kind == "dense" and config.get("num_moe_experts"):
            continue
        shapes = _projection_shapes(target, config)
        column = target.megatron_name in ("linear_qkv", "linear_fc1")
        for i in which:
            if i < len(shapes):
                out, inp = shapes[i]
                count += r * inp + out * r // tp if column else r * inp // tp + out * r
    return count


@dataclass(frozen=True)
class Plan:
    """Bytes per GPU on the fullest pipeline stage."""

    layout: str
    parameters_per_rank: int
    parameters: float
    gradients: float
    optimizer: float
    optimizer_distributed: float
    activations: float
    activations_no_recompute: float
    distributed_optimizer: bool
    recompute: str | None
    trainable_per_rank: int | None = None  # a LoRA run: the adapters' parameters (the rest is frozen)
    vision: tuple[int, int] | None = None  # a vision-language model's (tower, projector) parameters per TP rank
    #: a hybrid model's recurrent layers (Gated DeltaNet, Mamba-2): (count, state bytes a generation keeps per sequence
    #: on one TP rank, chunk-state bytes of a training step's micro-batch, counted in the activations)
    recurrent: tuple[int, float, float] | None = None

    @property
    def total(self) -> float:
        optimizer = self.optimizer_distributed if self.distributed_optimizer else self.optimizer
        return self.parameters + self.gradients + optimizer + self.activations


def activation_bytes(config, cfg, recompute: str | None, dp: int = 1) -> float:
    """Activation memory of the first pipeline stage for one step (the micro-batches in flight)."""
    a = config.arch
    h, heads, layers = a["hidden_size"], config.num_attention_heads, config.num_layers
    s, b, t = cfg.sequence_length // cfg.context_parallel_size, cfg.batch_size, cfg.tensor_parallel_size
    pp, vpp = cfg.pipeline_parallel_size, cfg.virtual_pipeline_model_parallel_size or 1
    attention = 5 * heads * s / h
    if recompute == "full":
        per_layer = 2 * s * b * h / (t if cfg.sequence_parallel else 1)
    elif cfg.sequence_parallel:
        per_layer = s * b * h / t * (34 + (0 if recompute == "selective" else attention))
    else:
        per_layer = s * b * h * (10 + 24 / t + (0 if recompute == "selective" else attention / t))
    micro = cfg.global_batch_size // (cfg.batch_size * dp)
    in_flight = min(pp, max(micro, 1)) * (1 + (pp - 1) / (pp * vpp) if vpp > 1 else 1)
    logits = s * b * config.padded_vocab_size(t) / t * 4 if pp == 1 else 0
    # a recurrent layer (Gated DeltaNet, Mamba-2) has no s x s attention scores; its chunked kernel keeps one state per
    # chunk for the backward pass instead (pai_zoo.training.layer_kinds); the first stage's share of such layers
    recurrent = sum(1 for parts in layer_parts(config) if {"linear_attention", "mamba"} & set(parts))
    stage = layers // pp
    share = recurrent * stage / max(layers, 1)
    scores = 0 if recompute in ("full", "selective") else s * b * h * attention / t
    chunks = 0 if recompute == "full" else recurrent_state_bytes(config, t, s, b)[1] / max(recurrent, 1)
    return (stage * per_layer + share * (chunks - scores)) * in_flight + logits


def make_plan(config, cfg, world: int) -> Plan:
    """The :class:`Plan` of ``cfg`` (a :class:`~pai_zoo.training.config.TrainConfig`) for ``config`` (the model's
    :class:`~pai_zoo.plugin.config_map.McoreConfig`) on ``world`` GPUs."""
    tp, pp, cp = cfg.tensor_parallel_size, cfg.pipeline_parallel_size, cfg.context_parallel_size
    dp = cfg.data_parallel_size(world)
    stages = stage_parameters(config, tp, pp, cfg.virtual_pipeline_model_parallel_size or 1)
    vision = vision_parameters(config, tp)
    if vision is not None:  # the tower on the first pipeline stage
        stages[0] = StageParams(0, stages[0].layers, stages[0].parameters + vision[0])
    n = max(s.parameters for s in stages)
    width = 2 if cfg.bf16 else 4
    lora = cfg.lora_settings()
    trainable = None
    if lora is not None:
        trainable = max(s.layers for s in stages) * lora_layer_parameters(config, lora, tp)
    learned = n if trainable is None else trainable
    adam = (12 if cfg.bf16 else 8) * learned
    layout = f"{world} GPUs = TP {tp} x PP {pp}" + (f" x CP {cp}" if cp > 1 else "") + f" x DP {dp}"
    if (cfg.virtual_pipeline_model_parallel_size or 1) > 1:
        layout += f" (virtual pipeline {cfg.virtual_pipeline_model_parallel_size})"
    return Plan(layout, n + (trainable or 0), width * (n + (trainable or 0)), 4 * learned, adam, adam / dp,
                activation_bytes(config, cfg, cfg.recompute, dp), activation_bytes(config, cfg, None, dp),
                cfg.use_distributed_optimizer, cfg.recompute, trainable, vision, _recurrent(config, cfg))


def _recurrent(config, cfg) -> tuple[int, float, float] | None:
    count = sum(1 for parts in layer_parts(config) if {"linear_attention", "mamba"} & set(parts))
    if not count:
        return None
    inference, training = recurrent_state_bytes(config, cfg.tensor_parallel_size,
                                                cfg.sequence_length // cfg.context_parallel_size, cfg.batch_size)
    return count, inference, training


def vision_parameters(config, tp: int = 1) -> tuple[int, int] | None:
    """A vision-language model's ``(tower, projector)`` parameters on one TP rank (the family's count), or None."""
    spec = get_registry().family(config.family).vision
    if spec is None or spec.parameters is None:
        return None
    return spec.parameters(config, tp)


def plan_lines(plan: Plan, gpu_memory_gb: float | None = None) -> list[str]:
    """The plan as ``pai-zoo train --plan`` prints it."""
    def gib(x: float) -> str:
        return f"{x / GIB:,.1f} GiB"

    opt, opt_d = plan.optimizer, plan.optimizer_distributed
    lines = [
        f"layout: {plan.layout}",
        f"parameters per GPU (fullest pipeline stage): {plan.parameters_per_rank:,}",
        f"  weights {gib(plan.parameters)}, gradients (fp32) {gib(plan.gradients)}",
        f"  Adam state {gib(opt)} without the distributed optimizer, {gib(opt_d)} with it"
        + (" (in use)" if plan.distributed_optimizer else " (use_distributed_optimizer)"),
        f"  activations {gib(plan.activations)} per step with "
        + (f"{plan.recompute} recompute" if plan.recompute else "no recompute")
        + (f" ({gib(plan.activations_no_recompute)} without recompute)" if plan.recompute else ""),
        f"total per GPU: {gib(plan.total)}",
    ]
    if plan.trainable_per_rank is not None:
        lines.insert(2, f"  LoRA: {plan.trainable_per_rank:,} of them trainable (the adapters); the base is frozen, "
                        "so gradients and Adam state are the adapters' only; activations as in full training")
    if plan.vision is not None:
        lines.insert(2, f"  vision tower (first stage, counted above): {plan.vision[0]:,}, its projector "
                        f"{plan.vision[1]:,}")
    if plan.recurrent is not None:
        count, inference, training = plan.recurrent
        lines.insert(-1, f"  recurrent layers (Gated DeltaNet / Mamba-2): {count}; their state is "
                         f"{inference / 2**20:,.2f} MiB per sequence in generation, {gib(training)} of chunk states "
                         "per micro-batch in training (counted in the activations)")
    if gpu_memory_gb is not None:
        budget = gpu_memory_gb * 1e9
        verdict = "fits" if plan.total <= budget else "does NOT fit"
        lines.append(f"  {verdict} in --gpu-memory {gpu_memory_gb:g} GB ({gib(budget)}): "
                     f"{plan.total / budget:.0%} of it")
    return lines
