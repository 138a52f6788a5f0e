"""The checks that change weights: a few optimizer steps lower the loss, and a PEFT LoRA adapter maps onto
pai-zoo's megatron-core LoRA with the same logits."""
from __future__ import annotations

from .cases import Case, _fail, copy_case


def check_training(case: Case, steps: int = 8, lr: float = 3e-3) -> tuple[float, float]:
    """A few optimizer steps on the megatron-core model (its own loss) lower the loss on a
    fixed batch. Returns (first loss, last loss)."""
    import torch

    from pai_zoo.mcore.build import build_gpt_model
    from pai_zoo.mcore.forward import causal_mask

    model = build_gpt_model(case.family, case.mcore_config)
    model.load_state_dict(case.mcore_model.state_dict())
    model.train()
    vocab = case.mcore_config["vocab_size"]
    gen = torch.Generator().manual_seed(7)
    tokens = torch.randint(0, vocab, (2, 17), generator=gen)
    ids, labels = tokens[:, :-1], tokens[:, 1:]
    mask, positions = causal_mask(ids)
    optimizer = torch.optim.AdamW(model.parameters(), lr=lr)
    losses = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss = model(ids, positions, mask, labels=labels).mean()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    if not all(map(torch.isfinite, map(torch.tensor, losses))):
        _fail("training", f"non-finite loss: {losses}")
    if not losses[-1] < 0.9 * losses[0]:
        _fail("training", f"loss did not fall by 10% in {steps} steps: {losses}")
    return losses[0], losses[-1]


def check_lora(case: Case, rank: int = 4, seed: int = 7) -> float:
    """A random PEFT LoRA adapter on every linear the family's table makes adaptable, made and applied by the real
    ``peft`` on the transformers model, gives the same logits through pai-zoo's LoRA on the megatron-core model
    (:func:`pai_zoo.models.verification.compare_logits`, float32), moves them far more than that tolerance, and comes
    back from pai-zoo's mcore form bit for bit. Returns max |delta|."""
    import copy

    import torch

    try:
        import peft
    except ImportError:
        _fail("lora", "peft is not installed (pip install peft): the LoRA check runs against it")
    from pai_zoo.families.registry import get_registry
    from pai_zoo.lora.adapters import add_lora
    from pai_zoo.lora.settings import LoraError, LoraSettings
    from pai_zoo.lora.targets import lora_targets, to_hf_form, to_mcore_form
    from pai_zoo.mcore.forward import mcore_forward
    from pai_zoo.models.verification import compare_logits
    from pai_zoo.tables.mapping import MappingContext

    targets = lora_targets(get_registry().weight_map(case.family, case.mcore_config))
    leaves = sorted({leaf for t in targets for leaf in t.leaves})
    if not leaves:
        _fail("lora", "the family's table maps no decoder linear from HF projections: nothing for LoRA to adapt")
    ctx = MappingContext.from_config(case.mcore_config)
    # the projections by their full module names (PEFT also maps leaf names such as gate_proj onto transformers'
    # fused routed experts, which pai-zoo does not adapt)
    modules = dict(case.hf_model.named_modules())
    family = case.family
    names = sorted(family.hf_module_name(h.replace("{layer}", str(layer))) for t in targets
                   for layer in ctx.layers_of(t.row.layer_kind) for h in t.hf)
    absent = [n for n in names if not isinstance(modules.get(n), torch.nn.Linear)]
    if absent:
        _fail("lora", f"the table's projections {absent[:3]} are no torch.nn.Linear of the transformers model: PEFT "
                      "names adapters by module, so an adapter would not map")
    torch.manual_seed(seed)
    hf_model = peft.get_peft_model(copy.deepcopy(case.hf_model), peft.LoraConfig(
        r=rank, lora_alpha=2 * rank, target_modules=names, init_lora_weights=False)).eval()
    # PEFT maps gate_proj/up_proj onto transformers' fused routed experts too (a ParamWrapper): those adapters
    # are set to do nothing, as pai-zoo does not adapt routed experts
    prefix = "base_model.model."
    with torch.no_grad():
        for name, param in hf_model.named_parameters():
            if ".lora_B." in name and name[len(prefix):].split(".lora_B.")[0] not in names:
                param.zero_()
    state = {k: v for k, v in peft.get_peft_model_state_dict(hf_model).items()
             if k[len(prefix):].rsplit(".lora_", 1)[0] in names}
    adapters: dict = {}
    for name, tensor in state.items():
        module, part = name[len(prefix):].rsplit(".lora_", 1)
        adapters.setdefault(module, [None, None])[0 if part.startswith("A") else 1] = tensor.detach().clone()
    adapters = {m: tuple(pair) for m, pair in adapters.items()}
    for name in names:  # a projection PEFT's target-name conversion left unadapted: a zero update for pai-zoo
        if name not in adapters:
            out, inp = modules[name].weight.shape
            adapters[name] = (torch.zeros(rank, inp), torch.zeros(out, rank))
    # the table's names (checkpoint names) for pai-zoo, from PEFT's module names
    adapters = {family.hf_checkpoint_name(m): pair for m, pair in adapters.items()}
    try:
        mcore_form = to_mcore_form(adapters, targets, case.mcore_config, ctx)
    except LoraError as exc:  # a table row that does not place rows as megatron-core holds them
        _fail("lora", f"PEFT's adapters ({sorted(adapters)[:2]} ...) do not map onto megatron-core: {exc}")
    back = to_hf_form(mcore_form, targets, case.mcore_config, ctx)
    if set(back) != set(adapters) or any(not torch.equal(back[m][i], adapters[m][i]) for m in adapters for i in (0, 1)):
        _fail("lora", "the adapters do not come back bit for bit from megatron-core's form")
    settings = LoraSettings(rank=rank, alpha=2.0 * rank, targets=tuple(leaves))
    lora = copy_case(case)
    add_lora(lora.mcore_model, case.family, case.mcore_config, settings, adapters=mcore_form, where="the check")
    vocab = case.mcore_config["vocab_size"]
    ids = torch.randint(0, vocab, (2, 12), generator=torch.Generator().manual_seed(99))
    with torch.no_grad():
        expected = hf_model(input_ids=ids).logits.float()
        plain = case.hf_model(input_ids=ids).logits.float()
        got = mcore_forward(lora.mcore_model, ids)[..., :vocab].float()
    result = compare_logits(expected, got, "fp32")
    if not result["ok"]:
        _fail("lora", f"logits with the adapter: max |delta| = {result['max_abs_delta']:.3g} > "
                      f"{result['tolerance']:.3g} against PEFT's")
    if (plain - expected).abs().max().item() <= 100 * result["tolerance"]:
        _fail("lora", "the random adapter barely moves the logits: the check would not see a misplaced row")
    return result["max_abs_delta"]
