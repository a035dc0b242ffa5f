"""Write a build into a temporary directory and swap it into place only on success.

aot never deletes what it did not write. A target may be replaced only when it
does not exist, is an empty directory, or is an aot build directory whose every
file its manifest lists (:func:`check_replaceable`). Anything else (a project
directory, ``-o .``, a build into which someone put a file of their own) is
refused before any work is done, and checked again just before the swap.

The temporary directory sits beside the target (same filesystem, so rename is
atomic). On Linux the swap uses ``renameat2(RENAME_EXCHANGE)``: the target
path always names a complete build, the old one or the new one, even if the
process is killed between any two instructions.
"""

from __future__ import annotations

import array
import ctypes
import json
import logging
import os
import re
import shutil
import struct
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from aot.directory.manifest import MANIFEST_NAME
from aot.release.paths import RELEASE_FILE_NAMES
from aot.errors import ExportError, RecipeError
from aot.process.libc import function

log = logging.getLogger(__name__)

_AT_FDCWD = -100
_RENAME_EXCHANGE = 2
_TEMP_MARK = ".aot-tmp-"
# linux/fs.h's _IOR('f', 1, long) in the encoding of x86, arm and riscv (read, the size of a long, type, number); on
# architectures that encode requests otherwise the request is unknown there (ENOTTY) and no flags are read.
_FS_IOC_GETFLAGS = (2 << 30) | (struct.calcsize("l") << 16) | (ord("f") << 8) | 1
_FS_IMMUTABLE_FL, _FS_APPEND_FL = 0x10, 0x20


def check_replaceable(target: Path) -> None:
    """Raise RecipeError (exit 2) unless ``target`` may become a build directory.

    Allowed: a path that does not exist yet under a writable directory, an empty directory,
    or an earlier aot build holding nothing its manifest does not list.
    """
    target = target.absolute()
    if target.is_symlink() or (target.exists() and not target.is_dir()):
        raise RecipeError(f"{target}: exists and is not a directory; refusing to replace it")
    unmovable = _why_the_swap_would_fail(target)
    if unmovable is not None:
        raise RecipeError(f"{target}: {unmovable}")
    if target.is_dir():
        unlisted = _files_not_written_by_aot(target)
        if unlisted is not None:
            raise RecipeError(
                f"{target}: {unlisted}; aot replaces only an empty directory or an earlier aot build "
                "(remove it yourself or choose another -o)"
            )
    writable_parent = next((p for p in target.parents if p.exists()), None)
    if writable_parent is None or not os.access(writable_parent, os.W_OK | os.X_OK):
        what = "cannot replace it" if target.exists() else "cannot create the output directory"
        raise RecipeError(f"{target}: {what} ({writable_parent} is not writable)")


def _why_the_swap_would_fail(target: Path) -> str | None:
    """Why renaming a finished build onto ``target`` would fail, found before the build rather than after it: a mount
    point cannot be renamed, nor an entry of an immutable or append-only directory (root passes os.access for both)."""
    if target.is_dir() and _is_mount_point(target):
        return "is a mount point, which a finished build cannot be renamed onto; choose a directory inside it"
    for directory, what in ((target, "is"), (target.parent, "is in a directory that is")):
        if directory.is_dir() and _inode_flags(directory) & (_FS_IMMUTABLE_FL | _FS_APPEND_FL):
            return f"{what} immutable or append-only (chattr +i/+a); aot cannot replace it"
    return None


def _is_mount_point(directory: Path) -> bool:
    """Whether ``directory`` is mounted on: another filesystem's root (os.path.ismount), or a bind mount of the same
    filesystem, which only the process's mount table tells (Linux's /proc/self/mountinfo, its fifth field)."""
    if os.path.ismount(directory):
        return True
    try:
        table = Path("/proc/self/mountinfo").read_text(encoding="utf-8", errors="surrogateescape")
    except OSError:  # no such table: not Linux
        return False
    resolved = str(directory.resolve())
    return any(_mount_path(line.split(" ")[4]) == resolved for line in table.splitlines() if line.count(" ") >= 4)


def _mount_path(field: str) -> str:
    """A path as the mount table writes it: a space, tab, newline or backslash as a backslash and three octal digits."""
    return re.sub(r"\\([0-7]{3})", lambda digits: chr(int(digits.group(1), 8)), field)


def _inode_flags(directory: Path) -> int:
    """Linux's inode flags of ``directory`` (``lsattr``'s), 0 where the system or filesystem keeps none. Read so that
    a directory the final rename cannot move is refused before the build, not after it (root passes os.access)."""
    try:
        import fcntl
    except ImportError:  # not a POSIX system
        return 0
    try:
        descriptor = os.open(directory, os.O_RDONLY | os.O_DIRECTORY)
    except OSError:
        return 0
    try:
        flags = array.array("i", [0, 0])  # the kernel writes an int; room for the long the request's number declares
        fcntl.ioctl(descriptor, _FS_IOC_GETFLAGS, flags, True)
        return flags[0]
    except OSError:  # a filesystem without inode flags
        return 0
    finally:
        os.close(descriptor)


def _files_not_written_by_aot(directory: Path) -> str | None:
    """None when ``directory`` is empty or an aot build and nothing else; else why not."""
    if next(directory.iterdir(), None) is None:
        return None
    manifest_path = directory / MANIFEST_NAME
    if not manifest_path.is_file():
        return f"not empty and not an aot build directory (no {MANIFEST_NAME})"
    try:
        manifest = json.loads(manifest_path.read_text(encoding="utf-8"))
        # A signature or provenance put inside by aot sign goes with the build it signed (aot.release.paths).
        listed = set(manifest["artifacts"]) | {MANIFEST_NAME, *RELEASE_FILE_NAMES}
    except (OSError, UnicodeDecodeError, ValueError, KeyError, TypeError):
        return f"{MANIFEST_NAME} is not an aot manifest"
    # A directory is the build's when a listed file lies under it; any other (an empty one someone made) is not aot's to delete.
    folders = {parent.as_posix() for name in listed for parent in Path(name).parents if parent != Path(".")}
    for entry in sorted(directory.rglob("*")):
        relative = entry.relative_to(directory).as_posix()
        theirs = entry.is_file() and relative not in listed or entry.is_dir() and relative not in folders
        if entry.is_symlink() or theirs or not (entry.is_file() or entry.is_dir()):
            return f"holds '{relative}', which its {MANIFEST_NAME} does not list"
    return None


@contextmanager
def staged_directory(target: Path) -> Iterator[Path]:
    """Yield an empty directory; on clean exit it replaces ``target``, on error it is removed."""
    target = target.absolute()
    try:
        target.parent.mkdir(parents=True, exist_ok=True)
        _remove_stale_temporaries(target)
        staging = target.parent / f".{target.name}{_TEMP_MARK}{os.getpid()}"
        shutil.rmtree(staging, ignore_errors=True)
        staging.mkdir()
    except OSError as error:
        raise RecipeError(f"{target}: cannot create the output directory: {error.strerror}") from None
    try:
        yield staging
        check_replaceable(target)  # again: something may have been put there while the build ran
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise
    try:
        _swap_into_place(staging, target)
    except OSError as error:
        shutil.rmtree(staging, ignore_errors=True)
        raise ExportError(f"{target}: cannot move the build into place: {error.strerror}") from None


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
    renameat2 = function("renameat2")
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
