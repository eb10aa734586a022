"""``escha-deploy serve``: the container entrypoint and native launcher. Re-plans against what
it sees, then runs SGLang as a supervised child (signals forwarded, secrets redacted, a failed
exit diagnosed). Exit 3 before anything starts (unsafe plan, missing capability, no GPU);
the child's code after a forwarded SIGTERM/SIGINT; 4 on any other failure."""

from __future__ import annotations

import typer

from typing import Annotated

from .options import ProfileOpt, SetOpt

EXAMPLES = """
Examples:

  escha-deploy serve --profile rtx5060ti-tp2-fp8

  ESCHA_SKIP_GPU_PREFLIGHT=1 escha-deploy serve --profile rtx5060ti-tp2-fp8   # tests only
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_RUNTIME

    @app.command("serve", rich_help_panel=PANEL_RUNTIME, epilog=EXAMPLES)
    def serve(
        profile: ProfileOpt,
        set_: SetOpt = None,
        dry_run: Annotated[bool, typer.Option(
            "--dry-run", "--print",
            help="Print the exact sglang argv and environment the plan implies (secrets redacted) "
            "and exit; exit 3 when the runtime lacks a needed capability.")] = False,
    ) -> None:
        """Run the SGLang server in the foreground (inside the container, or natively)."""
        from escha_deploy.launch.serve import serve as run_serve

        from .output import report

        code = run_serve(profile, list(set_ or []), dry_run=dry_run, report=report)
        raise typer.Exit(code)
