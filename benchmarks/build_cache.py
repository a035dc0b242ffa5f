"""A cold build against one restored from the build cache, from a directory and from S3, each in its own process.

    python benchmarks/build_cache.py [RECIPE] [--set KEY=VALUE ...] [--rounds 3]

RECIPE defaults to recipes/bert.yaml; ``--set`` goes to every build as ``aot build`` takes it (a quick check:
``--set model.config.num_hidden_layers=2``). Every build is a fresh ``aot build`` process into a fresh output
directory, timed by the wall clock from its start to its exit: what a CI job waits for, Python's start and the
imports included. In order:

- cold: ``--rounds`` builds without a cache;
- directory: one build with ``--cache DIR`` that misses and stores (the miss's cost over a cold build), then
  ``--rounds`` builds that hit;
- s3: the same with ``--cache s3://bucket/cache`` on moto's S3 API server on 127.0.0.1 (started here; s3fs is
  the client, ``--cache-option endpoint_url=...``).

Printed: the median of each, and the ratios of a hit to a cold build, against issue #50's bar (a directory
0.25x or less, S3 0.35x or less). A build that should hit and does not (the key changed: the sources were
edited meanwhile) stops the run. Nothing else should run on the machine meanwhile.
"""

from __future__ import annotations

import argparse
import logging
import os
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from aot.directory.manifest import cpu_model  # the name every manifest records

REPO = Path(__file__).resolve().parents[1]
BARS = {"directory": 0.25, "s3": 0.35}
_AWS_TEST_ENVIRONMENT = {"AWS_ACCESS_KEY_ID": "benchmark", "AWS_SECRET_ACCESS_KEY": "benchmark", "AWS_DEFAULT_REGION": "us-east-1"}


def _build(recipe: Path, overrides: list[str], output: Path, cache: list[str], expect: str | None) -> float:
    command = [sys.executable, "-c", "from aot.cli import entry_point; entry_point()", "build", str(recipe), "-o", str(output),
               *(arg for override in overrides for arg in ("--set", override)), *cache]
    started = time.perf_counter()
    completed = subprocess.run(command, capture_output=True, text=True, env={**os.environ, **_AWS_TEST_ENVIRONMENT})
    seconds = time.perf_counter() - started
    if completed.returncode != 0:
        raise SystemExit(f"{recipe}: build failed (exit {completed.returncode}): {completed.stderr.strip()[-400:]}")
    if expect is not None and f"cache {expect}" not in completed.stdout:
        raise SystemExit(f"expected a cache {expect}, got: {completed.stdout.strip()} {completed.stderr.strip()[-400:]}")
    return seconds


def _s3_server() -> tuple[object, str]:
    from moto.server import ThreadedMotoServer

    os.environ.update(_AWS_TEST_ENVIRONMENT)
    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    import s3fs

    s3fs.S3FileSystem(endpoint_url=endpoint).mkdir("aot-benchmark")
    return server, endpoint


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("recipe", type=Path, nargs="?", default=REPO / "recipes" / "bert.yaml")
    parser.add_argument("--set", dest="overrides", action="append", default=[], metavar="KEY=VALUE")
    parser.add_argument("--rounds", type=int, default=3)
    args = parser.parse_args()
    recipe = args.recipe.resolve()
    server, endpoint = _s3_server()
    stores = {"directory": None, "s3": ["--cache", "s3://aot-benchmark/cache", "--cache-option", f"endpoint_url={endpoint}"]}
    seconds: dict[str, list[float]] = {"cold": []}
    try:
        with tempfile.TemporaryDirectory(prefix="aot-build-cache-") as workdir:
            work = Path(workdir)
            stores["directory"] = ["--cache", str(work / "cache")]
            outputs = iter(work / f"out-{i}" for i in range(10_000))
            for round_index in range(args.rounds):
                seconds["cold"].append(_build(recipe, args.overrides, next(outputs), [], None))
                print(f"cold {round_index + 1}: {seconds['cold'][-1]:.2f} s", flush=True)
            for name, cache in stores.items():
                seconds[f"{name} miss"] = [_build(recipe, args.overrides, next(outputs), cache, "miss")]
                print(f"{name} miss (stores): {seconds[f'{name} miss'][0]:.2f} s", flush=True)
                seconds[f"{name} hit"] = []
                for round_index in range(args.rounds):
                    seconds[f"{name} hit"].append(_build(recipe, args.overrides, next(outputs), cache, "hit"))
                    print(f"{name} hit {round_index + 1}: {seconds[f'{name} hit'][-1]:.2f} s", flush=True)
    finally:
        server.stop()
    cold = statistics.median(seconds["cold"])
    print(f"\n{args.recipe.name} {' '.join('--set ' + o for o in args.overrides)}, {args.rounds} rounds, "
          f"CPU: {cpu_model()}, {os.cpu_count()} cores; each build a fresh process, wall clock")
    print("| build | seconds (median) | / cold | bar |\n|---|---|---|---|")
    print(f"| cold | {cold:.2f} | 1.00x | |")
    failed = False
    for name in stores:
        miss, hit = statistics.median(seconds[f"{name} miss"]), statistics.median(seconds[f"{name} hit"])
        print(f"| {name}, miss and store | {miss:.2f} | {miss / cold:.2f}x | |")
        print(f"| {name}, hit | {hit:.2f} | {hit / cold:.2f}x | <= {BARS[name]:.2f}x |")
        failed |= hit / cold > BARS[name]
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
