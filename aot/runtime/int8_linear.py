"""Int8DynamicLinear: ``nn.Linear`` with int8 weights and dynamically quantised int8 activations.

Self-contained on purpose: it imports only torch and the standard library (no
``from __future__``), and its private names start with ``_int8``/``_INT8``, so an
artifact writer can paste this file's source into a torch-only ``module.py``.
Construct it with plain literals, e.g.::

    Int8DynamicLinear(768, 3072, bias=True, activations="per_token", engine="onednn")

State (what ``state_dict`` and a safetensors file hold; no pickle, no quantized tensors):

- ``weight``: int8, ``(out, in)``: ``q = clamp(round(W / s), -127, 127)``;
- ``weight_scale``: float32, ``(out,)``: ``s`` per output channel (one value repeated
  for per-tensor quantisation), so ``W ≈ q · s``;
- ``bias``: float32 ``(out,)``, kept in float.

Math, per call, with ``activations="per_tensor"``: the activation ``x`` is quantised
as one tensor to uint8, with an asymmetric range that always holds zero (ONNX
``DynamicQuantizeLinear``)::

    a = (max(x, 0) - min(x, 0)) / 255        z = clamp(round(-min(x, 0) / a), 0, 255)
    x_q = clamp(round(x / a) + z, 0, 255)
    y = a · ((x_q - z) @ q^T) · s + b         (the product summed in int32)

With ``activations="per_token"`` each row ``r`` (a token) gets its own symmetric int8
scale, so one token's outliers do not coarsen every other token's grid::

    a_r = max_k |x_rk| / 127                 x_q = clamp(round(x / a_r), -127, 127)
    y_r = a_r · (x_q @ q^T)_r · s + b

Either way ``y`` differs from ``x W^T + b`` by the rounding of ``x`` (at most half a
step ``a`` an element) and of ``W`` (at most ``s/2``).

On CPU, with float32 inputs and no gradient needed, ``per_tensor`` runs torch's own
int8 GEMM with the activation quantised inside it, ``torch.ops.quantized.linear_dynamic``,
on a weight prepacked once for the chosen ``engine`` (``"onednn"`` or ``"fbgemm"``;
measured on an AMD EPYC with AVX-512 VNNI, oneDNN's was the faster at 128 and 1024
rows), on CPUs whose uint8 x int8 sums are exact (VNNI on x86: see
``_int8_vnni``; without it the formula runs, at float speed); ``per_token`` quantises the rows with a few float ops
and multiplies with ``torch._int_mm`` (int8 x int8 -> int32), or where that is slow (x86 without VNNI) with float32
GEMMs whose int32 sums are the same, exactly (``_int8_sums``). Everywhere else, and whenever
``torch.compile``/``torch.export`` trace it, it computes the formula with float ops,
which agrees with the kernels up to float rounding.

The prepacked weight is derived state, never saved: it is dropped by copies,
pickling and a ``.to()`` that moves or converts its tensors, and rebuilt when
``weight`` or ``weight_scale`` changes (``load_state_dict`` included). torch marks
quantized tensors as deprecated; they exist here only inside the prepack call, and
if a future torch drops the int8 ops the float formula is what runs.
"""

import functools
import platform
import threading
import warnings
import weakref

import torch
import torch.nn.functional as F

_INT8_ENGINES = ("onednn", "fbgemm")
_INT8_ACTIVATIONS = ("per_tensor", "per_token")
_INT8_QMAX = 127
_INT8_TINY = 1e-30
_INT8_EXACT_DEPTH = 1040  # 1040 · 127² < 2^24: float32 sums that many int8 products exactly (see _int8_sums)
_INT8_FLOAT_GEMM_ROWS = 4  # fewer rows than this run torch._int_mm even without int8 dot products (_int8_sums)
# Prepacking reads torch's process-wide quantized engine: switch, pack, restore under one lock, so
# that threads packing layers at once neither pack for each other's engine nor leave theirs behind.
_INT8_ENGINE_LOCK = threading.Lock()


def _int8_kernel_available(engine: str) -> bool:
    quantized = torch.backends.quantized
    return engine in quantized.supported_engines and hasattr(torch.ops.quantized, "linear_dynamic") and _int8_vnni()


