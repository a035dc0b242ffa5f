"""Build time and peak memory of one recipe under two checkouts, measured side by side (a refactor's cost).

    python benchmarks/build_side_by_side.py RECIPE --rounds 5 \\
        --checkout before=ENV_A --checkout after=ENV_B

Each ``--checkout NAME=ENV`` names a directory of ``KEY=VALUE`` lines (or ``-`` for none)
giving the environment a build of that checkout runs under (``PYTHONPATH`` pointing at it, say).
Every round builds the recipe once per checkout, alternating which goes first, each build in
a fresh ``aot build`` process into a fresh directory, so that both see the same machine state
in turn. Reported per checkout: the median build time (the manifest's ``run.stages_s.total``, the
whole build from the recipe to the manifest) and the median peak memory (``run.memory.peak_rss_mib``,
the build process plus its export child's private pages), then the paired median ratios of the
second checkout over the first. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from aot.directory.manifest import cpu_model  # the name every manifest records


def _environment(spec: str) -> dict[str, str]:
    if spec == "-":
        return {}
    values = {}
    for line in Path(spec).read_text().splitlines():
        if line.strip() and not line.startswith("#"):
            key, _, value = line.partition("=")
            values[key.strip()] = value.strip()
    return values


def _build(recipe: Path, environment: dict[str, str], workdir: Path) -> dict[str, float]:
    output = Path(tempfile.mkdtemp(dir=workdir)) / "out"
    command = [sys.executable, "-c", "from aot.cli import entry_point; entry_point()", "build", str(recipe), "-o", str(output)]
    completed = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **environment}, cwd=workdir)
    if completed.returncode != 0:
        raise SystemExit(f"{recipe}: build failed (exit {completed.returncode}): {completed.stderr.strip()[-400:]}")
    run = json.loads((output / "manifest.json").read_text())["run"]
    return {"seconds": run["stages_s"]["total"], "peak_mib": run["memory"]["peak_rss_mib"]}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--checkout", action="append", required=True, help="NAME=ENVFILE (or NAME=- for this environment)")
    args = parser.parse_args()
    checkouts = [spec.split("=", 1) for spec in args.checkout]
    if len(checkouts) != 2:
        parser.error("give exactly two --checkout")
    results: dict[str, list[dict[str, float]]] = {name: [] for name, _ in checkouts}
    with tempfile.TemporaryDirectory(prefix="aot-side-by-side-") as workdir:
        for round_index in range(args.rounds):
            order = checkouts if round_index % 2 == 0 else checkouts[::-1]
            for name, spec in order:
                figures = _build(args.recipe.resolve(), _environment(spec), Path(workdir))
                results[name].append(figures)
                print(f"round {round_index + 1} {name}: {figures['seconds']:.2f} s, peak {figures['peak_mib']:.0f} MiB", flush=True)
    (first, _), (second, _) = checkouts
    print(f"\n{args.recipe.name}, {args.rounds} rounds, CPU: {cpu_model()}, {os.cpu_count()} cores")
    print("| checkout | build s (median) | peak MiB (median) |\n|---|---|---|")
    for name, figures in results.items():
        print(f"| {name} | {statistics.median(f['seconds'] for f in figures):.2f} | {statistics.median(f['peak_mib'] for f in figures):.0f} |")
    time_ratio = statistics.median(b["seconds"] / a["seconds"] for a, b in zip(results[first], results[second]))
    peak_ratio = statistics.median(b["peak_mib"] / a["peak_mib"] for a, b in zip(results[first], results[second]))
    print(f"paired median ratio {second}/{first}: time {time_ratio:.3f}x, peak memory {peak_ratio:.3f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
