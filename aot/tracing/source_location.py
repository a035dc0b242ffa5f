"""Find the line of *model* code that is running while the tracer works.

Decisions and errors name the user's file, line and expression, so frames of
the tracer itself, of torch.fx and of torch's dispatch glue are skipped.
``raised_at`` finds that line in the traceback of an error torch raised.
"""

from __future__ import annotations

import importlib.util
import linecache
import os
import sys
import sysconfig
import traceback
from typing import NamedTuple

import torch

_TORCH_DIR = os.path.dirname(torch.__file__)


def _package_dirs(*packages: str) -> tuple[str, ...]:
    """Where the installed ones of ``packages`` keep their files, found without importing them."""
    specs = [importlib.util.find_spec(package) for package in packages]
    locations = [location for spec in specs if spec is not None for location in spec.submodule_search_locations or ()]
    return tuple(os.path.abspath(location) + os.sep for location in locations)


# Code that is not the model's: aot (aot.export and aot.passes have folders of their own), torch,
# and the libraries torch's ONNX exporter translates with.
_TOOL_DIRS = (_TORCH_DIR + os.sep,) + _package_dirs("aot", "aot.export", "aot.passes", "onnxscript", "onnx_ir", "onnx")
_STANDARD_LIBRARY = os.path.abspath(sysconfig.get_paths()["stdlib"]) + os.sep
_INSTALLED_PACKAGES = tuple({os.path.abspath(sysconfig.get_paths()[key]) + os.sep for key in ("purelib", "platlib")})
_INTERNAL_PREFIXES = (
    os.path.dirname(os.path.abspath(__file__)) + os.sep,
    os.path.join(_TORCH_DIR, "fx") + os.sep,
    os.path.join(_TORCH_DIR, "_subclasses") + os.sep,
    os.path.join(_TORCH_DIR, "utils") + os.sep,
    os.path.join(_TORCH_DIR, "_tensor.py"),
    os.path.join(_TORCH_DIR, "overrides.py"),
    os.path.join(_TORCH_DIR, "_ops.py"),
    os.path.join(_TORCH_DIR, "nn", "modules", "module.py"),
)


class SourceLocation(NamedTuple):
    file: str
    line: int
    expression: str

    def short_file(self) -> str:
        marker = "site-packages" + os.sep
        index = self.file.rfind(marker)
        return self.file[index + len(marker):] if index >= 0 else self.file

    def __str__(self) -> str:
        return f"{self.short_file()}:{self.line} `{self.expression}`"


def user_location() -> SourceLocation:
    """The innermost frame of model code (see ``raised_at``) calling into the tracer.

    A torch function the model calls (``torch.unique_consecutive`` lives in torch/functional.py)
    is not where the user can act: its caller is. Where no frame is model code (a model made
    of torch's own modules), the innermost frame outside the tracer's machinery.
    """
    frame, fallback = sys._getframe(1), None
    while frame is not None and not _is_model_code(frame.f_code.co_filename):
        if fallback is None and not frame.f_code.co_filename.startswith(_INTERNAL_PREFIXES):
            fallback = frame
        frame = frame.f_back
    frame = frame or fallback
    if frame is None:
        return SourceLocation("<unknown>", 0, "")
    filename, line = frame.f_code.co_filename, frame.f_lineno
    return SourceLocation(filename, line, linecache.getline(filename, line).strip())


def raised_at(error: BaseException) -> SourceLocation | None:
    """The line of model code nearest to where ``error`` was raised, if its traceback passes through any.

    Model code is any frame outside aot, torch, the ONNX exporter's libraries and the standard
    library (``contextlib``'s frames come between torch's), and not generated (``<eval_with_key>``: a GraphModule's code, whose
    line says nothing of the model).
    """
    for frame in reversed(traceback.extract_tb(error.__traceback__)):
        if _is_model_code(frame.filename):
            return SourceLocation(frame.filename, frame.lineno or 0, (frame.line or "").strip())
    return None


def _is_model_code(filename: str) -> bool:
    if filename.startswith("<"):
        return False
    path = os.path.abspath(filename)
    in_standard_library = path.startswith(_STANDARD_LIBRARY) and not path.startswith(_INSTALLED_PACKAGES)
    return not (in_standard_library or path.startswith(_TOOL_DIRS))
