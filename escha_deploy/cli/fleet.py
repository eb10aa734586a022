"""``escha-deploy fleet ...``: past one box. Plan every box of a fleet file, start SGLang's
router (SMG) in front of the boxes' servers, render compose files per box and Kubernetes
manifests. There is no remote control: ``fleet up --box NAME`` runs on that box."""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Optional

import typer

from .options import FormatOpt, OutputFormat, number_option

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
    fleet.command("up", epilog="Examples:  escha-deploy fleet up fleet.yaml --router\n\n"
                  "escha-deploy fleet up fleet.yaml --box lin-b")(up_command)
    fleet.command("status", epilog="Example:  escha-deploy fleet status fleet.yaml --format json")(status_command)
    fleet.command("down", epilog="Example:  escha-deploy fleet down fleet.yaml --router")(down_command)
    fleet.command("build-router", epilog="Example:  escha-deploy fleet build-router --base-image python:3.11-slim"
                  )(build_router_command)
    fleet.command("compose", epilog="Example:  escha-deploy fleet compose fleet.yaml --out deploy/")(compose_command)
    render = typer.Typer(name="render", no_args_is_help=True, help="Render manifests for an orchestrator.")
    render.command("k8s", epilog="Example:  escha-deploy fleet render k8s fleet.yaml --out k8s/")(render_k8s_command)
    fleet.add_typer(render)
    app.add_typer(fleet, rich_help_panel=PANEL_PLANNING)


def _gib(n: int, digits: int = 2) -> str:
    from ..utils.units import fmt_gib

    return fmt_gib(n, digits)


def _gb(n: int) -> str:
    """Pinned bytes as `plan` prints them (GB = 1e9)."""
    from ..utils.units import fmt_gb

    return fmt_gb(n)


def plan_command(file: FleetFileArg, fmt: FormatOpt = OutputFormat.table) -> None:
    """Plan every box with its own facts (saved doctor report, or host_ram/platform) as `plan`
    does, then the fleet: instances, GPUs, host-tier capacity, and what a fleet refuses.

    Exit 0 when every box is ok or hicache_off, 3 when any box is unsafe or a fleet check
    refuses, 2 for a bad fleet file or profile.
    """
    from ..utils.errors import ExitCode
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
    """A fleet plan's warnings (the fleet's, then each box's plan warnings as `box NAME: ...`)
    and refusals, one line each, on stderr."""
    import sys

    from .output import warn

    for w in result.warnings:
        warn(w)
    for b in result.boxes:
        for w in b.plan.warnings:
            warn(f"box {b.box}: {w}")
    for p in result.problems + result.docker_problems:
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
                  hc, _gb(b.pinned_total_bytes))
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
    n, g = result.total_instances, result.total_gpus
    out.print(f"fleet: {n} instance{'' if n == 1 else 's'}, {g} GPU{'' if g == 1 else 's'}, host tier "
              f"{_gb(result.host_tier_bytes)} pinned, {result.host_tier_tokens:,} tokens  "
              f"[{'green' if result.verdict == 'ok' else 'red'}]{result.verdict}[/]")



def _not_the_box(loaded, fp, name: str) -> list[str]:
    """For ``fleet up --box NAME --dry-run`` of a box described by ``host_ram``/``platform`` (no
    saved facts): the dry run plans the machine it runs on, as ``up`` there would, not the
    box's description ``fleet plan`` planned; one line naming what differs here (memory,
    platform) and both plans' HiCache ratios, or none when this machine matches."""
    from ..facts.machine import gather_host_facts
    from ..utils.units import fmt_gib

    bp = fp.box_plan(name)
    here = gather_host_facts()
    box = loaded.fleet.box(name)
    described = bp.plan.budget.memory_base_bytes
    base_here = here.memory_base_bytes
    diff = []
    if base_here != described:
        diff.append(f"memory {fmt_gib(base_here)} here, {fmt_gib(described)} for {name} (host_ram {box.host_ram and fmt_gib(box.host_ram)})")
    if here.platform != bp.plan.platform:
        diff.append(f"platform {here.platform} here, {bp.plan.platform} for {name}")
    if not diff:
        return []
    return [f"fleet up --box {name} --dry-run plans this machine, not {name} as {loaded.path} describes it "
            f"(fleet plan's figures): {'; '.join(diff)}; fleet plan gave {name} "
            + (f"HiCache ratio {bp.hicache_ratio:g}" if bp.hicache_ratio is not None else "its plan")
            + f"; run it on {name}, or give {name} a saved facts file (facts:) to plan it anywhere"]


