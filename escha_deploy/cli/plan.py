"""``escha-deploy plan``: the memory budget of a profile on this host (or a described one).

The options and the output are this module's; the plan is the pipeline's
(``escha_deploy.pipeline.plan_here``: gather -> decide, as every other command plans)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from .options import DEFAULT_PROFILE, FactsOpt, FormatOpt, OutputFormat, ProfileOpt, SetOpt

if TYPE_CHECKING:
    from ..pipeline import Gathered


def register(app: typer.Typer) -> None:
    app.command(
        "plan",
        rich_help_panel="Planning",
        # \b: click keeps the paragraph's lines as written (an example is never rewrapped)
        epilog="Examples:\n\n\b\n  escha-deploy plan --profile rtx5060ti-tp2 --host-ram 16GiB --wsl2 --ratio 2\n"
        "  escha-deploy plan -p rtx5060ti-tp2-fp8 --format json",
    )(plan_command)


def plan_command(
    profile: ProfileOpt = DEFAULT_PROFILE,
    workload: Annotated[Optional[str], typer.Option("--workload", help="The prefixes the host tier should bring back, COUNTxTOKENS (8x18000: 8 distinct 18,000-token prefixes, each asked again): which come back per host-pool split, and what hicache.host_mamba_slots: auto sizes. Default: the profile's hicache.workload.")] = None,
    ratio: Annotated[Optional[str], typer.Option("--ratio", help="--hicache-ratio to plan: a number > 0, or auto (the recommended safe ratio). Default: the profile's.")] = None,
    hicache_size: Annotated[Optional[str], typer.Option("--hicache-size", help="--hicache-size per rank instead of a ratio: whole GB (1e9), as SGLang takes it: 30 or 30GB.")] = None,
    host_ram: Annotated[Optional[str], typer.Option("--host-ram", help="Plan for a described host: the MemTotal its Linux kernel sees (under WSL2 the VM's), e.g. 16GiB. Ignores doctor findings.")] = None,
    wsl2: Annotated[bool, typer.Option("--wsl2", help="The host is WSL2 (default: detected).")] = False,
    linux: Annotated[bool, typer.Option("--linux", help="The host is plain Linux (default: detected).")] = False,
    set_: SetOpt = None,
    facts: FactsOpt = None,
    write_facts: Annotated[Optional[str], typer.Option(
        "--write-facts", help="Also write the facts this plan used (this host, doctor's findings) to "
        "FILE, for `--facts FILE` elsewhere (compose: ESCHA_FACTS).")] = None,
    chart: Annotated[Optional[str], typer.Option(
        "--chart", help="Also draw the memory plan (per rank: server processes, OS, page-cache floor, KV and "
        "mamba host pools, what is left) against the memory base as a PNG at FILE (the 'chart' extra).")] = None,
    sglang_version: Annotated[Optional[str], typer.Option(
        "--sglang-version", metavar="X.Y.Z", help="Plan for this SGLang release (its host guard, memory defaults "
        "and parser). Default: the image's release when run in one, else runtime.sglang_version, else the "
        "default release; two that disagree are refused (exit 3).")] = None,
    compare: Annotated[Optional[str], typer.Option(
        "--compare", metavar="A", help="Instead of the plan, print how it compares with the plan for SGLang "
        "release A on the same host: what changes from A to the planned release (the verdict, the host guard's reading and "
        "answer, SGLang's memory defaults), the flags of A's argv the planned release refuses or warns "
        "about, and each release's verdict reasons. Exit 3 when the planned release's plan is unsafe.")] = None,
    fmt: FormatOpt = OutputFormat.table,
) -> None:
    """Show the memory budget: device pools, host pools, pinned total per rank and overall,
    the runtime's own host-memory checks, and the largest safe --hicache-ratio.

    Exit 0 for ok and hicache_off (launchable without HiCache), 3 for unsafe, 2 for bad input.
    """
    from ..utils.errors import BadInput, ExitCode

    problems = []
    ratio_value, size_value, auto = None, None, False
    if ratio is not None:
        try:
            ratio_value, auto = parse_ratio(ratio)
        except ValueError as exc:
            problems.append(f"--ratio: {exc}")
    if hicache_size is not None:
        try:
            size_value = parse_hicache_size(hicache_size)
        except ValueError as exc:
            problems.append(f"--hicache-size: {exc}")
    if ratio is not None and hicache_size is not None:
        problems.append("--ratio and --hicache-size are mutually exclusive")
    if workload is not None:
        from ..profile.workload import parse_workload

        try:
            parse_workload(workload)
        except ValueError as exc:
            problems.append(f"--workload: {exc}")
    if wsl2 and linux:
        problems.append("--wsl2 and --linux are mutually exclusive")
    if facts is not None and host_ram is not None:
        problems.append("--facts and --host-ram are mutually exclusive (the facts file describes the host)")
    host_bytes = None
    size_notes: list[str] = []
    if host_ram is not None:
        from ..utils.units import decimal_letter_note, parse_size

        try:
            host_bytes = parse_size(host_ram)
            if note := decimal_letter_note(host_ram):
                size_notes.append(f"--host-ram: {note}")
            if host_bytes <= 0:
                raise ValueError("must be larger than 0")
        except ValueError as exc:
            problems.append(f"--host-ram: {exc}")
    if problems:
        raise BadInput(*problems)
    if chart is not None:
        from ..utils.paths import check_output
        from ..pipeline.chart import require_matplotlib

        check_output(chart, "--chart")
        require_matplotlib()

    overrides = list(set_ or []) + ([f"hicache.workload={workload.strip()}"] if workload is not None else [])
    from ..profile import load_profile

    positions: dict = {}
    prof = load_profile(profile, overrides, positions=positions)
    prof, hicache_source, notes = apply_hicache_options(prof, positions, overrides, ratio=ratio,
                                                        hicache_size=hicache_size, auto=auto)
    from ..pipeline import BoxRuntime, Options, facts_source, plan_here

    platform = "wsl2" if wsl2 else "linux" if linux else None
    facts_src = facts_source(facts, host_ram=host_bytes, platform=platform)
    options = Options(ratio=ratio_value, hicache_size_gb=size_value, hicache_source=hicache_source)
    req = plan_here(prof, facts_src, BoxRuntime(flag=sglang_version),
                    options._replace(check_argv=compare is None, digest=fmt is OutputFormat.json))
    if write_facts:
        _write_facts(req.gathered._replace(runtime=req.runtime.described), write_facts)
    result = req.plan
    notes = size_notes + notes
    if notes:
        result = result.model_copy(update={"warnings": notes + list(result.warnings)})
    if compare is not None:
        _print_comparison(prof, facts_src, options, result, compare, fmt)
        from ..sglang.flagcheck import check_argv
        from ..pipeline.argv import server_args

        if result.verdict == "unsafe" or not check_argv(server_args(result, prof), set(result.capabilities)
                                                       | set(prof.runtime.needs), version=result.sglang_release).ok:
            raise typer.Exit(int(ExitCode.REFUSED))
        return
    if chart is not None:
        from ..utils.paths import write_output
        from ..pipeline.chart import draw
        from .output import info

        info(f"plan: chart written to {write_output(chart, draw(result, chart), '--chart')}")
    if fmt is OutputFormat.json:
        from .output import print_json

        print_json(result)
    else:
        from .profiles import say_where_read
        from .render_plan import render_plan

        say_where_read(profile, "plan")  # after every input check: an error stays one line
        # the next line's commands: this profile and its --set options (the ratio options as `up`
        # takes them), and for a re-plan the same host
        launch = (["-p", profile] + [x for item in (set_ or []) for x in ("--set", item.strip())]
                  + (["--set", f"hicache.hicache_ratio={ratio.strip()}"] if ratio is not None else [])
                  + (["--set", f"hicache.hicache_size={size_value}"] if size_value is not None else [])
                  + (["--set", f"hicache.workload={workload.strip()}"] if workload is not None else [])
                  + (["--facts", facts] if facts is not None else []))
        host = ((["--host-ram", host_ram] if host_ram is not None else []) + (["--wsl2"] if wsl2 else [])
                + (["--linux"] if linux else []) + (["--sglang-version", sglang_version] if sglang_version else []))
        render_plan(result, launch, host)
        from ..launch.sglang_preflight import host_note

        if (note := host_note()) is not None:  # where SGLang does not import, its own pre-flight waits for `up`
            print(note)
    # inside an image (/etc/escha/runtime.json), or a facts file's runtime section: the plan
    # above is for that runtime; lacking a capability the profile needs refuses, exit 3, as
    # `serve --print` does
    if req.runtime.binding is not None:
        from ..runtime.description import require_capabilities

        require_capabilities(list(req.runtime.binding[0]), prof.runtime.needs, req.runtime.binding[1], native=None)
    if result.verdict == "unsafe":
        raise typer.Exit(int(ExitCode.REFUSED))


def _print_comparison(prof, facts_src, options, result_b, version_a, fmt) -> None:
    """``--compare A``: plan A on the same host (the release named, whatever the profile says)
    and print ``release_compare.compare``'s rows."""
    from ..pipeline.argv import server_args
    from ..pipeline import BoxRuntime, plan_here
    from ..pipeline.compare import compare
    from ..sglang.releases import check_supported

    check_supported(version_a, "--compare")
    result_a = plan_here(prof, facts_src, BoxRuntime(release=(version_a, "--compare")),
                         options._replace(check_argv=False)).plan
    cmp = compare(result_a, result_b, server_args(result_a, prof))
    if fmt is OutputFormat.json:
        from .output import print_json

        print_json(cmp)
        return
    from rich.console import Console
    from rich.markup import escape
    from rich.table import Table

    con = Console(highlight=False)
    t = Table(title=f"{cmp.profile}: SGLang {cmp.a} -> {cmp.b} on {cmp.host}", title_justify="left")
    for col in ("item", cmp.a, cmp.b, ""):
        t.add_column(col)
    for r in cmp.rows:
        t.add_row(r.item, escape(r.a), escape(r.b), "changed" if r.changed else "")
    con.print(t)
    if cmp.argv_a_on_b:
        con.print(f"the argv {cmp.a} renders, on {cmp.b}'s parser (releases/{cmp.b}/flags-diff.json):")
        for line in cmp.argv_a_on_b:
            con.print(f"  {escape(line)}", soft_wrap=True)
    else:
        con.print(f"the argv {cmp.a} renders parses on {cmp.b}'s parser")
    for version, verdict, reasons in ((cmp.a, cmp.rows[0].a, cmp.reasons_a), (cmp.b, cmp.rows[0].b, cmp.reasons_b)):
        con.print(f"{version}: {verdict}")
        for reason in reasons:
            con.print(f"  - {escape(reason)}", soft_wrap=True)


