"""``escha-deploy status``: state, endpoint, plan digest and uptime of the server container(s).
Exit 3 when nothing is there (as ``systemctl is-active``)."""

from __future__ import annotations

import typer

from .options import FormatOpt, OptionalProfileOpt, OutputFormat

EXAMPLES = """
Examples:

  escha-deploy status --profile rtx5060ti-tp2-fp8 --format json
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_LIFECYCLE

    @app.command("status", rich_help_panel=PANEL_LIFECYCLE, epilog=EXAMPLES)
    def status(profile: OptionalProfileOpt = None, format: FormatOpt = OutputFormat.table) -> None:
        """Show the server container(s) of a profile."""
        from escha_deploy.launch import manage

        from .down import _profile_name
        from .output import print_json, stdout_console

        rows = manage.status(_profile_name(profile))
        if format is OutputFormat.json:
            print_json(rows)
            return
        from rich.table import Table

        cols = ("profile", "state", "endpoint", "plan_digest", "uptime_s", "restart_policy")
        table = Table(title_justify="left", box=None, pad_edge=False)
        for col in cols:
            table.add_column({"plan_digest": "plan", "uptime_s": "uptime s", "restart_policy": "restart"}
                             .get(col, col), overflow="fold")
        for r in rows:
            table.add_row(*(str(r[k]) if r[k] is not None else "-" for k in cols))
        stdout_console().print(table)
