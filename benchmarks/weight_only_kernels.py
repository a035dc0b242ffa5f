"""The CPU kernels an int4 / int8 weight-only layer can run, on a stack of layers larger than the caches.

    python benchmarks/weight_only_kernels.py [--rows 1,8,16,128] [--pairs 16] [--threads 2] [--rounds 3]

A decode step is bound by reading the weights from memory, so one layer that stays in the caches
says little: the stack is ``--pairs`` pairs of 2048 -> 8192 -> 2048 layers (Llama-3.2-1B's MLP
shape; 16 pairs are 336 MB of int4 codes and scales). Each kernel runs in its own process, as
``aot bench`` runs its runners, once per round, the kernels in turn; reported is the median over
the rounds of each process's median milliseconds per call through the whole stack, for each number
of rows (tokens) in the call:

- ``int4_tiles``: ``torch._weight_int4pack_mm_for_cpu`` on bfloat16 activations (what ``module.py``
  runs for a decode step's few tokens);
- ``int_mm``: activations rounded to int8 per row, ``torch._int_mm`` on int8 codes (a prompt's
  tokens in ``module.py``);
- ``int8pack``: ``torch._weight_int8pack_mm`` on bfloat16 activations;
- ``bf16``: ``F.linear`` on bfloat16 weights (eager bfloat16);
- ``matmul_nbits_32`` / ``_64`` / ``_128``: ONNX Runtime's int4 ``MatMulNBits`` at ``accuracy_level``
  4, by block size (the ONNX model's); ``_fp32`` after the name (``matmul_nbits_128_fp32``): at
  ``accuracy_level`` 0 (float32 products, a layer with ``activations: float``);
- ``matmul_nbits8_256``: ``MatMulNBits`` with 8-bit codes in blocks of 256 at ``accuracy_level`` 4, the
  ONNX model's form of an int8 layer (one scale per output channel, repeated over the blocks);
- ``wo_int4`` / ``wo_int8``: ``module.py``'s own ``WeightOnlyLinear`` layers (int4 in asymmetric groups
  of 32, int8 per channel), each call the kernel the layer chooses for its rows on this CPU;
  ``wo_int4_gemm`` / ``wo_int8_gemm``: the same layers held to their int8 GEMMs at every row count
  (each row on two int8 grids; exact float32 sums where the CPU has no int8 dot products).

``stream`` is the memory's own speed, the ceiling every kernel's one-row GB/s is read against:
``torch.sum`` over 2 GiB of float32 (its row count ignored).

Codes and scales are random: the kernels' time does not depend on the values. Nothing else should
run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import time

from aot.directory.manifest import cpu_model

IN, OUT = 2048, 8192
TORCH_KERNELS = ("int4_tiles", "int_mm", "int8pack", "bf16", "wo_int4", "wo_int4_gemm", "wo_int8", "wo_int8_gemm")
ORT_KERNELS = ("matmul_nbits_32", "matmul_nbits_64", "matmul_nbits_128")
STREAM_BYTES = 2 << 30
BY_NAME_ONLY = ("stream", "matmul_nbits_32_fp32", "matmul_nbits_64_fp32", "matmul_nbits_128_fp32", "matmul_nbits8_256")


def _nbits_grid(kernel: str) -> tuple[int, int, int]:
    """A ``matmul_nbits`` kernel's name read as its (bits, block size, accuracy_level)."""
    name, accuracy_level = (kernel.removesuffix("_fp32"), 0) if kernel.endswith("_fp32") else (kernel, 4)
    return (8 if name.startswith("matmul_nbits8") else 4), int(name.rsplit("_", 1)[1]), accuracy_level


BYTES_PER_WEIGHT = {"int4_tiles": 0.5 + 4 / 32, "int_mm": 1, "int8pack": 1, "bf16": 2, "wo_int4": 0.5 + 4 / 32, "wo_int4_gemm": 1,
                    "wo_int8": 1, "wo_int8_gemm": 1}