def _set_item(overrides: list[str], dotted: str) -> str:
    """The last ``--set`` item that set the key ``dotted`` (as the user wrote it), or ``dotted``."""
    for item in reversed(overrides):
        key = ".".join(k for k in item.partition("=")[0].strip().split(".") if k)
        if key == dotted:
            return item.strip()
    return dotted


def apply_hicache_options(prof, positions: dict, overrides: list[str], *, ratio: str | None,
                          hicache_size: str | None, auto: bool):
    """Reconcile ``--ratio``/``--hicache-size`` with the loaded profile's HiCache keys; returns
    ``(profile, source label, warnings)``.

    One rule, as the two options have with each other (mutually exclusive, exit 2): an option
    against a ``--set`` that says otherwise on the same command line is refused (``BadInput``,
    exit 2), naming both; ``--ratio`` against a profile file's ``hicache_size`` > 0 (which SGLang
    would let win: ``--hicache-size`` overrides ``--hicache-ratio``, server_args.py) replaces
    that size, said in a warning naming the file:line. An option with HiCache off
    (``hicache.enabled: false``) has no host pool to size: refused, naming where it was turned off.
    The label is where the deciding key came from (``profile.key_source``): the option, a
    ``--set``, or the profile file:line."""
    from ..utils.errors import BadInput
    from ..profile import key_source

    hc = prof.hicache
    opt = f"--ratio {ratio}" if ratio is not None else f"--hicache-size {hicache_size}" if hicache_size is not None else None
    notes: list[str] = []

    def src(*loc: str) -> str | None:
        return key_source(positions, loc)

    if opt is None:
        loc = ("enabled",) if not hc.enabled else ("hicache_size",) if hc.hicache_size else ("hicache_ratio",)
        return prof, src("hicache", *loc), notes
    if not hc.enabled:
        where = src("hicache", "enabled") or "the profile"
        if where.startswith("--set "):
            raise BadInput(f"{opt} and --set {_set_item(overrides, 'hicache.enabled')} are mutually exclusive: "
                           "with HiCache off there is no host pool to size")
        raise BadInput(f"{opt}: HiCache is off ({where}: hicache.enabled: false), so there is no host pool to size",
                       hint="add --set hicache.enabled=true to plan it with HiCache")
    if ratio is not None:
        if hc.hicache_size:
            where = src("hicache", "hicache_size") or "the profile"
            if where.startswith("--set "):
                raise BadInput(f"{opt} and --set {_set_item(overrides, 'hicache.hicache_size')} are mutually "
                               "exclusive (a hicache_size > 0 overrides the ratio, as --hicache-size does)")
            notes.append(f"{opt} replaces the profile's hicache_size {hc.hicache_size} ({where}): "
                         "this plan is of the ratio; the profile launches with the size")
        r = None if auto else parse_ratio(ratio)[0]
        if r is not None and r < hc.min_ratio:  # as the profile rule refuses hicache_ratio below min_ratio
            raise BadInput(f"{opt}: {r:g} is below hicache.min_ratio {hc.min_ratio:g}: the host pool would be "
                           "smaller than the device pool",
                           hint=f"to plan it anyway, add --set hicache.min_ratio={r:g}")
        update = {"hicache_size": 0} | ({"hicache_ratio": "auto"} if auto else {})
        prof = prof.model_copy(update={"hicache": hc.model_copy(update=update)})
        return prof, "--ratio", notes
    where = src("hicache", "hicache_ratio")
    if where and where.startswith("--set "):
        raise BadInput(f"{opt} and --set {_set_item(overrides, 'hicache.hicache_ratio')} are mutually exclusive, "
                       "as --hicache-size and --ratio are")
    return prof, "--hicache-size", notes


