"""Run megatron-core on a machine without CUDA.

megatron-core assumes a GPU in a few places. :func:`apply_cpu_patch` redirects them to
the CPU at run time, without editing megatron-core's source, and only when
``torch.cuda.is_available()`` is false:

* ``torch.cuda.current_device()`` returns ``"cpu"`` and ``torch.cuda.synchronize()`` does
  nothing (without CUDA both would raise);
* the "CUDA" RNG states tracker keeps CPU generator states, so weight init and dropout
  forks work;
* in the modules listed in :data:`CUDA_LITERAL_MODULES`, tensors created with
  ``device="cuda"`` are created on the CPU and ``torch.cuda.current_stream()`` is the CPU's
  (no-op) stream (a proxy of ``torch`` is set as those modules' global ``torch``; megatron-core
  0.19's gradient buckets wait on the current stream before every reduction);
* gradient clipping by the total norm, which asserts CUDA gradients, scales CPU ones.
* activation recompute saves and restores no CUDA generator state (:func:`_patch_recompute_rng`).
* the distributed optimizer takes CPU parameters (:func:`_patch_distributed_optimizer`).
* tied embeddings under pipeline parallelism: the last stage's copy of the word embeddings,
  which megatron moves to CUDA before its first all-reduce, stays on the CPU.
* mixture of experts (:data:`MOE_MODULES`): the ``alltoall`` token dispatcher and the shared
  experts create a ``torch.cuda.Stream`` at construction and run work under ``torch.cuda.stream``;
  there they get the CPU's (no-op) stream. Without Transformer Engine, ``moe_utils.te_general_gemm``
  is an unbound name that the router reads: it is set to ``None`` (the router's plain ``torch.mm``);
  under expert parallelism its split sizes become numpy as on a GPU (:func:`_patch_split_sizes`).

:func:`ensure_model_parallel` sets up a single-process gloo group and megatron's
parallel state when the caller has not.
"""
from __future__ import annotations

import contextlib
import functools
import importlib
import socket

import torch

from ..util.dist import launched_by_torchrun, local_rank
from . import import_megatron
from .moe_aux_loss import fix_aux_loss_scale
from .parallel_sizes import check_world

import_megatron()

#: megatron-core modules whose ``device="cuda"`` literals are redirected to the CPU.
CUDA_LITERAL_MODULES = (
    "megatron.core.transformer.utils",
    "megatron.core.pipeline_parallel.schedules",
    "megatron.core.optimizer.optimizer",
    "megatron.core.optimizer.clip_grads",
    "megatron.core.utils",  # local_multi_tensor_l2_norm (gradient norm without apex)
    "megatron.core.distributed.param_and_grad_buffer",  # 0.19: start_grad_sync waits on the current stream
)

#: megatron-core MoE modules that create or enter CUDA streams (redirected like :data:`CUDA_LITERAL_MODULES`).
MOE_MODULES = (
    "megatron.core.transformer.moe.token_dispatcher",  # alltoall: cuda_dtoh_stream = torch.cuda.Stream()
    "megatron.core.transformer.moe.shared_experts",  # SharedExpertMLP.stream
    "megatron.core.transformer.moe.moe_layer",  # 0.19: waits on SharedExpertMLP.stream
)

_FACTORIES = (
    "zeros",
    "ones",
    "empty",
    "full",
    "tensor",
    "arange",
    "rand",
    "randn",
    "zeros_like",
    "ones_like",
    "empty_like",
)
_applied = False


def _on_cpu(value):
    if isinstance(value, str) and value.startswith("cuda"):
        return "cpu"
    if isinstance(value, torch.device) and value.type == "cuda":
        return torch.device("cpu")
    return value


class _CpuEvent:
    """A CUDA event on the CPU: everything has already happened."""

    def record(self, stream=None):
        pass

    def synchronize(self):
        pass

    def wait(self, stream=None):
        pass

    def query(self):
        return True


class _CpuSideStream:
    """A CUDA side stream on the CPU, where work runs in order: waits do nothing, events are done."""

    def wait_stream(self, stream):
        pass

    def wait_event(self, event):
        pass

    def record_event(self, event=None):
        return event or _CpuEvent()

    def synchronize(self):
        pass


