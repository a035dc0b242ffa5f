"""The passes must leave the eager model as it was: the build takes its reference outputs after them."""

from __future__ import annotations

import pytest
import torch
from torch import nn

from aot.errors import PassError
from aot.recipe.schema import PassSpec
from aot.gates.eager_guard import changed_tensor, check_after_each_pass, fingerprint

SPECS = [PassSpec(name="merge_linears"), PassSpec(name="remove_dropout")]


def _model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(4, 4), nn.LayerNorm(4), nn.BatchNorm1d(4))


def test_an_untouched_model_passes():
    model = _model().eval()
    check = check_after_each_pass(model, SPECS)
    model(torch.randn(3, 4))  # a forward in eval mode writes nothing
    check(0, torch.fx.symbolic_trace(model))


def test_a_write_into_a_weight_names_the_pass_and_the_tensor():
    model = _model()
    check = check_after_each_pass(model, SPECS)
    check(0, torch.fx.symbolic_trace(model))
    with torch.no_grad():
        model[0].weight.mul_(2)
    with pytest.raises(PassError, match=r"pass 'remove_dropout' \(step 2\) changed the eager model's '0.weight' in place"):
        check(1, torch.fx.symbolic_trace(model))


def test_a_replaced_parameter_is_a_change_too():
    model = _model()
    before = fingerprint(model)
    model[1].bias = nn.Parameter(model[1].bias.detach().clone())
    assert changed_tensor(model, before) == "1.bias"


def test_data_assignment_is_a_change():
    model = _model()
    before = fingerprint(model)
    model[0].weight.data = model[0].weight.data * 1.0
    assert changed_tensor(model, before) == "0.weight"


def test_a_buffer_updated_in_training_mode_is_a_change():
    model = _model().train()
    before = fingerprint(model)
    model(torch.randn(3, 4))
    assert changed_tensor(model, before) in {"2.num_batches_tracked", "2.running_mean", "2.running_var"}


def test_the_fingerprint_leaves_copy_on_write_weights_shared():
    # The traced graph's weights are lazy clones of the eager model's: reading a mutable address
    # (data_ptr) would copy every one of them.
    model = _model()
    clones = [torch._lazy_clone(p) for p in model.parameters()]
    assert all(torch._C._is_cow_tensor(p) for p in model.parameters())
    fingerprint(model)
    assert all(torch._C._is_cow_tensor(p) for p in model.parameters())
    assert len(clones) == 6
