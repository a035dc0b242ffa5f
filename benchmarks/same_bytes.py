"""Do two checkouts of aot build every shipped recipe into the same bytes? (a refactor's proof)

    python benchmarks/same_bytes.py record DIR          # build every shipped recipe this machine can build into DIR
    python benchmarks/same_bytes.py compare DIR_A DIR_B  # same files, same sha256, same manifest (less its `run`)?

Run ``record`` once with each checkout (each in its own environment, or with
``PYTHONPATH`` pointing at the other checkout's installed copy), then ``compare``. Recipes whose
``model.device`` this machine lacks (``bert_cuda.yaml`` without a GPU) are skipped, and named.
The manifest's ``run`` section (times, memory) and the recipe's path are left out: they
differ from run to run by design. So is a file the manifest itself declares not byte-reproducible
(the AOTInductor package, ``aoti.byte_reproducible: false``): ``compare`` says whether it differed,
which is how that declaration was measured, and does not count it.
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


def declared_unreproducible(manifest: dict) -> set[str]:
    """The files a build's manifest says are not byte-reproducible: the AOTInductor package's, when it has one."""
    package = manifest.get("aoti") or {}
    return {package["file"]} if package and package.get("byte_reproducible") is False else set()


def digests(build: Path) -> tuple[dict[str, str], set[str]]:
    """Each file's sha256 (the manifest's less what varies by design), and the files declared not reproducible."""
    files = {p.relative_to(build).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest() for p in build.rglob("*") if p.is_file()}
    manifest = json.loads((build / "manifest.json").read_text())
    manifest.pop("run", None)
    manifest["recipe"].pop("path", None)
    declared = declared_unreproducible(manifest)
    for name in declared:
        manifest["artifacts"].pop(name, None)
    files["manifest.json"] = hashlib.sha256(json.dumps(manifest, sort_keys=True).encode()).hexdigest()
    return files, declared


def compare(first: Path, second: Path) -> int:
    differences = 0
    for build in sorted(p for p in first.iterdir() if (p / "manifest.json").is_file()):
        theirs = second / build.name
        if not (theirs / "manifest.json").is_file():
            print(f"{build.name}: only in {first}")
            differences += 1
            continue
        (ours, declared), (other, _) = digests(build), digests(theirs)
        changed = sorted(name for name in ours.keys() | other.keys() if ours.get(name) != other.get(name))
        expected = [name for name in changed if name in declared]
        changed = [name for name in changed if name not in declared]
        differences += len(changed)
        note = f" ({', '.join(expected)} differs, as its manifest declares)" if expected else ""
        print(f"{build.name}: " + ("same bytes" if not changed else "differs in " + ", ".join(changed)) + note)
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