for _kernel in (k for k in ORT_KERNELS + BY_NAME_ONLY if k.startswith("matmul_nbits")):  # codes, and a float32 scale a block
    _bits, _block, _ = _nbits_grid(_kernel)
    BYTES_PER_WEIGHT[_kernel] = _bits / 8 + 4 / _block


def _stream(threads: int):
    import torch

    torch.set_num_threads(threads)
    data = torch.ones(STREAM_BYTES // 4)
    return lambda rows: (lambda: data.sum())


def _shapes(pairs: int):
    return [(IN, OUT) if index % 2 == 0 else (OUT, IN) for index in range(2 * pairs)]


def _torch_stack(kernel: str, pairs: int, threads: int):
    import torch

    torch.set_num_threads(threads)
    torch.manual_seed(0)
    if kernel.endswith("_gemm"):
        from aot.runtime import weight_only_linear

        weight_only_linear._WO_INT4_KERNEL_ROWS = weight_only_linear._WO_BF16_KERNEL_ROWS = 0  # no call takes torch's kernels
    layers = []
    for inputs, outputs in _shapes(pairs):
        if kernel.startswith("wo_"):
            from aot.runtime import WeightOnlyLinear

            bits = 4 if kernel.startswith("wo_int4") else 8
            linear = torch.nn.Linear(inputs, outputs, bias=False)
            torch.nn.init.normal_(linear.weight, 0.0, 0.02)
            module = WeightOnlyLinear.from_linear(linear, bits, 32, symmetric=bits == 8)
            module.pack_now()
            layers.append((module, None))
        elif kernel == "int4_tiles":
            codes = torch.randint(0, 16, (outputs, inputs), dtype=torch.int32)
            scales_and_offsets = (torch.rand(inputs // 32, outputs, 2) * 1e-3).to(torch.bfloat16)
            layers.append((torch._convert_weight_to_int4pack_for_cpu(codes, 1), scales_and_offsets))
        elif kernel in ("int_mm", "int8pack"):
            scale = torch.rand(outputs) * 1e-3
            layers.append((torch.randint(-127, 128, (outputs, inputs), dtype=torch.int8),
                           scale.to(torch.bfloat16) if kernel == "int8pack" else scale))
        else:
            layers.append(((torch.randn(outputs, inputs) * 0.02).to(torch.bfloat16), None))

    def layer(x, weight, scale):
        if kernel.startswith("wo_"):
            return weight(x)
        if kernel == "int4_tiles":
            return torch._weight_int4pack_mm_for_cpu(x.to(torch.bfloat16), weight, 32, scale).float()
        if kernel == "int_mm":
            largest = x.abs().amax(dim=-1, keepdim=True).clamp_(min=1e-30)
            quantized = (x * (127 / largest)).round_().to(torch.int8)
            return (torch._int_mm(quantized, weight.t()) * (largest / 127)).mul_(scale)
        if kernel == "int8pack":
            return torch._weight_int8pack_mm(x.to(torch.bfloat16), weight, scale).float()
        return torch.nn.functional.linear(x.to(torch.bfloat16), weight).float()

    def run(x):
        with torch.no_grad():
            for weight, scale in layers:
                x = layer(x, weight, scale)
                x = x / (x.abs().amax() + 1)  # keeps values finite through random layers
        return x

    def caller(rows: int):
        x = torch.randn(rows, IN)
        return lambda: run(x)

    return caller


def _ort_stack(kernel: str, pairs: int, threads: int):
    import numpy as np
    import onnxruntime
    from onnx import TensorProto, helper, numpy_helper

    bits, block, accuracy_level = _nbits_grid(kernel)
    rng = np.random.default_rng(0)
    nodes, initializers, name = [], [], "x"
    for index, (inputs, outputs) in enumerate(_shapes(pairs)):
        codes = rng.integers(0, 256, (outputs, inputs // block, block * bits // 8), dtype=np.uint8)
        scales = rng.random(outputs * (inputs // block), dtype=np.float32) * 2e-3
        initializers += [numpy_helper.from_array(codes, f"codes{index}"), numpy_helper.from_array(scales, f"scales{index}")]
        nodes.append(helper.make_node("MatMulNBits", [name, f"codes{index}", f"scales{index}"], [f"y{index}"], domain="com.microsoft",
                                      K=inputs, N=outputs, bits=bits, block_size=block, accuracy_level=accuracy_level))
        name = f"y{index}"
    graph = helper.make_graph(nodes, "stack", [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["rows", IN])],
                              [helper.make_tensor_value_info(name, TensorProto.FLOAT, ["rows", IN])], initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18), helper.make_opsetid("com.microsoft", 1)])
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = threads
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    def caller(rows: int):
        x = rng.standard_normal((rows, IN), dtype=np.float32)
        return lambda: session.run(None, {"x": x})

    return caller


def _measure_one(kernel: str, rows_list: list[int], pairs: int, threads: int) -> dict[int, float]:
    """In this process: median ms per call of ``kernel``'s stack, per number of rows."""
    if kernel == "stream":
        make = _stream(threads)
    else:
        make = _ort_stack(kernel, pairs, threads) if kernel.startswith("matmul_nbits") else _torch_stack(kernel, pairs, threads)
    medians = {}
    for rows in rows_list:
        call = make(rows)
        for _ in range(3):
            call()
        times = []
        for _ in range(60 if rows == 1 else 15):
            start = time.perf_counter()
            call()
            times.append(time.perf_counter() - start)
        medians[rows] = statistics.median(times) * 1e3
    return medians


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--rows", default="1,8,16,128", help="comma list of rows (tokens) per call")
    parser.add_argument("--pairs", type=int, default=16)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--kernels", default=",".join(TORCH_KERNELS + ORT_KERNELS), help=f"comma list; also {', '.join(BY_NAME_ONLY)}")
    parser.add_argument("--rounds", type=int, default=3)
    parser.add_argument("--one", help=argparse.SUPPRESS)  # the child: one kernel, JSON on stdout
    args = parser.parse_args()
    rows_list = [int(rows) for rows in args.rows.split(",")]
    if args.one:
        print(json.dumps(_measure_one(args.one, rows_list, args.pairs, args.threads)))
        return
    megabytes = {kernel: 2 * args.pairs * IN * OUT * size / 1e6 for kernel, size in BYTES_PER_WEIGHT.items()}
    megabytes["stream"] = STREAM_BYTES / 1e6
    print(f"# {cpu_model()}, {args.threads} threads, "
          f"{2 * args.pairs} layers of {IN} x {OUT}; median over {args.rounds} rounds of ms per call through the stack "
          "(GB/s of weights at one row)")
    print("| kernel | weights MB | " + " | ".join(f"{rows} rows" for rows in rows_list) + " |")
    print("|---|---|" + "---|" * len(rows_list))
    kernels = args.kernels.split(",")
    per_round = {kernel: [] for kernel in kernels}
    for _ in range(args.rounds):
        for kernel in kernels:
            child = subprocess.run([sys.executable, __file__, "--one", kernel, "--rows", args.rows, "--pairs", str(args.pairs),
                                    "--threads", str(args.threads)], capture_output=True, text=True, check=True)
            per_round[kernel].append({int(rows): ms for rows, ms in json.loads(child.stdout).items()})
    for kernel in kernels:
        medians = {rows: statistics.median(measured[rows] for measured in per_round[kernel]) for rows in rows_list}
        cells = [f"{medians[rows]:.2f}" + (f" ({megabytes[kernel] / medians[rows]:.0f} GB/s)" if rows == 1 else "") for rows in rows_list]
        print(f"| {kernel} | {megabytes[kernel]:.0f} | " + " | ".join(cells) + " |", flush=True)


if __name__ == "__main__":
    main()