class _CpuCuda:
    """Stands in for ``torch.cuda`` inside the modules of :data:`CUDA_LITERAL_MODULES`: the current
    stream is the CPU's, whose ``wait_event``/``wait_stream`` do nothing; everything else is ``torch.cuda``."""

    @staticmethod
    def current_stream(device=None):
        return torch.cpu.current_stream()

    @staticmethod
    def Stream(*args, **kwargs):  # noqa: N802 - torch.cuda.Stream's name
        return _CpuSideStream()

    @staticmethod
    def stream(stream):
        return contextlib.nullcontext(stream)

    def __getattr__(self, name):
        return getattr(torch.cuda, name)


class _CpuTorch:
    """Stands in for the ``torch`` module inside one megatron-core module: tensor factories
    called with a CUDA device create CPU tensors; everything else is plain torch. Each name is
    looked up once and kept on the instance (these modules run in every layer's forward)."""

    cuda = _CpuCuda()

    def __getattr__(self, name):
        original = getattr(torch, name)
        attr = original
        if name in _FACTORIES:
            @functools.wraps(original)
            def attr(*args, **kwargs):
                if "device" in kwargs:
                    kwargs["device"] = _on_cpu(kwargs["device"])
                return original(*args, **kwargs)

        setattr(self, name, attr)
        return attr


def _patch_rng_tracker() -> None:
    from megatron.core.tensor_parallel import random as mrandom

    base = mrandom.CudaRNGStatesTracker
    if getattr(base, "_pai_zoo_cpu", False):
        return

    class CpuRNGStatesTracker(base):
        """megatron's RNG states tracker over CPU generator states."""

        _pai_zoo_cpu = True

        def add(self, name, seed):
            self._is_initialized = True
            if seed in self.seeds_:
                raise Exception(f"seed {seed} already exists")
            self.seeds_.add(seed)
            if name in self.states_:
                raise Exception(f"rng state {name} already exists")
            self.states_[name] = torch.Generator().manual_seed(seed).get_state()

        @contextlib.contextmanager
        def fork(self, name=mrandom._MODEL_PARALLEL_RNG_TRACKER_NAME):
            if name not in self.states_:
                raise Exception(f"rng state {name} is not added")
            orig = torch.get_rng_state()
            torch.set_rng_state(self.states_[name])
            try:
                yield
            finally:
                self.states_[name] = torch.get_rng_state()
                torch.set_rng_state(orig)

    mrandom.CudaRNGStatesTracker = CpuRNGStatesTracker
    mrandom.initialize_rng_tracker(force_reset=True)


def _clip_grad_by_total_norm(parameters, max_norm, total_norm, use_decoupled_grad=False):
    """megatron's ``clip_grad_by_total_norm_fp32`` for gradients of any device."""
    if isinstance(parameters, torch.Tensor):
        parameters = [parameters]
    attr = "decoupled_grad" if use_decoupled_grad else "grad"
    grads = [getattr(p, attr) for p in parameters if getattr(p, attr, None) is not None]
    clip_coeff = max_norm / (total_norm + 1.0e-6)
    if clip_coeff < 1.0:
        torch._foreach_mul_([g.detach() for g in grads], clip_coeff)


def _patch_grad_clipping() -> None:
    for name in ("megatron.core.optimizer.clip_grads", "megatron.core.optimizer.optimizer"):
        module = importlib.import_module(name)
        if hasattr(module, "clip_grad_by_total_norm_fp32"):
            module.clip_grad_by_total_norm_fp32 = _clip_grad_by_total_norm


def _patch_tied_embeddings() -> None:
    """``LanguageModule.setup_embeddings_and_output_layer`` calls ``weight.data.cuda()`` before it
    all-reduces the tied embedding between the first and last pipeline stage: keep it on the CPU."""
    from megatron.core.models.common.language_module.language_module import LanguageModule

    original = LanguageModule.setup_embeddings_and_output_layer
    if getattr(original, "_pai_zoo_cpu", False):
        return

    @functools.wraps(original)
    def setup_embeddings_and_output_layer(self, *args, **kwargs):
        cuda = torch.Tensor.cuda
        torch.Tensor.cuda = lambda tensor, *a, **k: tensor
        try:
            return original(self, *args, **kwargs)
        finally:
            torch.Tensor.cuda = cuda

    setup_embeddings_and_output_layer._pai_zoo_cpu = True
    LanguageModule.setup_embeddings_and_output_layer = setup_embeddings_and_output_layer


