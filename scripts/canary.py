"""The canary: aot against the newest releases of what it stands on, or against its window's lowest.

    python3 scripts/canary.py [--lowest] [--full] [--venv DIR] [--reuse] [--pin NAME==VERSION ...] [--json FILE]

It makes a venv outside the repository (default ``$TMPDIR/aot-canary-newest`` or ``-lowest``) with
the newest releases of torch, transformers, onnx, onnxruntime, onnxscript and onnx-ir (or, with
``--lowest``, the lowest of each that pyproject admits), installs aot into it, runs the
artifact tier (``--tier artifact``; ``--full``: ``--tier full``), builds every shipped recipe that this machine can build, and prints
a compatibility table (Markdown) to paste into docs/compatibility.md's canary section.

A machine-wide pip cap on torch (``PIP_CONSTRAINT``) is lifted for the newest releases only.
Newest torch releases come from the registry as CUDA builds (GBs): keep the venv (``--reuse``).
Exit 0 when everything passed, 1 when anything broke: run it at the start of a session, and fix
what it finds first.
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from environments import REPO, WATCHED, install_aot, installed_versions, lower_bounds, make_venv, pip

# What a recipe on a CUDA device needs, and how to tell whether this machine has it.
_CUDA_DEVICE = re.compile(r"^\s+device:\s*cuda", re.MULTILINE)
_HAS_CUDA = "import torch, sys; sys.exit(0 if torch.cuda.is_available() else 1)"


def main() -> int:
    arguments = _arguments()
    mode = "lowest" if arguments.lowest else "newest"
    venv = arguments.venv or Path(tempfile.gettempdir()) / f"aot-canary-{mode}"
    python = venv / "bin" / "python"
    if not (arguments.reuse and python.exists()):
        python = make_venv(venv)
    pins = dict(pin.split("==", 1) for pin in arguments.pin)
    # Newest: the watched libraries at their newest. Lowest: every declared dependency at its lower bound.
    names = list(lower_bounds()) if arguments.lowest else list(WATCHED)
    wanted = [f"{name}=={pins[name]}" if name in pins else _wanted(name, arguments.lowest) for name in names]
    install_aot(python, editable=True)
    # Then past pyproject's window on purpose: the newest releases are what a fresh install will meet next.
    pip(python, "install", "--quiet", "--upgrade", *wanted, uncapped=not arguments.lowest)
    versions = installed_versions(python)
    report = {"mode": mode, "full": arguments.full, "date": time.strftime("%Y-%m-%d"), "versions": {name: versions.get(name) for name in WATCHED},
              "suite": _suite(python, arguments.full), "recipes": _recipes(python, venv)}
    if arguments.json:
        arguments.json.write_text(json.dumps(report, indent=2) + "\n")
    print(render(report))
    broken = report["suite"]["returncode"] != 0 or any(row["status"] == "failed" for row in report["recipes"])
    return 1 if broken else 0


def _arguments() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--lowest", action="store_true", help="the window's lowest releases instead of the newest")
    parser.add_argument("--venv", type=Path, help="where the venv lives (outside the repository)")
    parser.add_argument("--reuse", action="store_true", help="keep an existing venv there, only upgrading it")
    parser.add_argument("--pin", action="append", default=[], metavar="NAME==VERSION", help="hold one library at a version")
    parser.add_argument("--json", type=Path, help="also write the report as JSON")
    parser.add_argument("--full", action="store_true", help="the whole suite, slow tests included, not the fast one")
    return parser.parse_args()


def _wanted(name: str, lowest: bool) -> str:
    if not lowest:
        return name
    bound = lower_bounds().get(name)
    return f"{name}=={bound}" if bound else name


def _suite(python: Path, full: bool) -> dict:
    started = time.monotonic()
    tier = "full" if full else "artifact"  # tests/conftest.py's --tier: CI's selection, or every test (the coverage table stays opt-in)
    # CI's two workers for CI's tier; the full tier's full-size builds run one at a time (two would not fit in memory).
    workers = [] if full else ["-n", "2", "--dist", "loadfile"]
    run = subprocess.run([str(python), "-m", "pytest", "-q", "--tier", tier, *workers, "-p", "no:cacheprovider"],
                         cwd=REPO, capture_output=True, text=True)
    summary = next((line.strip("= ") for line in reversed(run.stdout.splitlines()) if re.search(r"\d+ (passed|failed|error)", line)), "")
    failed = [line.split(" ", 1)[1].split(" - ")[0] for line in run.stdout.splitlines() if line.startswith(("FAILED ", "ERROR "))]
    return {"returncode": run.returncode, "summary": summary, "failed": failed, "seconds": round(time.monotonic() - started)}


def _recipes(python: Path, venv: Path) -> list[dict]:
    rows = []
    aot = venv / "bin" / "aot"
    for recipe in sorted((REPO / "recipes").glob("*.yaml")):
        if _CUDA_DEVICE.search(recipe.read_text()) and subprocess.run([str(python), "-c", _HAS_CUDA]).returncode != 0:
            rows.append({"recipe": recipe.name, "status": "skipped", "detail": "needs a CUDA GPU"})
            continue
        with tempfile.TemporaryDirectory() as output:
            started = time.monotonic()
            run = subprocess.run([str(aot), "build", str(recipe), "-o", f"{output}/build"], capture_output=True, text=True)
        detail = (run.stderr.strip().splitlines() or [""])[-1] if run.returncode else f"{time.monotonic() - started:.0f} s"
        rows.append({"recipe": recipe.name, "status": "built" if run.returncode == 0 else "failed", "exit": run.returncode, "detail": detail[:300]})
    return rows


def render(report: dict) -> str:
    """The report as Markdown: the versions, the fast suite, every recipe."""
    lines = [f"Canary ({report['mode']} releases), {report['date']}:", "", "| library | version |", "|---|---|"]
    lines += [f"| {name} | {version or 'not installed'} |" for name, version in report["versions"].items()]
    suite = report["suite"]
    which = "Whole suite (`--tier full`)" if report.get("full") else "CI suite (`--tier artifact`)"
    lines += ["", f"{which}: {suite['summary'] or 'no summary'} ({suite['seconds']} s)"]
    lines += [f"- failed: `{name}`" for name in suite["failed"][:40]]
    lines += ["", "| recipe | result | detail |", "|---|---|---|"]
    lines += [f"| `{row['recipe']}` | {row['status']} | {row['detail']} |" for row in report["recipes"]]
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
