"""Console entry point: run the Typer app and map escha's own errors to exit codes.

Only ``EschaError`` subclasses are mapped (one line per problem on stderr, exit code from
DESIGN.md section 3); any other exception is a bug and keeps its traceback. ``ESCHA_DEBUG=1``
shows the traceback for escha's errors too.
"""

from __future__ import annotations

import os
import sys


def main(argv: list[str] | None = None) -> int:
    from escha_deploy.errors import EschaError

    from .app import build_app

    app = build_app()
    try:
        app(args=argv, prog_name="escha-deploy", standalone_mode=True)
    except EschaError as exc:
        if os.environ.get("ESCHA_DEBUG") == "1":
            import traceback

            traceback.print_exc()
        for line in exc.lines():
            print(line, file=sys.stderr)
        sys.exit(int(exc.exit_code))
    return 0


if __name__ == "__main__":  # pragma: no cover
    main()
