"""``escha-deploy down``: SIGTERM, grace period, then kill; returns when the ports are free.
Exit 0 also when nothing runs. The L3 directory (a bind mount) is never deleted."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .options import OptionalProfileOpt, number_option

EXAMPLES = """
Examples:

  escha-deploy down --profile rtx5060ti-tp2-fp8

  escha-deploy down            # every container escha-deploy started
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_LIFECYCLE

    @app.command("down", rich_help_panel=PANEL_LIFECYCLE, epilog=EXAMPLES)
    def down(
        profile: OptionalProfileOpt = None,
        timeout: Annotated[Optional[int], typer.Option(
            "--timeout", help="Grace seconds after SIGTERM (default: the container's stop timeout).",
            parser=number_option(0, 7 * 24 * 3600, integer=True))] = None,
    ) -> None:
        """Stop the server container(s)."""
        from escha_deploy.launch import manage

        from .output import info

        from escha_deploy.profile import profile_name

        stopped = manage.down(profile_name(profile), timeout_s=timeout)
        info("down: " + (", ".join(stopped) + " stopped" if stopped else "nothing running"))

