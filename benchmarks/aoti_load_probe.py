"""Which AOTInductor settings give a package that loads and runs on this machine, each loaded in a process of its own.

    python benchmarks/aoti_load_probe.py [--device cuda] [--model tiny|bert-base] [--variants a,b] [--json OUT]

Why: with the GPU image's torch 2.11.0+cu130, every BERT-base CUDA package aot built killed the process
that loaded it (SIGSEGV inside ``aoti_load_package``), so no CUDA recipe ships with ``export.aoti``. On an H200
(2026-11-27) this probe showed a tiny BERT crashing the same way under ``default``, ``weights_on_disk`` and
``same_process``, inside libstdc++'s regex compiler called from torch's ``parse_device_str`` (docs/gpu.md's
"AOTInductor" has the frames). This
probe takes aot out of the question: a plain transformers ``BertModel`` (random weights, seed 0, float16 on
CUDA), exported by ``torch.export`` with a dynamic batch and sequence as aot exports it, compiled by
``aoti_compile_and_package`` under each variant's Inductor settings, then loaded and run in a fresh
process. A child that dies prints its Python stack (``faulthandler``) and, where a C compiler is at hand,
its native frames (a small ``LD_PRELOAD`` handler built here: the GPU image has no gdb).

Variants (the first that loads and matches eager is the one to use):

- ``default``: as aot compiles it today;
- ``cuda_first``: the same package, the child initialising CUDA before it loads it;
- ``same_process``: loaded in the process that compiled it;
- ``weights_on_disk``: the weights beside the library (``package_constants_in_so=False``,
  ``package_constants_on_disk_format="pickle_weights"``), loaded through ``load_pt2(load_weights_from_disk=True)``;
- ``caching_allocator``: the weights in torch's CUDA caching allocator (``weight_use_caching_allocator``);
- ``embedded_kernels``: the kernels' binaries inside the library (``embed_kernel_binary``).

Each result: compile seconds, load seconds, the child's exit (signal or status), the largest difference
from eager on one input, and the last lines the child wrote.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import torch

VARIANTS = {
    "default": {},
    "cuda_first": {},
    "same_process": {},
    "weights_on_disk": {"aot_inductor.package_constants_in_so": False,
                        "aot_inductor.package_constants_on_disk_format": "pickle_weights"},
    "caching_allocator": {"aot_inductor.weight_use_caching_allocator": True},
    "embedded_kernels": {"aot_inductor.embed_kernel_binary": True},
}
SIZES = {"tiny": dict(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128),
         "bert-base": dict(hidden_size=768, num_hidden_layers=12, num_attention_heads=12, intermediate_size=3072)}

NATIVE_BACKTRACE_C = r"""
#include <execinfo.h>
#include <signal.h>
#include <string.h>
#include <unistd.h>
static void on_fault(int sig) {
  void *frames[64];
  static const char head[] = "native frames:\n";
  write(2, head, sizeof head - 1);
  backtrace_symbols_fd(frames, backtrace(frames, 64), 2);
  signal(sig, SIG_DFL);
  raise(sig);
}
__attribute__((constructor)) static void install(void) {
  signal(SIGSEGV, on_fault);
  signal(SIGBUS, on_fault);
  signal(SIGABRT, on_fault);
}
"""

# The child: torch and the standard library only, as a user who loads the package has.
CHILD = r"""
import faulthandler, json, sys, time
faulthandler.enable()
import torch
package, inputs_file, variant = sys.argv[1:4]
inputs, expected = torch.load(inputs_file)
if variant == "cuda_first":
    torch.zeros(1, device="cuda")
started = time.perf_counter()
if variant == "weights_on_disk":
    from torch.export.pt2_archive._package import load_pt2
    run = load_pt2(package, load_weights_from_disk=True).aoti_runners["model"]
else:
    run = torch._inductor.aoti_load_package(package)
loaded = time.perf_counter() - started
with torch.no_grad():
    got = run(**inputs)
