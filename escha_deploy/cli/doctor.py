"""``escha-deploy doctor``: will this profile work on this box? Host, Docker and GPU checks
with real probes; exit 0 once the checks ran, or with ``--profile`` 0/3 for runs/does not; 5
(inconclusive) when a verdict would rest on probes that could not run here (no torch)."""

from __future__ import annotations

from typing import Annotated

import typer

from .options import FormatOpt, OptionalProfileOpt, OutputFormat, SetOpt

EXAMPLES = """
Examples:

  escha-deploy doctor

  escha-deploy doctor --profile rtx5060ti-tp2-fp8

  escha-deploy doctor --profile rtx5060ti-tp2 --format json --fresh
"""

_STYLE = {"ok": "green", "warn": "yellow", "fail": "red", "unknown": "magenta"}


def render_table(report) -> None:
    """The report as a rich table on stdout, then the verdict line."""
    from rich.markup import escape
    from rich.table import Table

    from .output import stdout_console

    table = Table(title=f"doctor{' --profile ' + report.profile if report.profile else ''}",
                  show_lines=False, title_justify="left")
    # every column wraps at word boundaries and folds a word longer than the column (a path, a
    # URL): rich's default overflow, "ellipsis", cut such a word at 80 columns
    table.add_column("check", overflow="fold")
    table.add_column("status", no_wrap=True)
    table.add_column("seen", overflow="fold")
    table.add_column("fix", overflow="fold")
    for c in report.checks:
        table.add_row(c.id, f"[{_STYLE[c.status]}]{c.status}[/]", escape(c.detail), escape(c.fix or ""))
    console = stdout_console()
    console.print(table)
    unknown = report.unknown_checks()
    if report.profile is not None:
        failed = report.failed_profile_checks()
        if failed:
            console.print(f"[red]{report.profile} cannot run here[/]: " + "; ".join(c.id for c in failed))
        elif unknown:
            console.print(f"[magenta]{report.profile}: inconclusive[/] (the probes could not run here): "
                          + "; ".join(c.id for c in unknown))
        else:
            console.print(f"[green]{report.profile} can run here[/]")
    elif unknown:
        console.print("[magenta]inconclusive[/] (the probes could not run here): " + "; ".join(c.id for c in unknown))


def register(app: typer.Typer) -> None:
    from .app import PANEL_PLANNING

    @app.command("doctor", rich_help_panel=PANEL_PLANNING, epilog=EXAMPLES)
    def doctor(
        profile: OptionalProfileOpt = None,
        set_: SetOpt = None,
        format: FormatOpt = OutputFormat.table,
        probes: Annotated[bool, typer.Option(
            "--probes/--no-probes",
            help="Run the GPU probes (host-mapped store, pinned ceiling, all-reduce).")] = True,
        fresh: Annotated[bool, typer.Option(
            "--fresh", help="Rerun the probes even when saved results younger than a day exist.")] = False,
    ) -> None:
        """Check this box: platform (Linux/WSL2), host memory, limits, Docker, GPUs, and
        real GPU probes. Findings are saved for `plan` and `up`."""
        from escha_deploy.doctor.run import run_doctor

        from .output import info, print_json

        def started() -> None:  # after the profile is known to be valid: a bad name exits 2 first
            if probes:
                info("doctor: gathering host facts and running the GPU probes (each in its own process)...")

        report = run_doctor(profile, set_ or (), probes=probes, reuse=not fresh, started=started)
        if format == OutputFormat.json:
            print_json(report)
        else:
            render_table(report)
        if why := report.facts.get("probes", {}).get("unavailable"):
            from .output import warn

            warn(f"doctor: the GPU probes could not run in this Python ({why}): their answers are unknown, "
                 "and nothing was saved as a finding")
        raise typer.Exit(report.exit_code)
