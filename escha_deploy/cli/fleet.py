"""``escha-deploy fleet ...``: past one box. Plan every box of a fleet file, start SGLang's
router (SMG) in front of the boxes' servers, render compose files per box and Kubernetes
manifests. There is no remote control: ``fleet up --box NAME`` runs on that box."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import FormatOpt, OutputFormat

FleetFileArg = Annotated[Path, typer.Argument(help="fleet file (YAML): boxes, groups, router", show_default=False)]

EXAMPLES = """
Examples:

  escha-deploy fleet plan fleet.yaml

  escha-deploy fleet up fleet.yaml --router

  escha-deploy fleet status fleet.yaml --format json

  escha-deploy fleet compose fleet.yaml --out deploy/

  escha-deploy fleet render k8s fleet.yaml --out k8s/
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_PLANNING

    fleet = typer.Typer(name="fleet", no_args_is_help=True, help="Past one box: replicas behind SGLang's router "
                        "(SMG), multi-node instances, compose files per box, Kubernetes manifests.",
                        epilog=EXAMPLES)
    fleet.command("plan", epilog="Example:  escha-deploy fleet plan fleet.yaml")(plan_command)
    app.add_typer(fleet, rich_help_panel=PANEL_PLANNING)


def _gib(n: int, digits: int = 2) -> str:
    from ..units import fmt_gib

    return fmt_gib(n, digits)


def plan_command(file: FleetFileArg, fmt: FormatOpt = OutputFormat.table) -> None:
    """Plan every box with its own facts (saved doctor report, or host_ram/platform) as `plan`
    does, then the fleet: instances, GPUs, host-tier capacity, and what a fleet refuses.

    Exit 0 when every box is ok or hicache_off, 3 when any box is unsafe or a fleet check
    refuses, 2 for a bad fleet file or profile.
    """
    from ..errors import ExitCode
    from ..fleet.model import load_fleet
    from ..fleet.plan import plan_fleet

    result = plan_fleet(load_fleet(file))
    if fmt is OutputFormat.json:
        from .output import print_json

        print_json(result)
    else:
        render_fleet_plan(result)
    _print_problems(result)
    if result.verdict == "unsafe":
        raise typer.Exit(int(ExitCode.REFUSED))


def _print_problems(result) -> None:
    """A fleet plan's warnings and refusals, one line each, on stderr."""
    import sys

    from .output import warn

    for w in result.warnings:
        warn(w)
    for p in result.problems:
        print(f"refused: {p}", file=sys.stderr)


def render_fleet_plan(result) -> None:
    """The fleet plan as two rich tables on stdout; problems and warnings on stderr."""
    from rich.table import Table

    from .output import stdout_console

    style = {"ok": "green", "hicache_off": "yellow", "unsafe": "red"}
    t = Table(title=f"fleet {result.fleet}: per box", title_justify="left")
    for col in ("box", "profile", "host", "node", "GPUs", "verdict", "hicache", "pinned"):
        t.add_column(col, no_wrap=col != "profile")
    for b in result.boxes:
        p = b.plan
        host = f"{p.platform} {_gib(p.budget.memory_base_bytes, 0)} {p.host_source}"
        hc = ("off" if b.hicache_ratio is None and b.hicache_size_gb is None
              else f"{b.hicache_size_gb} GB" if b.hicache_size_gb else f"ratio {b.hicache_ratio:g}")
        node = "-" if b.instance is None else f"{b.instance}/{b.node_rank}"
        t.add_row(b.box, b.profile, host, node, str(b.gpus), f"[{style.get(b.verdict, 'white')}]{b.verdict}[/]",
                  hc, _gib(b.pinned_total_bytes))
    out = stdout_console()
    if not out.is_terminal:  # a pipe or file: rich would cut the table at 80 columns
        out.width = 160
    out.print(t)
    t2 = Table(title=f"fleet {result.fleet}: instances", title_justify="left")
    for col in ("instance", "group", "nodes", "boxes", "GPUs", "host-tier tokens"):
        t2.add_column(col, no_wrap=True)
    for i in result.instances:
        t2.add_row(i.name, i.group, str(i.nodes), ", ".join(i.boxes), str(i.gpus), f"{i.host_tier_tokens:,}")
    out.print(t2)
    out.print(f"fleet: {result.total_instances} instances, {result.total_gpus} GPUs, host tier "
              f"{_gib(result.host_tier_bytes)} pinned, {result.host_tier_tokens:,} tokens  "
              f"[{'green' if result.verdict == 'ok' else 'red'}]{result.verdict}[/]")

