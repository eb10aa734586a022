"""One output sink: results to stdout (a rich table or JSON), everything else to stderr.

``--format json`` prints ``json.dumps`` of the same data the table renders, with no markup and
no wrapping, so it always parses.
"""

from __future__ import annotations

import json
import sys
from typing import Any


def print_json(data: Any) -> None:
    """Print ``data`` (a pydantic model or plain JSON-able value) as JSON on stdout."""
    if hasattr(data, "model_dump"):
        data = data.model_dump(mode="json")
    sys.stdout.write(json.dumps(data, indent=2, sort_keys=False) + "\n")


def stdout_console():
    from rich.console import Console

    return Console(highlight=False, soft_wrap=False)


def stderr_console():
    from rich.console import Console

    return Console(stderr=True, highlight=False)


def warn(message: str) -> None:
    """A warning line on stderr, without terminal controls (``termtext.printable``): it may
    quote a file, a server or a log."""
    from escha_deploy.utils.termtext import printable

    print(f"warning: {printable(message, newlines=True)}", file=sys.stderr)


def info(message: str) -> None:
    """A progress or info line on stderr (``model pull``'s names a file the hub listed),
    without terminal controls."""
    from escha_deploy.utils.termtext import printable

    print(printable(message, newlines=True), file=sys.stderr)


def report(level: str, message: str, /) -> None:
    """The ``launch.progress.Report`` the CLI hands to launch code: info or warning on stderr."""
    (warn if level == "warning" else info)(message)