@functools.cache  # the CPU does not change under a process
def _int8_vnni() -> bool:
    """Whether this CPU multiplies int8 by dot products that sum into int32: x86's VNNI (``VPDPBUSD``) or AMX.

    Without them (x86 with AVX2 only, or AVX-512 without VNNI) two int8 kernels fail the formula:

    - fbgemm and oneDNN multiply uint8 by int8 (the ``per_tensor`` kernel) with ``VPMADDUBSW``, which adds each
      pair of neighbouring products into a saturating int16: two products of 255 · 127 overflow it (seen on an
      AMD EPYC with AVX2 only: outputs off by up to 0.58 on a 16-wide layer);
    - ``torch._int_mm`` stays exact but runs a loop without them, its time growing with the rows: on that EPYC,
      2 threads, 128 x 384 by 384 x 1536 took 36.9 ms against 1.3 ms for float32 ``F.linear`` (see ``_int8_sums``).

    Elsewhere (ARM's dot products) nothing saturates, and ``_int_mm`` is taken as it comes.
    """
    if platform.machine().lower() not in ("x86_64", "amd64", "i386", "i686", "x86"):
        return True
    capabilities = torch.cpu.get_capabilities()
    return bool(capabilities.get("avx512_vnni") or capabilities.get("amx_int8"))


def _int8_sums(quantized: torch.Tensor, weight: torch.Tensor) -> torch.Tensor:
    """``quantized @ weight^T`` for int8 ``(rows, in)`` and ``(out, in)``, summed exactly, as int32 ``(rows, out)``.

    ``torch._int_mm`` where the CPU has int8 dot products (``_int8_vnni``) or for a few rows. Without them,
    float32 GEMMs over blocks of ``_INT8_EXACT_DEPTH`` inputs: each product of two int8 codes is at most
    127² = 16,129 in magnitude, so every partial sum of a block stays below 2^24, where float32 holds integers
    exactly, whatever order the GEMM adds in; the blocks' sums are added in int32. The result is ``_int_mm``'s,
    bit for bit. Measured on a 2-core AMD EPYC with AVX2 only, 2 threads: 128 x 384 by 384 x 1536, 1.56 ms against
    ``_int_mm``'s 36.9; 512 x 768 by 768 x 3072, 22.9 against 572 ms; for 1 and 2 rows of 2048 x 8192 ``_int_mm`` is
    as fast or faster (9.7 and 16.4 ms against 38 and 17.5: the float copy of the codes costs more than the loop).
    """
    if _int8_vnni() or quantized.shape[0] < _INT8_FLOAT_GEMM_ROWS:
        return torch._int_mm(quantized, weight.t())
    sums = None
    for start in range(0, weight.shape[1], _INT8_EXACT_DEPTH):
        block = slice(start, start + _INT8_EXACT_DEPTH)
        part = torch.mm(quantized[:, block].float(), weight[:, block].float().t()).to(torch.int32)
        sums = part if sums is None else sums.add_(part)
    return sums


def _int8_row_maxima(input: torch.Tensor) -> torch.Tensor:
    """``max_k |x_rk|`` per row, shape ``(..., 1)``, at least a tiny positive number (an all-zero row stays zero)."""
    return input.abs().amax(dim=-1, keepdim=True).clamp_(min=_INT8_TINY)