got = got["last_hidden_state"] if isinstance(got, dict) else got[0]
print(json.dumps({"load_s": round(loaded, 2), "max_abs_diff": (got.float() - expected.float()).abs().max().item()}))
"""


class LastHiddenState(torch.nn.Module):
    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, attention_mask):
        return {"last_hidden_state": self.model(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state}


def _last_words(stderr: str) -> list[str]:
    """A dead child's account: the fault line, its innermost Python frames, and its innermost native frames.

    backtrace_symbols_fd writes the innermost frame first; the interpreter's own frames below the loader's are dropped.
    """
    lines = stderr.strip().splitlines()
    if "native frames:" not in lines:
        return lines[-40:]
    native = lines.index("native frames:")
    python = [line for line in lines[:native] if line.startswith(("Fatal Python error", "  File "))][:4]
    return python + lines[native + 1:native + 25]


def toolchain() -> dict[str, str]:
    """The C++ compiler Inductor builds the package's library with, and the C++ runtime this process has loaded.

    A library whose inline standard-library code (std::regex, in torch's own AOTI runtime header) was compiled
    against one libstdc++ and runs against another is the first suspect for a crash while the package loads.
    """
    from torch._inductor.cpp_builder import get_cpp_compiler

    compiler = get_cpp_compiler()
    version = subprocess.run([compiler, "--version"], capture_output=True, text=True).stdout.splitlines()[:1]
    maps = Path("/proc/self/maps").read_text().splitlines() if Path("/proc/self/maps").exists() else []
    loaded = sorted({line.split()[-1] for line in maps if "libstdc++" in line})
    return {"compiler": f"{compiler}: {version[0] if version else '?'}", "libstdcxx_loaded": ", ".join(loaded)}


def native_handler(workdir: Path) -> str | None:
    compiler = shutil.which("cc") or shutil.which("gcc")
    if compiler is None:
        return None
    source, library = workdir / "backtrace.c", workdir / "libbacktrace_on_fault.so"
    source.write_text(NATIVE_BACKTRACE_C)
    done = subprocess.run([compiler, "-shared", "-fPIC", "-O1", "-o", str(library), str(source)], capture_output=True, text=True)
    return str(library) if done.returncode == 0 else None


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--model", choices=sorted(SIZES), default="tiny")
    parser.add_argument("--variants", default=",".join(VARIANTS))
    parser.add_argument("--stop-at-first", action="store_true", help="stop at the first variant that loads and matches")
    parser.add_argument("--json", type=Path)
    args = parser.parse_args()

    import transformers

    workdir = Path(tempfile.mkdtemp(prefix="aoti-probe-"))
    preload = native_handler(workdir)
    dtype = torch.float16 if args.device == "cuda" else torch.float32
    torch.manual_seed(0)
    config = transformers.BertConfig(**SIZES[args.model], attn_implementation="sdpa")
    model = LastHiddenState(transformers.BertModel(config, add_pooling_layer=False).eval().to(args.device, dtype))
    example = {"input_ids": torch.randint(0, config.vocab_size, (2, 64), device=args.device),
               "attention_mask": torch.ones(2, 64, dtype=torch.int64, device=args.device)}
    probe = {"input_ids": torch.randint(0, config.vocab_size, (3, 100), device=args.device),
             "attention_mask": torch.ones(3, 100, dtype=torch.int64, device=args.device)}
    with torch.no_grad():
        expected = model(**probe)["last_hidden_state"]
    torch.save(({name: value.cpu() for name, value in probe.items()}, expected.cpu()), workdir / "inputs.pt")
    batch, sequence = torch.export.Dim.DYNAMIC, torch.export.Dim.DYNAMIC
    shapes = {"input_ids": {0: batch, 1: sequence}, "attention_mask": {0: batch, 1: sequence}}
    program = torch.export.export(model, (), kwargs=example, dynamic_shapes=shapes, strict=False)

    results = []
    environment = {"torch": torch.__version__, "device": torch.cuda.get_device_name() if args.device == "cuda" else "cpu",
                   "native_frames": preload is not None, "model": args.model, **toolchain()}
    print(json.dumps(environment), flush=True)
    for variant in args.variants.split(","):
        package = workdir / f"{variant}.pt2"
        started = time.perf_counter()
        try:
            torch._inductor.aoti_compile_and_package(program, package_path=str(package), inductor_configs=VARIANTS[variant])
        except Exception as error:  # noqa: BLE001 - a variant's failure is its result
            results.append({"variant": variant, "compile": f"{type(error).__name__}: {str(error).splitlines()[0][:300]}"})
            print(json.dumps(results[-1]), flush=True)
            continue
        result = {"variant": variant, "compile_s": round(time.perf_counter() - started, 1), "bytes": package.stat().st_size}
        if variant == "same_process":
            try:
                run = torch._inductor.aoti_load_package(str(package))
                with torch.no_grad():
                    got = run(**probe)["last_hidden_state"]
                result.update(exit=0, max_abs_diff=(got.float() - expected.float()).abs().max().item())
            except Exception as error:  # noqa: BLE001
                result.update(exit="exception", said=f"{type(error).__name__}: {str(error).splitlines()[0][:300]}")
        else:
            environ = {**os.environ, **({"LD_PRELOAD": preload} if preload else {})}
            done = subprocess.run([sys.executable, "-c", CHILD, str(package), str(workdir / "inputs.pt"), variant],
                                  capture_output=True, text=True, env=environ, timeout=300)
            result["exit"] = done.returncode
            lines = [line for line in done.stdout.splitlines() if line.startswith("{")]
            if done.returncode == 0 and lines:
                result.update(json.loads(lines[-1]))
            else:
                result["said"] = _last_words(done.stderr)
        results.append(result)
        print(json.dumps(result), flush=True)
        if args.stop_at_first and result.get("exit") == 0 and result.get("max_abs_diff", 1.0) < 0.05:
            break
    if args.json:
        args.json.write_text(json.dumps({"environment": environment, "results": results}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
