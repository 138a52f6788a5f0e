"""pai_zoo.mcore.arena: parameters moved into one arena keep their values, objects and storages."""
import io

import torch

from pai_zoo.families.registry import get_registry
from pai_zoo.mcore.arena import pack_parameters
from pai_zoo_conformance import checks

LLAMA = get_registry().family("llama")


def _saved_bytes(obj) -> int:
    buffer = io.BytesIO()
    torch.save(obj, buffer)
    return len(buffer.getvalue())


def test_packing_keeps_values_objects_and_separate_storages():
    model = checks.build_case(LLAMA).mcore_model
    before = {name: p.detach().clone() for name, p in model.named_parameters()}
    objects = {name: p for name, p in model.named_parameters()}
    state_bytes = _saved_bytes(model.state_dict())
    moved = pack_parameters(model)
    assert moved >= sum(p.numel() * p.element_size() for p in before.values())
    for name, param in model.named_parameters():
        assert param is objects[name] and param.requires_grad
        assert torch.equal(param, before[name]), name
        assert param.untyped_storage().nbytes() == param.numel() * param.element_size(), name
    pointers = sorted(p.data_ptr() for p in model.parameters())
    assert len(set(pointers)) == len(pointers)
    assert pointers[-1] - pointers[0] < moved  # all inside one map
    # ordinary tensors to torch.save: the state dict is not the whole arena once per tensor
    assert _saved_bytes(model.state_dict()) <= state_bytes * 1.01
    assert pack_parameters(model) == 0  # once per model


def test_tied_or_viewed_parameters_stay_where_they_are():
    model = torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Linear(8, 4))
    flat = torch.zeros(100)
    model[1].weight.data = flat[:32].view(4, 8)  # a view of a larger storage
    kept = model[1].weight.data_ptr()
    pack_parameters(model)
    assert model[1].weight.data_ptr() == kept
    assert model[0].weight.untyped_storage().nbytes() == 32 * 4


def test_a_packed_model_trains():
    case = checks.build_case(LLAMA)
    model = case.mcore_model.train()
    pack_parameters(model)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    ids = torch.randint(0, 100, (2, 8))
    mask = torch.triu(torch.ones(8, 8, dtype=torch.bool), 1)[None, None]
    weight = model.decoder.layers[0].mlp.linear_fc1.weight
    start = weight.detach().clone()
    model(ids, torch.arange(8).expand(2, 8), mask).float().pow(2).mean().backward()
    optimizer.step()
    assert not torch.equal(weight, start) and torch.isfinite(weight).all()
