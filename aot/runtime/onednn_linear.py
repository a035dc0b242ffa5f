"""OneDNNLinear: ``nn.Linear`` (+ an optional fused activation) on a pre-packed oneDNN weight.

Self-contained on purpose: it imports only torch and the standard library (no
``from __future__``), and its private names start with ``_onednn``/``_ONEDNN``,
so an artifact writer can paste this file's source into a torch-only ``module.py``.
Construct it with plain literals, e.g.::

    OneDNNLinear(768, 3072, bias=True, activation="gelu", batch_size_hint=128)

- ``in_features``, ``out_features``, ``bias``: as for ``torch.nn.Linear``; the
  module holds ordinary ``weight`` (out, in) and ``bias`` (out) Parameters, so
  its ``state_dict`` (and a safetensors file) holds plain dense tensors.
- ``activation``: ``"none"``, ``"relu"``, ``"gelu"`` (exact, erf) or
  ``"gelu_tanh"`` (tanh approximation), applied to the linear's output.
- ``batch_size_hint``: the number of rows (batch x sequence) the packed layout
  is tuned for; any number of rows gives the same result.

Math: ``y = act(x W^T + b)``, the same as ``act(F.linear(x, W, b))`` up to
float rounding (the GEMM kernel sums in a different order; about 1e-6 relative
in float32).

On CPU, with float32 or bfloat16 inputs matching the weight's dtype and no
gradient needed, it calls ``torch.ops.mkldnn._linear_pointwise`` on a copy of
``weight`` reordered once into oneDNN's blocked layout
(``torch.ops.mkldnn._reorder_linear_weight``); oneDNN's GEMM is markedly faster
than MKL's behind ``F.linear`` on AVX-512 CPUs. Everywhere else it falls back to
``F.linear`` followed by the activation, which is also what ``torch.fx``,
``torch.export`` (hence ONNX export) and ``torch.compile`` see when they trace it.

A CPU without bfloat16 arithmetic (x86 without AVX512-BF16 or AMX: oneDNN has no
bfloat16 kernel there) would leave a bfloat16 layer to ``F.linear``'s bfloat16
GEMM, a loop that sums in float32: on a 2-core AMD EPYC with AVX2 only, 512 x 768
by 768 x 3072 took 169 ms against 26 ms in float32. There the layer computes the
same sums with float32's GEMM instead: the bfloat16 values upcast (exactly), the
product of two bfloat16 numbers exact in float32, the sum rounded to bfloat16
once, then the activation, as ``F.linear`` + act compute it up to the order of
the additions. The float32 weight is a transient of one layer per call, so the
module keeps its bfloat16 memory.

The packed copy is derived state, never saved: it is not in ``state_dict``,
is dropped by ``copy.deepcopy``/pickling and by a ``.to()`` that moves or
converts ``weight`` (one that leaves it as it is keeps it), and is rebuilt
whenever ``weight`` is a different tensor, has new storage, or was changed in
place (its version counter moved), e.g. by ``load_state_dict``. (An inference
tensor has no version counter: an in-place edit of one made inside
``torch.inference_mode`` is the one change it cannot see.)
"""

import math
import weakref

import torch
import torch.nn.functional as F

# activation -> (oneDNN post-op, its algorithm argument)
_ONEDNN_POST_OPS = {
    "none": ("none", ""),
    "relu": ("relu", ""),
    "gelu": ("gelu", "none"),
    "gelu_tanh": ("gelu", "tanh"),
}


def _onednn_available() -> bool:
    backend = torch.backends.mkldnn
    return bool(backend.is_available() and backend.enabled and hasattr(torch.ops.mkldnn, "_linear_pointwise"))


def _onednn_bfloat16_kernels() -> bool:
    """Whether this CPU runs oneDNN's bfloat16 kernels (x86: AVX-512 or AMX; not AVX2 alone)."""
    check = getattr(torch.ops.mkldnn, "_is_mkldnn_bf16_supported", None)
    return bool(check is not None and check())


def _onednn_activate(output: torch.Tensor, activation: str) -> torch.Tensor:
    if activation == "relu":
        return F.relu(output)
    if activation == "gelu":
        return F.gelu(output)
    if activation == "gelu_tanh":
        return F.gelu(output, approximate="tanh")
    return output


