"""``pai_zoo.load``: one entry point for presets, families and checkpoint folders, in both backends."""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .checkpoint import HFCheckpoint, is_hf_checkpoint, read_config
from .config_map import McoreConfig
from .errors import UnknownModelError
from .family import Family
from .registry import get_registry

BACKENDS = ("mcore", "hf")


@dataclass
class ModelHandle:
    """A loaded model and what belongs with it.

    ``model`` is a megatron-core ``GPTModel`` (backend ``"mcore"``) or a transformers model
    (``"hf"``); ``config`` is that backend's own config (``TransformerConfig`` or the
    transformers config); ``hf_config`` and ``mcore_config`` are both translations, always
    present; ``tokenizer`` is set when the checkpoint carries one.
    """

    model: Any
    family: Family
    backend: str
    hf_config: Any
    mcore_config: McoreConfig
    tokenizer: Any = None
    checkpoint: Path | None = None

    @property
    def config(self):
        return self.model.config

    @property
    def vocab_size(self) -> int:
        return self.mcore_config["vocab_size"]

    def logits(self, input_ids, attention_mask=None):
        """Next-token logits ``FloatTensor[batch, seq, vocab]``, vocabulary padding trimmed.

        ``attention_mask`` (``[batch, seq]``, 1 = real token) handles padded batches: padding is
        masked out and each row's positions count from its first real token, in both backends.
        """
        import torch

        input_ids = torch.as_tensor(input_ids)
        if input_ids.dim() == 1:
            input_ids = input_ids.unsqueeze(0)
        with torch.no_grad():
            if self.backend == "hf":
                positions = None if attention_mask is None else causal_mask(input_ids, attention_mask)[1]
                out = self.model(input_ids=input_ids, attention_mask=attention_mask, position_ids=positions).logits
            else:
                out = mcore_forward(self.model, input_ids, attention_mask)
        return out[..., : self.vocab_size]

    def hf_state_dict(self) -> dict:
        """The weights under Hugging Face names (converted when the backend is megatron-core)."""
        if self.backend == "hf":
            return dict(self.model.state_dict())
        from .weights import mcore_tensors, mcore_to_hf

        return mcore_to_hf(self.family, self.mcore_config, mcore_tensors(self.model))


def causal_mask(input_ids, attention_mask=None):
    """megatron-core's boolean mask ``[b, 1, s, s]`` (True = masked) and position ids for a batch."""
    import torch

    b, s = input_ids.shape
    mask = torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).expand(b, 1, s, s)
    if attention_mask is None:
        positions = torch.arange(s).unsqueeze(0).expand(b, s)
        return mask, positions
    keep = torch.as_tensor(attention_mask).bool()
    mask = mask | ~keep[:, None, None, :]
    positions = (keep.long().cumsum(-1) - 1).clamp(min=0)
    return mask, positions


def mcore_forward(model, input_ids, attention_mask=None, position_ids=None):
    """Run a ``GPTModel`` on ``input_ids`` with an explicit causal mask; logits ``[b, s, padded vocab]``."""
    mask, positions = causal_mask(input_ids, attention_mask)
    return model(input_ids, positions if position_ids is None else position_ids, mask)


def resolve(name_or_path, checkpoint=None) -> tuple[Family, dict, Path | None]:
    """``(family, HF config dict, checkpoint folder or None)`` for what :func:`load` accepts."""
    registry = get_registry()
    name = str(name_or_path)
    ckpt = Path(checkpoint) if checkpoint is not None else None
    if registry.is_preset(name):
        family, config = registry.preset(name)
    elif registry.is_family(name):
        family = registry.family(name)
        config = dict(family.presets[family.tiny])
    elif is_hf_checkpoint(name):
        ckpt = Path(name)
        config = read_config(ckpt)
        family = registry.family_for_hf_config(config, where=str(ckpt / "config.json"))
    else:
        raise UnknownModelError(registry._unknown(name))
    if ckpt is not None:
        if not is_hf_checkpoint(ckpt):
            raise UnknownModelError(f"checkpoint {ckpt}: no config.json there")
        config = read_config(ckpt)
    return family, config, ckpt


def load(name_or_path, backend: str = "mcore", checkpoint=None, *, dtype=None, seed: int = 0, **overrides) -> ModelHandle:
    """Load a model as a :class:`ModelHandle`.

    ``name_or_path`` is a preset (``"llama3-tiny"``), a family name or alias (with
    ``checkpoint=`` a HF folder; alone it builds the family's tiny preset), or a HF checkpoint
    folder (family detected from its ``config.json``). Without a checkpoint the weights are
    random (seeded by ``seed``). ``overrides`` replace HF config fields
    (``num_hidden_layers=4``). ``backend="mcore"`` gives a megatron-core ``GPTModel``,
    ``backend="hf"`` a transformers model.
    """
    import torch

    from . import hf
    from .mcore.build import build_gpt_model
    from .mcore.compat import ensure_model_parallel
    from .weights import load_into, mcore_tensors

    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {BACKENDS}, not {backend!r}")
    family, config, ckpt = resolve(name_or_path, checkpoint)
    config.update(overrides)
    hf_config = hf.hf_config(family, config)
    mcore_config = family.to_mcore_config(hf.config_dict(hf_config))
    dtype = dtype or torch.float32
    if backend == "hf":
        torch.manual_seed(seed)
        if ckpt is not None:
            cls = hf.model_class(family, hf_config.model_type)
            model = cls.from_pretrained(ckpt, config=hf_config, dtype=dtype).eval()
        else:
            model = hf.build_hf_model(family, hf_config, dtype)
    else:
        ensure_model_parallel()
        from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed

        torch.manual_seed(seed)
        model_parallel_cuda_manual_seed(seed)
        model = build_gpt_model(family, mcore_config, dtype)
        if ckpt is not None:
            source = HFCheckpoint(ckpt)
            from .mapping import TO_MCORE, MappingContext

            table = get_registry().weight_map(family, mcore_config)
            ctx = MappingContext.from_config(mcore_config)
            target = mcore_tensors(model)
            state = dict(table.iter_convert(TO_MCORE, ctx, source.get, source.names(), target.keys()))
            load_into(model, state, f"{ckpt} -> megatron-core")
        model.eval()
    tokenizer = None
    if ckpt is not None:
        try:
            tokenizer = get_registry().tokenizer(family, ckpt)
        except FileNotFoundError:
            tokenizer = None
    return ModelHandle(model, family, backend, hf_config, mcore_config, tokenizer, ckpt)