def _plan_or_refuse(file: Path, docker: bool = True):
    """Load and plan the fleet; ``Refused`` (exit 3) listing every problem when it is unsafe
    (with ``docker``, also what only a Docker deployment cannot do: unpublished ports)."""
    from ..utils.errors import Refused
    from ..fleet.model import load_fleet
    from ..fleet.plan import plan_fleet

    loaded = load_fleet(file)
    fp = plan_fleet(loaded)
    problems = fp.problems + (fp.docker_problems if docker else [])
    if problems:
        import shlex

        raise Refused(*problems, hint=f"`escha-deploy fleet plan {shlex.quote(str(file))}` shows each box's plan")
    return loaded, fp


def up_command(
    file: FleetFileArg,
    router: Annotated[bool, typer.Option("--router", help="Start SGLang's router (SMG) on this box.")] = False,
    box: Annotated[Optional[str], typer.Option("--box", help="Start this box's server, as `up` does (run it on that box).")] = None,
    wait: Annotated[bool, typer.Option("--wait/--no-wait", help="Wait until the router reports every worker healthy.")] = True,
    dry_run: Annotated[bool, typer.Option("--dry-run", help="Start nothing. With --box: print what `up --dry-run` prints for the box; with --router: the router's command, container settings and worker URLs.")] = False,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Start the router, or one box's server. There is no remote control: run `fleet up --box
    NAME` on each box, and `fleet up --router` on the router's box.

    Exit 0 when started (and, with --wait, every worker is healthy behind the router), 3 when
    refused before starting, 4 when the router exited or the workers did not become healthy.
    """
    from ..utils.errors import BadInput

    if router == (box is not None):
        raise BadInput("give exactly one of --router and --box NAME")
    loaded, fp = _plan_or_refuse(file)
    if box is not None and dry_run:
        from ..fleet.box import box_profile
        from .up import print_dry_run

        ref, sets, facts = box_profile(loaded, fp, box)
        if facts is None:
            from .output import warn

            for line in _not_the_box(loaded, fp, box):
                warn(line)
        print_dry_run(ref, sets, facts, fmt)
        return
    if box is not None:
        from ..fleet.box import up_box

        from .output import info, report

        res = up_box(loaded, fp, box, report=report)
        info(f"up: {res.note}" if res.note else f"up: ready in {res.ready_seconds:.1f} s")
        typer.echo(f"{res.profile}\t{res.state}\t{res.endpoint}\t{res.container}")
        return
    from ..fleet.router import startup_timeout_s, worker_urls
    from ..fleet.router_run import describe_router, start_router, wait_workers
    from .output import info

    if loaded.fleet.router is None:
        raise BadInput(f"{loaded.path}: router: missing; add a router section to start SMG")
    urls = worker_urls(loaded, fp)
    if dry_run:
        _print_router_dry_run(describe_router(loaded, fp, urls=urls), fmt)
        return
    what = start_router(loaded, fp, urls=urls)
    info(f"router: started ({what}), policy {loaded.fleet.router.policy}, workers {', '.join(urls)}")
    if wait:
        timeout = startup_timeout_s(loaded, fp)
        info(f"router: waiting up to {timeout} s for {len(urls)} workers to be healthy (a model load takes minutes)")
        state = wait_workers(loaded, urls, timeout)
        info(f"router: ready at {state.url}: {len(state.workers)} workers healthy")


def _print_router_dry_run(desc: dict, fmt: OutputFormat) -> None:
    """``fleet up --router --dry-run``: what would run, on stdout (JSON with --format json)."""
    import shlex

    if fmt is OutputFormat.json:
        from .output import print_json

        print_json(desc)
        return
    typer.echo(f"router: would run ({desc['run']}, nothing started)")
    typer.echo(f"workers: {' '.join(desc['workers'])}")
    for line in desc.get("overload", []):
        typer.echo(f"overload: {line}")
    typer.echo(f"command: {shlex.join(desc['command'])}")
    for key, value in desc.get("container", {}).items():
        typer.echo(f"container.{key}: {value}")


def status_command(
    file: FleetFileArg,
    fmt: FormatOpt = OutputFormat.table,
    http_timeout: Annotated[float, typer.Option(
        "--http-timeout", parser=number_option(0.1, 3600.0),
        help="Seconds the router's answer may take in all (connecting, headers, body; not per byte).")] = 10.0,
) -> None:
    """Each worker's health as the router sees it (SMG's GET /workers).

    Exit 0 when every worker is healthy, 3 when the router does not answer (within
    --http-timeout, or with an answer too large or not JSON) or a worker is not healthy.
    """
    from ..utils.errors import BadInput, ExitCode
    from ..fleet.model import load_fleet
    from ..fleet.plan import plan_fleet
    from ..fleet.router import worker_urls
    from ..fleet.router_run import router_workers

    loaded = load_fleet(file)
    if loaded.fleet.router is None:
        raise BadInput(f"{loaded.path}: router: missing; fleet status asks the router")
    state = router_workers(loaded, worker_urls(loaded, plan_fleet(loaded)), timeout_s=http_timeout)
    if fmt is OutputFormat.json:
        from .output import print_json

        print_json({**state.model_dump(mode="json"), "ready": state.ready})
    else:
        from rich.table import Table

        from .output import stdout_console

        t = Table(title=f"fleet {loaded.fleet.name}: router {state.url}", title_justify="left")
        for col in ("worker", "healthy", "status", "model", "load"):
            t.add_column(col, no_wrap=True)
        from rich.markup import escape

        seen = {w.url: w for w in state.workers}
        for url in state.expected + [u for u in seen if u not in state.expected]:
            w = seen.get(url)
            if w is None:
                t.add_row(escape(url), "[red]not registered[/]", "-", "-", "-")
            else:  # the router's strings are text, never markup
                t.add_row(escape(url), "[green]yes[/]" if w.healthy else "[red]no[/]", escape(w.status or "-"),
                          escape(w.model_id or "-"), "-" if w.load is None else str(w.load))
        if not state.reachable or state.error:
            from ..utils.errors import Refused

            raise Refused(f"fleet status: the router at {state.url} "
                          + (f"does not answer: {state.error}" if not state.reachable else
                             f"answers in a shape it does not have: {state.error}"))
        stdout_console().print(t)
    if not state.ready:
        raise typer.Exit(int(ExitCode.REFUSED))


def down_command(
    file: FleetFileArg,
    router: Annotated[bool, typer.Option("--router", help="Stop this fleet's router on this box.")] = True,
) -> None:
    """Stop the router on this box (SIGTERM, then a grace period). Exit 0, also when none ran."""
    from ..fleet.model import load_fleet
    from ..fleet.router_run import stop_router
    from .output import info

    loaded = load_fleet(file)
    if loaded.fleet.router is not None and router:
        info("router: stopped" if stop_router(loaded) else "router: not running")


def compose_command(
    file: FleetFileArg,
    out: Annotated[Path, typer.Option("--out", "-o", help="Folder for the files, one per box: compose.BOX.yaml (made when missing; its parent must exist).")] = Path("."),
) -> None:
    """Render one compose file per box: its server (or its node of a multi-node instance), and
    on the router's box the router. Exit 3 when the fleet plan is unsafe, 2 for a bad file."""
    from ..fleet.compose import render_box_files
    from ..utils.paths import check_output, output_folder, write_output
    from .output import info

    loaded, fp = _plan_or_refuse(file)
    rendered = render_box_files(loaded, fp)
    files = {out / f"compose.{name}.yaml": text for name, (text, _) in rendered.items()}
    output_folder(out, "--out")
    for path in files:
        check_output(path, "--out")  # a box's file that is a folder: refused before any is written
    for path, text in files.items():
        write_output(path, text, "--out")
        typer.echo(str(path))
    from ..fleet.compose import box_images

    for name, (_, needed) in rendered.items():
        for image, cmd in box_images(loaded, fp, name).items():
            info(f"{name}: needs image {image} first (no registry holds it; the file builds nothing): "
                 f"make it on {name} with `{cmd}`")
        extra = "".join(f", {n} (from {src})" for n, src in needed.items())
        info(f"{name}: copy compose.{name}.yaml{extra} into one folder on {name}, then run "
             f"`docker compose -f compose.{name}.yaml up -d` in that folder")


def render_k8s_command(
    file: FleetFileArg,
    out: Annotated[Optional[Path], typer.Option("--out", "-o", help="Write fleet.k8s.yaml into this folder (made when missing; its parent must exist) instead of stdout.")] = None,
) -> None:
    """Kubernetes manifests: a LeaderWorkerSet per multi-node group, a StatefulSet (file L3) or
    Deployment per replica group, SMG with service discovery and its Role. Exit 3 when the
    fleet plan is unsafe, 2 for a bad file."""
    from ..fleet.k8s import dump, render_k8s

    loaded, fp = _plan_or_refuse(file, docker=False)
    text = dump(render_k8s(loaded, fp), loaded)
    if out is None:
        typer.echo(text, nl=False)
    else:
        from ..utils.paths import output_folder, write_output

        typer.echo(str(write_output(output_folder(out, "--out") / "fleet.k8s.yaml", text, "--out")))


def build_router_command(
    base_image: Annotated[str, typer.Option("--base-image", help="A Debian image whose python3 can pip install.")],
    tag: Annotated[Optional[str], typer.Option("--tag", help="Image tag (default: router.image's default).")] = None,
    python_version: Annotated[str, typer.Option("--python-version", help="The base image's Python (X.Y).")] = "3.11",
) -> None:
    """Build the router (SMG) image from PyPI's smg wheel; no image registry beyond the base is
    needed. Exit 0 built, 4 when the build fails."""
    from ..fleet.model import IMAGE_SMG
    from ..fleet.router_image import build_router_image
    from .output import info

    image_id = build_router_image(base_image, tag or IMAGE_SMG, python_version, progress=info)
    typer.echo(f"{tag or IMAGE_SMG}\t{image_id}")
