"""How launch code tells its caller what it is doing, without printing.

``up``, ``serve`` and the preparation step report progress and warnings through a ``Report``
callback; the CLI passes one that writes to stderr (``cli.output.report``), tests and the
bench launcher pass their own or ``quiet``. Launch code never imports the CLI's output module.
"""

from __future__ import annotations

from typing import Literal, Protocol

Level = Literal["info", "warning"]


class Report(Protocol):
    """``report(level, message)``: one line of progress (``info``) or a ``warning``."""

    def __call__(self, level: Level, message: str, /) -> None: ...


def quiet(level: Level, message: str, /) -> None:
    """A ``Report`` that drops everything (library use, tests that assert on return values)."""
    return None


def stderr(level: Level, message: str, /) -> None:
    """A ``Report`` that writes each line to stderr (``warning:`` first for warnings), as the CLI
    does; for callers outside the CLI that still want the lines (the bench's launcher)."""
    import sys

    print(("warning: " if level == "warning" else "") + message, file=sys.stderr)
