"""Write ``requirements.lock``: the exact versions of everything ``pip install '.[test]'`` brings, from a fresh venv.

    python3 scripts/lock.py [--torch 2.13.0] [--venv DIR]

The venv (default ``$TMPDIR/aot-lock``) gets torch first (the version pinned here: its CPU
wheel), then aot with its test extras at the newest releases pyproject's window admits; the
lock is what pip then reports. The README's commands and ``.ci/run`` install through it
(``pip install -c requirements.lock ...``), so that the same recipe gives the same bytes for
anyone who follows them. A torch local label (``+cpu``) is dropped: ``torch==2.13.0`` admits
the CPU and the CUDA wheel alike, whichever the machine offers.
"""

from __future__ import annotations

import argparse
import datetime
import tempfile
from pathlib import Path

from environments import LOCK, REPO, install_aot, installed_versions, make_venv, pip

_NOT_LOCKED = {"aot", "pip", "setuptools", "wheel"}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--torch", default="2.13.0", help="the torch release the lock pins (default: %(default)s)")
    parser.add_argument("--venv", type=Path, default=Path(tempfile.gettempdir()) / "aot-lock")
    arguments = parser.parse_args()
    python = make_venv(arguments.venv)
    pip(python, "install", "--quiet", f"torch=={arguments.torch}")
    install_aot(python, editable=False)
    versions = installed_versions(python)
    lines = [
        "# The exact versions aot is tested and built with. Written by scripts/lock.py; do not edit by hand.",
        f"# {datetime.date.today().isoformat()}: torch=={arguments.torch}, then aot[test] at the newest releases its window admits.",
        "# Install through it: pip install -c requirements.lock '.[test]'",
    ]
    for name in sorted(versions):
        if name not in _NOT_LOCKED:
            lines.append(f"{name}=={versions[name].split('+')[0]}")
    LOCK.write_text("\n".join(lines) + "\n")
    print(f"wrote {LOCK.relative_to(REPO)}: {len(lines) - 3} distributions")


if __name__ == "__main__":
    main()
