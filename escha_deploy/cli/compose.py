"""``escha-deploy compose``: render compose.yaml for a profile (the same container settings
as ``up``), to stdout or a file."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import DEFAULT_PROFILE, FactsOpt, ProfileOpt, SetOpt

EXAMPLES = """
Examples:

  escha-deploy compose --profile rtx5060ti-tp2-fp8 > compose.yaml

  escha-deploy compose --profile rtx5060ti-tp2-fp8 --facts box.json -o compose.yaml   # plans from box.json
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_LIFECYCLE

    @app.command("compose", rich_help_panel=PANEL_LIFECYCLE, epilog=EXAMPLES)
    def compose(
        profile: ProfileOpt = DEFAULT_PROFILE,
        set_: SetOpt = None,
        facts: FactsOpt = None,
        output: Annotated[Optional[Path], typer.Option("--output", "-o", help="Write here instead of stdout.")] = None,
    ) -> None:
        """Render a docker compose file for a profile."""
        from escha_deploy.launch.compose import render_profile

        text = render_profile(profile, list(set_ or []), facts_file=facts)
        if output:
            from escha_deploy.paths import write_output

            write_output(output, text, "--output")
        else:
            typer.echo(text, nl=False)
