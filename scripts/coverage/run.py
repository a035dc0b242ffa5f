"""Fill the coverage table: architecture x class x frontend, and one end-to-end build per architecture.

    python -m scripts.coverage.run                      # everything, written to scripts/coverage/coverage.json
    python -m scripts.coverage.run --only bert,gpt2 --frontends fx --no-build
    python -m scripts.coverage.run --page               # and the table in docs/coverage.md
    python -m scripts.coverage.run --page-only          # only the table, from coverage.json as it is

Results merge into the existing coverage.json: a run replaces the cells it ran and keeps
the others, so the table can be filled in parts (``--only``). Each cell runs in a forked
child under a time limit (:mod:`scripts.coverage.isolated`). The build of an architecture
takes its first class that traced (the base class first), with the frontend that traced
it (fx first); where none did, the base class with fx, so the build records why.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path
from typing import Any

import torch
import transformers

import aot.builder.spine  # noqa: F401  (imported once here, before the children fork, not once in each)

from .architectures import Architecture, architectures, gone_in_transformers_5
from .cells import TRACERS, build_end_to_end
from .isolated import run_all, worker_count
from .render import COLUMNS, FRONTENDS, render_markdown, rewrite_page
from .shapes import SHAPES

HERE = Path(__file__).resolve().parent
COVERAGE_JSON = HERE / "coverage.json"
PAGE = HERE.parent.parent / "docs" / "coverage.md"
TRACE_TIMEOUT_S = 180
BUILD_TIMEOUT_S = 300


def _load(path: Path) -> dict[str, Any]:
    return json.loads(path.read_text()) if path.exists() else {"architectures": {}}


def _entry(row: Architecture, previous: dict[str, Any]) -> dict[str, Any]:
    old_classes = previous.get("classes", {})
    return {
        "in_hf_tracer_4_53": row.in_hf_tracer_4_53,
        "also_required": row.also_required,
        "base_classes": list(row.base_classes),
        "classes": {name: dict(old_classes.get(name, {})) for name in row.classes},
        "build": previous.get("build"),
    }


def build_choice(row: Architecture, entry: dict[str, Any]) -> tuple[str, str]:
    """The class and frontend the architecture's build uses (see the module docstring).

    Only a class a recipe can name (``model.class`` is looked up in ``transformers``) is
    chosen: TrOCRDecoder lives in its modeling module alone.
    """
    nameable = [name for name in row.classes if isinstance(getattr(transformers, name, None), type)] or list(row.classes)
    for frontend in FRONTENDS:
        for name in nameable:
            if entry["classes"][name].get(frontend, {}).get("ok"):
                return name, frontend
    return nameable[0], "fx"


def _report(label: str, outcome) -> None:
    status = "ok" if outcome.ok else outcome.error
    print(f"{label:70s} {outcome.seconds:6.1f} s  {status}", flush=True)


def fill(rows: list[Architecture], data: dict[str, Any], frontends: list[str], build: bool, workers: int) -> None:
    """Run the cells of ``rows`` into ``data["architectures"]``."""
    entries = {row.model_type: _entry(row, data["architectures"].get(row.model_type, {})) for row in rows}
    jobs = [((row.model_type, name, frontend), TRACERS[frontend], (row.model_type, name))
            for row in rows for name in row.classes for frontend in frontends]
    for (model_type, name, frontend), outcome in run_all(jobs, workers, TRACE_TIMEOUT_S):
        entries[model_type]["classes"][name][frontend] = outcome.to_json()
        _report(f"{model_type} {name} {frontend}", outcome)
    if build:
        choices = {row.model_type: build_choice(row, entries[row.model_type]) for row in rows}
        jobs = [(model_type, build_end_to_end, (model_type, *choice)) for model_type, choice in choices.items()]
        for model_type, outcome in run_all(jobs, workers, BUILD_TIMEOUT_S):
            name, frontend = choices[model_type]
            entries[model_type]["build"] = {"class": name, "frontend": frontend, **outcome.to_json()}
            _report(f"{model_type} {name} build ({frontend})", outcome)
    data["architectures"].update(entries)


def _ordered(data: dict[str, Any], every: list[Architecture]) -> dict[str, Any]:
    """Rows in the table's order; rows no longer in it dropped."""
    return {row.model_type: data["architectures"][row.model_type] for row in every if row.model_type in data["architectures"]}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m scripts.coverage.run", description=__doc__.splitlines()[0])
    parser.add_argument("--only", help="comma-separated model types (default: every row)")
    parser.add_argument("--frontends", default=",".join(COLUMNS), help="comma-separated: fx, export, hf_onnx (transformers' exporter)")
    parser.add_argument("--no-build", action="store_true", help="skip the end-to-end builds (their earlier results stay)")
    parser.add_argument("--page", "--readme", dest="page", action="store_true",
                        help="rewrite the table in docs/coverage.md from the result (--readme: its old name)")
    parser.add_argument("--page-only", action="store_true", help="rewrite docs/coverage.md's table from the JSON file; run no cell")
    parser.add_argument("--workers", type=int, default=worker_count(), help="cells run at once (default: one per core)")
    parser.add_argument("--output", type=Path, default=COVERAGE_JSON, help="the JSON file results merge into")
    args = parser.parse_args(argv)

    every = architectures()
    known = {row.model_type for row in every}
    only = [name.strip() for name in args.only.split(",") if name.strip()] if args.only else sorted(known)
    frontends = [name.strip() for name in args.frontends.split(",") if name.strip()]
    unknown = sorted(set(only) - known) + sorted(set(frontends) - set(COLUMNS))
    if unknown:
        parser.error(f"unknown model type or frontend: {', '.join(unknown)} (model types: {', '.join(sorted(known))})")

    if args.page_only:
        rewrite_page(PAGE, render_markdown(_load(args.output)))
        print(f"{PAGE} rewritten from {args.output}")
        return 0
    started = time.perf_counter()
    data = _load(args.output)
    fill([row for row in every if row.model_type in only], data, frontends, not args.no_build, args.workers)
    data = {"transformers": transformers.__version__, "torch": torch.__version__.split("+")[0],
            "shapes": [list(shape) for shape in SHAPES], "gone_in_transformers_5": gone_in_transformers_5(),
            "architectures": _ordered(data, every)}
    args.output.write_text(json.dumps(data, indent=1, ensure_ascii=False) + "\n")
    if args.page:
        rewrite_page(PAGE, render_markdown(data))
    print(f"{len(only)} architectures in {time.perf_counter() - started:.0f} s; results in {args.output}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
