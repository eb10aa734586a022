"""``escha-deploy logs [-f]``: the server container's log (secrets masked). Exit 3 when there is
no container."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import OptionalProfileOpt

EXAMPLES = """
Examples:

  escha-deploy logs --profile rtx5060ti-tp2-fp8 -f
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_LIFECYCLE

    @app.command("logs", rich_help_panel=PANEL_LIFECYCLE, epilog=EXAMPLES)
    def logs(
        profile: OptionalProfileOpt = None,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following.")] = False,
        tail: Annotated[str, typer.Option("--tail", help="Lines from the end, or 'all'.")] = "all",
    ) -> None:
        """Print the server's log."""
        from escha_deploy.errors import BadInput
        from escha_deploy.launch import manage

        from .down import _profile_name

        if tail != "all" and not (tail.isdigit() and len(tail) <= 9):
            raise BadInput(f"--tail: expected a number of lines or all (got {tail[:40]!r})")
        manage.logs(_profile_name(profile), follow=follow, tail=int(tail) if tail.isdigit() else "all")