#: An explicit --ratio above this is a typo, not a plan (SGLang would try to pin that many
#: times the device pool).
MAX_CLI_RATIO = 100.0


def parse_ratio(text: str) -> tuple[float | None, bool]:
    """``--ratio``: ``auto`` -> ``(None, True)``; a finite number in (0, 100] -> ``(r, False)``.
    Raises ``ValueError`` with the reason."""
    import math

    t = text.strip().lower()
    if t == "auto":
        return None, True
    from escha_deploy.utils.units import parse_number

    try:
        r = float(parse_number(t))
    except ValueError:
        raise ValueError(f"expected a number > 0 or auto, in plain decimal (got {text!r})") from None
    if not math.isfinite(r) or r <= 0:
        raise ValueError(f"must be a finite number greater than 0 (got {text})")
    if r > MAX_CLI_RATIO:
        raise ValueError(f"{r:g} would pin {r:g} times the device pool per rank; at most {MAX_CLI_RATIO:g}")
    return r, False


def parse_hicache_size(text: str) -> int:
    """``--hicache-size``: whole GB (1e9) per rank, written ``30`` or ``30GB`` (SGLang's flag is an
    int in GB); ``units.parse_hicache_gb``, as the profile key reads it, but 0 is refused."""
    from escha_deploy.utils.units import parse_hicache_gb

    return parse_hicache_gb(text, allow_zero=False)


def _write_facts(g: Gathered, path: str) -> None:
    """``--write-facts``: the gathered host, this host's saved doctor findings and the runtime
    planned when it is known (``Gathered.runtime``: a facts file's runtime section, this
    machine's runtime description, or ``--sglang-version``; no section when not known), as a
    facts file."""
    from ..facts.factsfile import facts_from_host
    from ..utils.paths import write_output
    from .output import info

    # the findings this host's reader read (``Gathered.findings``: none for a described host or
    # a facts file), not read again
    doc = facts_from_host(g.host, g.findings, g.gpus, runtime=g.runtime)
    write_output(path, doc.model_dump_json(indent=2) + "\n", "--write-facts")
    info(f"plan: wrote the facts this plan used to {path}")
