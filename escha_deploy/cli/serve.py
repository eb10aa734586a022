"""``escha-deploy serve``: the container entrypoint and native launcher. With ``--spec`` it runs
the plan `up` made on the host (re-planning nothing); with ``--profile`` it plans here, as `up`
does. Then it checks what it can see against the plan and runs SGLang as a supervised child
(signals forwarded, secrets redacted, a failed exit diagnosed). Exit 2 for bad input (a flag the
runtime would refuse, a model folder without config.json or weights), 3 before anything starts
(unsafe plan, missing capability, no GPU, less memory or memlock than planned, a spec of another
schema version), the child's code after a forwarded SIGTERM/SIGINT, 4 on any other failure."""

from __future__ import annotations

from typing import Annotated, Optional

import typer

from .options import FactsOpt, OptionalProfileOpt, SetOpt

EXAMPLES = """
Examples:

  escha-deploy serve --profile rtx5060ti-tp2-fp8

  escha-deploy serve --spec /etc/escha/launch-spec.json      # what `up` starts in the container

  ESCHA_SKIP_GPU_PREFLIGHT=1 escha-deploy serve --profile rtx5060ti-tp2-fp8   # tests only
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_RUNTIME

    @app.command("serve", rich_help_panel=PANEL_RUNTIME, epilog=EXAMPLES)
    def serve(
        profile: OptionalProfileOpt = None,
        set_: SetOpt = None,
        spec: Annotated[Optional[str], typer.Option(
            "--spec", help="Run this launch spec (JSON, written by `up`) instead of planning here.")] = None,
        facts: FactsOpt = None,
        dry_run: Annotated[bool, typer.Option(
            "--dry-run", "--print",
            help="Print the exact sglang argv and environment the plan implies (secrets redacted) "
            "and exit; exit 3 when the runtime lacks a needed capability.")] = False,
    ) -> None:
        """Run the SGLang server in the foreground (inside the container, or natively)."""
        from escha_deploy.utils.errors import BadInput

        from .output import report

        if (spec is None) == (profile is None):
            raise BadInput("serve: give exactly one of --spec FILE or --profile NAME")
        if spec is not None:
            if set_ or facts:
                raise BadInput("--spec: the spec was planned already; --set and --facts apply to --profile only")
            from escha_deploy.launch.serve import serve_spec

            raise typer.Exit(serve_spec(spec, dry_run=dry_run, report=report))
        from escha_deploy.launch.serve import serve as run_serve

        raise typer.Exit(run_serve(profile, list(set_ or []), dry_run=dry_run, facts_path=facts, report=report))
