"""Do two checkouts of aot build every shipped recipe into the same bytes? (a refactor's proof)

    python benchmarks/same_bytes.py record DIR          # build every shipped recipe this machine can build into DIR
    python benchmarks/same_bytes.py compare DIR_A DIR_B  # same files, same sha256, same manifest (less its `run`)?

Run ``record`` once with each checkout (each in its own environment, or with
``PYTHONPATH`` pointing at the other checkout's installed copy), then ``compare``. Recipes whose
``model.device`` this machine lacks (``bert_cuda.yaml`` without a GPU) are skipped, and named.
The manifest's ``run`` section (times, memory) and the recipe's path are left out: they
differ from run to run by design.
"""

from __future__ import annotations

import argparse
import hashlib
import json
import subprocess
import sys
from pathlib import Path

RECIPES = Path(__file__).resolve().parents[1] / "recipes"


def record(root: Path) -> None:
    import yaml

    root.mkdir(parents=True, exist_ok=True)
    for recipe in sorted(RECIPES.glob("*.yaml")):
        device = (yaml.safe_load(recipe.read_text()).get("model") or {}).get("device", "cpu")
        if device != "cpu":
            print(f"skip {recipe.name}: model.device is {device}")
            continue
        command = [sys.executable, "-c", "from aot.cli import entry_point; entry_point()", "build", str(recipe), "-o", str(root / recipe.stem)]
        completed = subprocess.run(command, capture_output=True, text=True, cwd=root)
        print(f"{recipe.name}: exit {completed.returncode} {completed.stderr.strip()}")


def digests(build: Path) -> dict[str, str]:
    files = {p.relative_to(build).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in build.rglob("*") if p.is_file()}
    manifest = json.loads((build / "manifest.json").read_text())
    manifest.pop("run", None)
    manifest["recipe"].pop("path", None)
    files["manifest.json"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return files


def compare(first: Path, second: Path) -> int:
    differences = 0
    for build in sorted(p for p in first.iterdir() if (p / "manifest.json").is_file()):
        theirs = second / build.name
        if not (theirs / "manifest.json").is_file():
            print(f"{build.name}: only in {first}")
            differences += 1
            continue
        ours, other = digests(build), digests(theirs)
        changed = sorted(name for name in ours.keys() | other.keys() if ours.get(name) != other.get(name))
        differences += len(changed)
        print(f"{build.name}: " + ("same bytes" if not changed else "differs in " + ", ".join(changed)))
    return 1 if differences else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    commands = parser.add_subparsers(dest="command", required=True)
    commands.add_parser("record").add_argument("root", type=Path)
    both = commands.add_parser("compare")
    both.add_argument("first", type=Path)
    both.add_argument("second", type=Path)
    arguments = parser.parse_args()
    if arguments.command == "record":
        record(arguments.root)
        return 0
    return compare(arguments.first, arguments.second)


if __name__ == "__main__":
    sys.exit(main())
