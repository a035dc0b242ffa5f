"""Write a build into a temporary directory and swap it into place only on success.

The temporary directory sits beside the target (same filesystem, so rename is
atomic). On Linux the swap uses ``renameat2(RENAME_EXCHANGE)``: the target
path always names a complete build, the old one or the new one, even if the
process is killed between any two instructions.
"""

from __future__ import annotations

import ctypes
import ctypes.util
import logging
import os
import shutil
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

log = logging.getLogger(__name__)

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_TEMP_MARK = ".aot-tmp-"


@contextmanager
def staged_directory(target: Path) -> Iterator[Path]:
    """Yield an empty directory; on clean exit it replaces ``target``, on error it is removed."""
    target = target.absolute()
    target.parent.mkdir(parents=True, exist_ok=True)
    _remove_stale_temporaries(target)
    staging = target.parent / f".{target.name}{_TEMP_MARK}{os.getpid()}"
    shutil.rmtree(staging, ignore_errors=True)
    staging.mkdir()
    try:
        yield staging
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    _swap_into_place(staging, target)


def _swap_into_place(staging: Path, target: Path) -> None:
    if not target.exists():
        os.rename(staging, target)
        return
    if _exchange(staging, target):
        shutil.rmtree(staging)  # now holds the previous build
        return
    previous = target.parent / f".{target.name}.aot-old-{os.getpid()}"
    os.rename(target, previous)
    os.rename(staging, target)
    shutil.rmtree(previous)


def _exchange(first: Path, second: Path) -> bool:
    libc_name = ctypes.util.find_library("c")
    if not libc_name:
        return False
    libc = ctypes.CDLL(libc_name, use_errno=True)
    renameat2 = getattr(libc, "renameat2", None)
    if renameat2 is None:
        return False
    result = renameat2(_AT_FDCWD, os.fsencode(first), _AT_FDCWD, os.fsencode(second), _RENAME_EXCHANGE)
    if result != 0:
        log.debug("renameat2 exchange failed (errno %d); falling back to two renames", ctypes.get_errno())
        return False
    return True


def _remove_stale_temporaries(target: Path) -> None:
    """Remove staging directories left by builds whose process no longer runs (e.g. after SIGKILL)."""
    for candidate in target.parent.glob(f".{target.name}{_TEMP_MARK}*"):
        pid_text = candidate.name.rsplit("-", 1)[-1]
        if pid_text.isdigit() and not _process_alive(int(pid_text)):
            shutil.rmtree(candidate, ignore_errors=True)


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True
