"""``escha-deploy logs [-f]``: the server container's log (secrets masked). Exit 3 when there is
no container."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import FormatLongOpt, OptionalProfileOpt, OutputFormat

EXAMPLES = """
Examples:

\b
  escha-deploy logs --profile rtx5060ti-tp2-fp8 -f
  escha-deploy logs --profile rtx5060ti-tp2-fp8 --diagnose
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_LIFECYCLE

    @app.command("logs", rich_help_panel=PANEL_LIFECYCLE, epilog=EXAMPLES)
    def logs(
        profile: OptionalProfileOpt = None,
        follow: Annotated[bool, typer.Option("--follow", "-f", help="Keep following.")] = False,
        tail: Annotated[str, typer.Option("--tail", help="Lines from the end, or 'all'.")] = "all",
        diagnose: Annotated[bool, typer.Option(
            "--diagnose", help="Instead of the log, its diagnosis (as `escha-deploy diagnose`): exit 0 for a "
            "proven cause, 5 when none.")] = False,
        fmt: FormatLongOpt = OutputFormat.table,
    ) -> None:
        """Print the server's log."""
        from escha_deploy.utils.errors import BadInput
        from escha_deploy.launch import manage

        from escha_deploy.profile import profile_name as _profile_name

        if tail != "all" and not (tail.isdigit() and len(tail) <= 9):
            raise BadInput(f"--tail: expected a number of lines or all (got {tail[:40]!r})")
        if diagnose:
            from escha_deploy.utils.errors import ExitCode

            from .diagnose import emit

            diag = manage.diagnose_container(_profile_name(profile))
            emit(diag, fmt)
            raise typer.Exit(int(ExitCode.OK if diag.conclusive else ExitCode.INCONCLUSIVE))
        manage.logs(_profile_name(profile), follow=follow, tail=int(tail) if tail.isdigit() else "all")
