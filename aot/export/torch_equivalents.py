"""Torch-only stand-ins for the few third-party leaves that have one.

A saved artifact may not import transformers, so a ``call_module`` target of a
transformers class must be replaced by a ``torch.nn`` module computing the same
function, with its weights rewritten to match:

- ``Conv1D(nf, nx)`` computes ``x @ W + b`` with ``W`` of shape ``(nx, nf)``;
  ``torch.nn.Linear(nx, nf)`` computes ``x @ W'.T + b``, so ``W' = W.T``.
- a module of ``torch.nn.utils.parametrize`` (``weight_norm``) is its plain class holding the
  weight the parametrization computes;
- ``GELUActivation`` is ``gelu(x)`` (the erf form, in C or in Python),
  ``GELUTanh`` / ``NewGELUActivation`` the tanh form
  ``0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))``,
  ``SiLUActivation`` is ``x sigmoid(x)``, ``LinearActivation`` the identity.

A ``call_function`` of a ``ModelOutput`` class becomes ``dict``: both map the
output names to tensors and :func:`aot.tracing.outputs.flatten_outputs` names them alike.

Classes are matched by qualified name, so this module never imports transformers.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch


@dataclass(frozen=True)
class LeafReplacement:
    """Source text that builds the stand-in, and its tensors by local name (already rewritten)."""

    constructor: str
    tensors: dict[str, torch.Tensor] = field(default_factory=dict)


def _qualified_name(obj) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"


def _conv1d(module) -> LeafReplacement:
    return LeafReplacement(
        constructor=f"torch.nn.Linear(in_features={module.nx}, out_features={module.nf}, bias=True)",
        tensors={"weight": module.weight.detach().t().contiguous(), "bias": module.bias.detach()},
    )


def _gelu(module) -> LeafReplacement:
    return LeafReplacement("torch.nn.GELU()")


def _gelu_tanh(module) -> LeafReplacement:
    return LeafReplacement("torch.nn.GELU(approximate='tanh')")


def _silu(module) -> LeafReplacement:
    return LeafReplacement("torch.nn.SiLU()")


def _identity(module) -> LeafReplacement:
    return LeafReplacement("torch.nn.Identity()")


_MODULE_REPLACEMENTS = {
    "transformers.pytorch_utils.Conv1D": _conv1d,
    "transformers.activations.GELUActivation": _gelu,
    "transformers.activations.GELUTanh": _gelu_tanh,
    "transformers.activations.NewGELUActivation": _gelu_tanh,
    "transformers.activations.SiLUActivation": _silu,
    "transformers.activations.LinearActivation": _identity,
}

_MODEL_OUTPUT = "transformers.utils.generic.ModelOutput"


def leaf_replacement(module: torch.nn.Module) -> LeafReplacement | None:
    """The torch-only stand-in for a third-party leaf module, or ``None`` when it has none."""
    build = _MODULE_REPLACEMENTS.get(_qualified_name(type(module)))
    if build:
        return build(module)
    return _unparametrized(module) or _rms_norm(module)


def _unparametrized(module: torch.nn.Module) -> LeafReplacement | None:
    """A parametrized torch module (wav2vec2's ``weight_norm`` positional conv) as its plain class, the weight computed.

    ``torch.nn.utils.parametrize`` makes a class of its own (``ParametrizedConv1d``) that holds
    ``parametrizations.weight.original0/1`` and computes ``weight`` from them on every call. An
    inference artifact needs only the result: a plain ``Conv1d`` holding the weight the
    parametrization computes.
    """
    from torch.nn.utils import parametrize

    from .leaf_constructor import NoConstructorForm, constructor_call

    if not parametrize.is_parametrized(module) or not type(module).__module__.startswith("torch."):
        return None
    # A new module of the class before parametrization: remove_parametrizations would edit the parametrized
    # class, which a copy shares with the model.
    original = parametrize.type_before_parametrizations(module)
    plain = original.__new__(original)
    plain.__dict__ = dict(module.__dict__)
    plain._modules = {name: child for name, child in module._modules.items() if name != "parametrizations"}
    plain._parameters = dict(module._parameters)
    plain._buffers = dict(module._buffers)
    with torch.no_grad():
        for name in module.parametrizations:
            plain._parameters[name] = torch.nn.Parameter(getattr(module, name).detach().clone(), requires_grad=False)
    try:
        constructor = constructor_call(plain)
    except NoConstructorForm:
        return None
    return LeafReplacement(constructor, {name: tensor.detach() for name, tensor in plain.state_dict().items()})


def _rms_norm(module: torch.nn.Module) -> LeafReplacement | None:
    """``torch.nn.RMSNorm`` for the many RMS norms of transformers (Llama, Mistral, T5, Gemma...), checked numerically.

    They all compute ``g ⊙ x / sqrt(mean(x²) + ε)``: most with ``g = w``, Gemma's with
    ``g = 1 + w`` (its weight starts at zero). Some also differ in where they cast, so a
    candidate, ``w`` or else ``1 + w`` as the RMSNorm's weight, is only used when it
    reproduces the module's output on random float32 input; the saved weight is that ``g``.
    """
    if type(module).__module__.startswith("torch."):
        return None  # torch's own classes are rebuilt by their constructor
    weight = getattr(module, "weight", None)
    eps = next((getattr(module, name) for name in ("variance_epsilon", "eps") if isinstance(getattr(module, name, None), float)), None)
    if not isinstance(weight, torch.nn.Parameter) or weight.dim() != 1 or eps is None:
        return None
    for gain in (weight.detach(), weight.detach() + 1):
        if _reproduces(module, torch.nn.RMSNorm(weight.shape[0], eps=eps, device=weight.device, dtype=weight.dtype), gain):
            return LeafReplacement(constructor=f"torch.nn.RMSNorm({weight.shape[0]}, eps={eps!r})", tensors={"weight": gain})
    return None


def _reproduces(module: torch.nn.Module, candidate: torch.nn.RMSNorm, gain: torch.Tensor) -> bool:
    with torch.no_grad():
        candidate.weight.copy_(gain)
        probe = torch.randn(2, 3, gain.shape[0], generator=torch.Generator().manual_seed(0)).to(gain.device, gain.dtype)
        try:
            return torch.allclose(candidate(probe), module(probe), rtol=1e-5, atol=1e-6)
        except Exception:  # a module that cannot even take the probe is no RMS norm
            return False


def function_replacement(target) -> str | None:
    """Source text of a torch-only stand-in for a third-party ``call_function`` target, or ``None``."""
    if isinstance(target, type) and any(_qualified_name(base) == _MODEL_OUTPUT for base in target.__mro__):
        return "dict"
    return None
