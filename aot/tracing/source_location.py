"""Find the line of *model* code that is running while the tracer works.

Decisions and errors name the user's file, line and expression, so frames of
the tracer itself, of torch.fx and of torch's dispatch glue are skipped.
"""

from __future__ import annotations

import linecache
import os
import sys
from typing import NamedTuple

import torch

_TORCH_DIR = os.path.dirname(torch.__file__)
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
    frame = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(_INTERNAL_PREFIXES):
        frame = frame.f_back
    if frame is None:
        return SourceLocation("<unknown>", 0, "")
    filename, line = frame.f_code.co_filename, frame.f_lineno
    return SourceLocation(filename, line, linecache.getline(filename, line).strip())
