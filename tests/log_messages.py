"""What a logger says during a block (pytest's logging plugin is off in this project)."""

from __future__ import annotations

import logging
from collections.abc import Iterator
from contextlib import contextmanager


class _Messages(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.messages: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.messages.append(record.getMessage())


@contextmanager
def messages_of(logger_name: str, level: int | None = logging.DEBUG) -> Iterator[list[str]]:
    """The messages ``logger_name`` logs in the block, at ``level`` and above (``None``: its level as set)."""
    logger, handler = logging.getLogger(logger_name), _Messages()
    level_before = logger.level
    logger.addHandler(handler)
    if level is not None:
        logger.setLevel(level)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level_before)