def _patch_recompute_rng() -> None:
    """megatron-core's activation recompute (``tensor_parallel.checkpoint``) saves and restores the CUDA
    generator's state around the recomputed forward; without CUDA there is none: it saves ``None`` and
    restores nothing (the CPU generator and the RNG tracker's states are still saved and restored)."""
    from megatron.core.tensor_parallel import random as mrandom

    if getattr(mrandom._get_cuda_rng_state, "_pai_zoo_cpu", False):
        return
    get, put = mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state

    def get_cuda_rng_state(*args, **kwargs):
        return None if not torch.cuda.is_available() else get(*args, **kwargs)

    def set_cuda_rng_state(new_state, *args, **kwargs):
        if new_state is not None:
            put(new_state, *args, **kwargs)

    get_cuda_rng_state._pai_zoo_cpu = True
    mrandom._get_cuda_rng_state, mrandom._set_cuda_rng_state = get_cuda_rng_state, set_cuda_rng_state


def _patch_distributed_optimizer() -> None:
    """megatron-core's ``DistributedOptimizer`` sorts the parameters it shards by ``param.type()``, accepting
    ``torch.cuda.FloatTensor`` (and half/bfloat16) only: while it is built, a CPU tensor's ``type()`` is the CUDA
    name of its dtype (nothing else changes). Its fully reshardable checkpoint format gathers the state with
    ``.cuda()`` tensors unless told to use gloo: on the CPU it is told; and on loading it copies every entry of
    torch Adam's per-parameter state, ``step`` included, which that format keeps in the param groups only, and
    restores that ``step`` as one tensor shared by every parameter (each gets its own copy here)."""
    from megatron.core.optimizer.distrib_optimizer import DistributedOptimizer

    original = DistributedOptimizer.__init__
    if getattr(original, "_pai_zoo_cpu", False):
        return

    @functools.wraps(original)
    def __init__(self, *args, **kwargs):  # noqa: N807 - the wrapped method's name
        tensor_type = torch.Tensor.type

        def cuda_type(tensor, *a, **k):
            name = tensor_type(tensor, *a, **k)
            if a or k or tensor.is_cuda or not isinstance(name, str):
                return name
            return name.replace("torch.", "torch.cuda.", 1)

        torch.Tensor.type = cuda_type
        try:
            original(self, *args, **kwargs)
        finally:
            torch.Tensor.type = tensor_type

    __init__._pai_zoo_cpu = True
    DistributedOptimizer.__init__ = __init__

    gather = DistributedOptimizer.get_parameter_state_dp_zero

    @functools.wraps(gather)
    def get_parameter_state_dp_zero(self, *args, **kwargs):  # the fully reshardable format's gather
        kwargs["use_gloo_comm"] = True  # CPU tensors over the gloo data-parallel group (not .cuda() ones)
        return gather(self, *args, **kwargs)

    DistributedOptimizer.get_parameter_state_dp_zero = get_parameter_state_dp_zero

    put = DistributedOptimizer._set_main_param_and_optimizer_states

    @functools.wraps(put)
    def _set_main_param_and_optimizer_states(self, model_param, tensors):
        # torch's Adam (no apex or TE here) keeps a "step" in every parameter's state, which the fully reshardable
        # format saves once, in the param groups (load_state_dict restores it from there): it is left as it is
        if "step" not in tensors and not self.config.use_precision_aware_optimizer_no_fp8_or_ds_fp8:
            group, order = self.model_param_group_index_map[model_param]
            state = self.optimizer.state[self.optimizer.param_groups[group]["params"][order]]
            if "step" in state:
                tensors = {**tensors, "step": state["step"]}
        return put(self, model_param, tensors)

    DistributedOptimizer._set_main_param_and_optimizer_states = _set_main_param_and_optimizer_states

    load = DistributedOptimizer.load_state_dict

    @functools.wraps(load)
    def load_state_dict(self, state_dict):
        # without apex or TE it gives every parameter's state one shared "step" tensor, which torch's Adam then
        # advances once per parameter and step (a wrong bias correction after a resume): each gets its own
        load(self, state_dict)
        for state in self.optimizer.state.values():
            if torch.is_tensor(state.get("step")):
                state["step"] = state["step"].clone()

    DistributedOptimizer.load_state_dict = load_state_dict