def _int8_per_token_activation(input: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to each row's symmetric int8 grid, step ``a_r = max_k |x_rk| / 127``.

    Computed as ``round(x · (127 / max))``, exactly as the kernel and the ONNX model compute it, so
    that a value on a rounding tie goes the same way in all three.
    """
    largest = _int8_row_maxima(input)
    return torch.round(input * (_INT8_QMAX / largest)) * (largest / _INT8_QMAX)


def _int8_fake_quantized_activation(input: torch.Tensor) -> torch.Tensor:
    """``x`` rounded to its per-tensor uint8 grid, as the int8 kernel (and ONNX DynamicQuantizeLinear) see it."""
    low = input.amin().clamp(max=0)
    high = input.amax().clamp(min=0)
    step = (high - low) / 255
    step = torch.where(step > 0, step, torch.ones_like(step))  # an all-zero input: any step gives zeros
    zero_point = torch.clamp(torch.round(-low / step), 0, 255)
    quantized = torch.clamp(torch.round(input / step) + zero_point, 0, 255)
    return (quantized - zero_point) * step


def int8_quantize_weight(weight: torch.Tensor, per_channel: bool = True):
    """``(q, s)``: symmetric int8 weights and their float32 scales, per output channel or per tensor."""
    magnitude = weight.detach().float().abs()
    largest = magnitude.amax(dim=1) if per_channel else magnitude.amax().expand(weight.shape[0])
    scale = torch.where(largest > 0, largest / _INT8_QMAX, torch.ones_like(largest)).contiguous()
    quantized = torch.clamp(torch.round(weight.detach().float() / scale[:, None]), -_INT8_QMAX, _INT8_QMAX)
    return quantized.to(torch.int8), scale


class Int8DynamicLinear(torch.nn.Module):
    """``x W^T + b`` with int8 weights and int8 activations quantised per call; see the module doc."""

    def __init__(
        self, in_features: int, out_features: int, bias: bool = True, activations: str = "per_tensor", engine: str = "onednn",
        device=None, dtype=None,
    ) -> None:
        super().__init__()
        if engine not in _INT8_ENGINES:
            raise ValueError(f"Int8DynamicLinear: engine must be one of {list(_INT8_ENGINES)}, got {engine!r}")
        if activations not in _INT8_ACTIVATIONS:
            raise ValueError(f"Int8DynamicLinear: activations must be one of {list(_INT8_ACTIVATIONS)}, got {activations!r}")
        self.in_features = int(in_features)
        self.out_features = int(out_features)
        self.activations = activations
        self.engine = engine
        self.register_buffer("weight", torch.zeros((self.out_features, self.in_features), dtype=torch.int8, device=device))
        self.register_buffer("weight_scale", torch.ones(self.out_features, dtype=torch.float32, device=device))
        if bias:
            self.bias = torch.nn.Parameter(torch.zeros(self.out_features, dtype=torch.float32, device=device), requires_grad=False)
        else:
            self.bias = None
        self._packed = None  # (weakrefs and versions of weight, weight_scale and bias, packed params)
        self.register_load_state_dict_post_hook(Int8DynamicLinear._repack_after_load)

    @classmethod
    def from_linear(
        cls, linear: torch.nn.Linear, per_channel: bool = True, activations: str = "per_tensor", engine: str = "onednn"
    ) -> "Int8DynamicLinear":
        """The int8 form of a float ``nn.Linear``: its weight quantised, its bias kept."""
        module = cls(linear.in_features, linear.out_features, bias=linear.bias is not None, activations=activations,
                     engine=engine, device="meta")
        quantized, scale = int8_quantize_weight(linear.weight, per_channel)
        module.weight = quantized
        module.weight_scale = scale
        if linear.bias is not None:
            module.bias = torch.nn.Parameter(linear.bias.detach().float().clone(), requires_grad=False)
        return module

    def dequantized_weight(self) -> torch.Tensor:
        """``q · s``: the float weight the int8 weight stands for."""
        return self.weight.float() * self.weight_scale[:, None]

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        per_token = self.activations == "per_token"
        if isinstance(input, torch.Tensor) and input.numel() == 0:  # no values, no range to quantise to
            return F.linear(input, self.dequantized_weight().to(input.dtype), self._bias_for(input))
        if self._use_kernel(input):
            return self._per_token_kernel(input) if per_token else self._per_tensor_kernel(input)
        rounded = _int8_per_token_activation(input) if per_token else _int8_fake_quantized_activation(input)
        return F.linear(rounded, self.dequantized_weight().to(input.dtype), self._bias_for(input))

    def _per_tensor_kernel(self, input: torch.Tensor) -> torch.Tensor:
        rows = input.reshape(-1, self.in_features)  # the kernel takes 2 or more dimensions
        output = torch.ops.quantized.linear_dynamic(rows, self.packed_params(), False)
        return output.reshape(*input.shape[:-1], self.out_features)

    def _per_token_kernel(self, input: torch.Tensor) -> torch.Tensor:
        # Five passes over the activations and two over the output, the fewest measured (a fused
        # quantize_per_channel or a single-pass inf-norm were slower); the GEMM is torch._int_mm's (_int8_sums).
        rows = input.reshape(-1, self.in_features)
        largest = _int8_row_maxima(rows)
        quantized = (rows * (_INT8_QMAX / largest)).round_().to(torch.int8)  # |x| <= largest: within [-127, 127]
        output = _int8_sums(quantized, self.weight) * (largest / _INT8_QMAX)
        if self.bias is None:
            output.mul_(self.weight_scale)
        else:
            torch.addcmul(self.bias, output, self.weight_scale, out=output)
        return output.reshape(*input.shape[:-1], self.out_features)

    def _bias_for(self, input: torch.Tensor):
        return None if self.bias is None else self.bias.to(input.dtype)

    # -- the prepacked weight -----------------------------------------------------------------

    def packed_params(self):
        """The weight prepacked for ``engine``, rebuilt if weight, scale or bias changed since the last pack."""
        sources = self._packed_sources()
        cached = self._packed
        if cached is not None and _int8_same_tensors(cached[0], sources):
            return cached[1]
        with _INT8_ENGINE_LOCK:
            quantized_engine = torch.backends.quantized.engine
            try:
                torch.backends.quantized.engine = self.engine  # prepacking picks the kernel family by the global engine
                with warnings.catch_warnings(), torch.no_grad():
                    warnings.simplefilter("ignore")  # quantized tensors are deprecated; this is their one use, see module doc
                    per_channel = torch._make_per_channel_quantized_tensor(
                        self.weight, self.weight_scale.double(), torch.zeros(self.out_features, dtype=torch.long), 0
                    )
                    bias = None if self.bias is None else self.bias.detach()
                    packed = torch.ops.quantized.linear_prepack(per_channel, bias)
            finally:
                torch.backends.quantized.engine = quantized_engine
        self._packed = ([(weakref.ref(tensor), tensor.data_ptr(), _int8_version(tensor)) for tensor in sources], packed)
        return packed

    def _packed_sources(self):
        return [tensor for tensor in (self.weight, self.weight_scale, self.bias) if tensor is not None]

    def _use_kernel(self, input: torch.Tensor) -> bool:
        if not isinstance(input, torch.Tensor) or input.device.type != "cpu" or input.dtype != torch.float32:
            return False  # also a torch.fx Proxy: tracing sees the float formula
        if torch.compiler.is_compiling():
            return False  # torch.export / torch.compile see the float formula
        if input.dim() == 0 or input.shape[-1] != self.in_features:
            return False
        if torch.is_grad_enabled() and input.requires_grad:
            return False  # the int8 kernel has no backward
        if self.weight.device.type != "cpu":
            return False
        if self.activations == "per_token":
            return hasattr(torch, "_int_mm")
        return _int8_kernel_available(self.engine)

    def _repack_after_load(self, incompatible_keys) -> None:
        self._packed = None

    # -- derived state stays out of copies, pickles and moves -------------------------------------

    def _apply(self, fn, recurse=True):
        module = super()._apply(fn, recurse)
        if self._packed is not None and not _int8_same_tensors(self._packed[0], self._packed_sources()):
            self._packed = None  # moved or converted: the packed copy is of tensors this module no longer holds
        return module

    def __getstate__(self):
        state = self.__dict__.copy()
        state["_packed"] = None  # packed params are an opaque script object
        return state

    def extra_repr(self) -> str:
        return (
            f"in_features={self.in_features}, out_features={self.out_features}, bias={self.bias is not None}, "
            f"activations={self.activations!r}, engine={self.engine!r}"
        )


def _int8_same_tensors(seen, tensors) -> bool:
    """Whether ``tensors`` are the very tensors of ``seen``, on the same storage, unchanged since."""
    return len(seen) == len(tensors) and all(
        ref() is tensor and pointer == tensor.data_ptr() and version == _int8_version(tensor)
        for (ref, pointer, version), tensor in zip(seen, tensors)
    )


def _int8_version(tensor: torch.Tensor):
    """The in-place version counter; None for inference tensors, which have none."""
    try:
        return tensor._version
    except RuntimeError:
        return None