class OneDNNLinear(torch.nn.Module):
    """``act(x W^T + b)`` on a pre-packed oneDNN weight on CPU; ``F.linear`` + ``act`` elsewhere."""

    def __init__(
        self,
        in_features: int,
        out_features: int,
        bias: bool = True,
        activation: str = "none",
        batch_size_hint: int = 128,
        device=None,
        dtype=None,
    ) -> None:
        super().__init__()
        if activation not in _ONEDNN_POST_OPS:
            raise ValueError(f"OneDNNLinear: activation must be one of {sorted(_ONEDNN_POST_OPS)}, got {activation!r}")
        if int(batch_size_hint) < 1:
            raise ValueError(f"OneDNNLinear: batch_size_hint must be >= 1, got {batch_size_hint!r}")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.activation = activation
        self.batch_size_hint = int(batch_size_hint)
        factory = {"device": device, "dtype": dtype}
        self.weight = torch.nn.Parameter(torch.empty((self.out_features, self.in_features), **factory))
        self.bias = torch.nn.Parameter(torch.empty(self.out_features, **factory)) if bias else None
        self._packed = None  # (weakref to weight, data_ptr, version, packed tensor)
        self.reset_parameters()
        self.register_load_state_dict_post_hook(OneDNNLinear._repack_after_load)

    @classmethod
    def from_linear(cls, linear: torch.nn.Linear, activation: str = "none", batch_size_hint: int = 128) -> "OneDNNLinear":
        """A OneDNNLinear computing ``act(linear(x))`` that shares ``linear``'s Parameters (nothing is copied)."""
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, activation=activation,
                     batch_size_hint=batch_size_hint, device="meta")
        module.weight = linear.weight
        module.bias = linear.bias
        return module

    def reset_parameters(self) -> None:
        """The same initialisation as ``torch.nn.Linear``."""
        if self.weight.is_meta:
            return
        torch.nn.init.kaiming_uniform_(self.weight, a=math.sqrt(5))
        if self.bias is not None:
            fan_in = self.in_features
            bound = 1 / math.sqrt(fan_in) if fan_in > 0 else 0
            torch.nn.init.uniform_(self.bias, -bound, bound)

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        if self._kernel_may_run(input):
            if self._packable():
                post_op, algorithm = _ONEDNN_POST_OPS[self.activation]
                return torch.ops.mkldnn._linear_pointwise(input, self.packed_weight(), self.bias, post_op, [], algorithm)
            if self._bfloat16_without_onednn():
                bias = None if self.bias is None else self.bias.float()
                output = F.linear(input.float(), self.weight.float(), bias).to(torch.bfloat16)
                return _onednn_activate(output, self.activation)
        return _onednn_activate(F.linear(input, self.weight, self.bias), self.activation)

    # -- the packed weight ------------------------------------------------------------------

    def packed_weight(self) -> torch.Tensor:
        """``weight`` reordered for oneDNN, rebuilt if ``weight`` was replaced or changed since the last pack."""
        if self._pack_is_current():
            return self._packed[3]
        weight = self.weight
        with torch.no_grad():
            packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), self.batch_size_hint)
        self._packed = (weakref.ref(weight), weight.data_ptr(), _onednn_version(weight), packed)
        return packed

    def _pack_is_current(self) -> bool:
        """Whether the packed copy is of ``weight`` as it is now: the same tensor, storage and version."""
        cached, weight = self._packed, self.weight
        return (cached is not None and cached[0]() is weight and cached[1] == weight.data_ptr()
                and cached[2] == _onednn_version(weight))

    def _bfloat16_without_onednn(self) -> bool:
        """A bfloat16 layer on a CPU where oneDNN has no bfloat16 kernel: float32's GEMM computes it (module doc)."""
        return self.weight.dtype == torch.bfloat16 and self._on_cpu_with_its_bias() and not _onednn_bfloat16_kernels()

    def _kernel_may_run(self, input: torch.Tensor) -> bool:
        """Whether a kernel other than ``F.linear`` may compute this call: a CPU tensor of the weight's dtype, not
        traced, no gradient wanted (what the weight allows is ``_packable``'s and ``_bfloat16_without_onednn``'s)."""
        weight, bias = self.weight, self.bias
        if not isinstance(input, torch.Tensor) or input.device.type != "cpu":
            return False  # also a torch.fx Proxy: tracing sees F.linear + activation
        if torch.compiler.is_compiling():
            return False  # torch.export / torch.compile see plain aten.linear + activation
        if input.dtype != weight.dtype or input.dim() == 0 or input.shape[-1] != self.in_features:
            return False
        if torch.is_grad_enabled() and (input.requires_grad or weight.requires_grad or (bias is not None and bias.requires_grad)):
            return False  # the oneDNN op has no backward
        return True

    def _on_cpu_with_its_bias(self) -> bool:
        weight, bias = self.weight, self.bias
        return weight.device.type == "cpu" and (bias is None or bias.dtype == weight.dtype)

    def _packable(self) -> bool:
        weight = self.weight
        if not self._on_cpu_with_its_bias():
            return False
        if weight.dtype == torch.bfloat16:
            return _onednn_available() and _onednn_bfloat16_kernels()
        return weight.dtype == torch.float32 and _onednn_available()

    def pack_now(self) -> bool:
        """Pack ``weight`` now rather than at the first call; whether the oneDNN path can use it here."""
        self._packed = None
        if not self._packable():
            return False
        self.packed_weight()
        return True

    def _repack_after_load(self, incompatible_keys) -> None:
        self.pack_now()

    # -- derived state stays out of copies, pickles and moves -------------------------------

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        if not self._pack_is_current():
            self._packed = None  # moved or converted: the packed copy is of a weight this module no longer holds
        return module

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_packed"] = None  # an opaque oneDNN tensor can be neither copied nor pickled
        return state

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"activation={self.activation!r}, batch_size_hint={self.batch_size_hint}"
        )


def _onednn_version(tensor: torch.Tensor) -> int | None:
    """The in-place version counter; None for inference tensors, which have none.

    An inference tensor (created under ``torch.inference_mode``) cannot be changed
    in place outside inference mode; a change made inside it is the one edit the
    pack cannot see. Replacing the tensor or its storage is still seen.
    """
    try:
        return tensor._version
    except RuntimeError:
        return None