def _patch_split_sizes() -> None:
    """The ``alltoall`` dispatcher moves its expert-parallel split sizes "to the CPU as numpy"
    (``maybe_move_tensor_to_cpu(..., as_numpy=True)``), which only acts on CUDA tensors: on the CPU they
    stayed tensors, which ``all_to_all_single`` refuses. Here CPU tensors become numpy as well."""
    from megatron.core.transformer.moe import token_dispatcher

    original = getattr(token_dispatcher, "maybe_move_tensor_to_cpu", None)
    if original is None or getattr(original, "_pai_zoo_cpu", False):
        return

    @functools.wraps(original)
    def maybe_move_tensor_to_cpu(tensor, as_numpy=False, record_stream=False):
        if as_numpy and torch.is_tensor(tensor) and not tensor.is_cuda:
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    maybe_move_tensor_to_cpu._pai_zoo_cpu = True
    token_dispatcher.maybe_move_tensor_to_cpu = maybe_move_tensor_to_cpu


def _patch_moe(proxy) -> None:
    """MoE on the CPU: the stream-creating modules see ``proxy`` as ``torch``; the router's
    ``te_general_gemm`` (an unbound name without Transformer Engine) is ``None``."""
    from megatron.core.transformer.moe import moe_utils

    if not hasattr(moe_utils, "te_general_gemm"):
        moe_utils.te_general_gemm = None
    _patch_split_sizes()
    for name in MOE_MODULES:
        try:
            module = importlib.import_module(name)
        except ImportError:  # pragma: no cover - a megatron-core without this module
            continue
        module.torch = proxy


def apply_cpu_patch() -> bool:
    """Apply the CPU compatibility patch once; returns whether it is active (no CUDA)."""
    global _applied
    if torch.cuda.is_available():
        return False
    if _applied:
        return True
    torch.cuda.current_device = lambda: "cpu"
    torch.cuda.synchronize = lambda *args, **kwargs: None
    _patch_rng_tracker()
    _patch_grad_clipping()
    _patch_tied_embeddings()
    _patch_recompute_rng()
    _patch_distributed_optimizer()
    proxy = _CpuTorch()
    for name in CUDA_LITERAL_MODULES:
        importlib.import_module(name).torch = proxy
    _patch_moe(proxy)
    _applied = True
    return True


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def ensure_model_parallel(tensor_parallel_size: int = 1, pipeline_parallel_size: int = 1, seed: int = 1234,
                          **sizes: int | None) -> None:
    """Make megatron-core usable in this process: the CPU patch (without CUDA), a
    ``torch.distributed`` group (single-process gloo when none exists), megatron's
    parallel state and its RNG tracker (``sizes``: more of ``initialize_model_parallel``'s sizes, such as
    ``virtual_pipeline_model_parallel_size`` or ``context_parallel_size``). Does nothing that is already set up.
    A layout larger than the world
    (``tp=3`` in one process) is a :class:`~pai_zoo.errors.PaiZooError` that gives the torchrun command to use."""
    from megatron.core import parallel_state
    from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed


    apply_cpu_patch()
    fix_aux_loss_scale()  # megatron-core 0.16's MoE load-balancing loss under sequence parallelism, as 0.19 scales it
    if not parallel_state.model_parallel_is_initialized():
        check_world(tensor_parallel_size, pipeline_parallel_size)
    if not torch.distributed.is_initialized():
        if launched_by_torchrun():  # torchrun's env:// variables (several nodes too), or srun's mapped onto them
            backend = "nccl" if torch.cuda.is_available() else "gloo"
            if torch.cuda.is_available():  # one GPU per process: this node's LOCAL_RANK-th (of those it sees)
                torch.cuda.set_device(local_rank() % torch.cuda.device_count())
            torch.distributed.init_process_group(backend)
        else:
            torch.distributed.init_process_group(
                "gloo", init_method=f"tcp://127.0.0.1:{_free_port()}", rank=0, world_size=1
            )
    if not parallel_state.model_parallel_is_initialized():
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=tensor_parallel_size, pipeline_model_parallel_size=pipeline_parallel_size,
            **{k: v for k, v in sizes.items() if v is not None},
        )
        model_parallel_cuda_manual_seed(seed)
