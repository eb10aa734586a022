"""``escha-deploy status``: the running server(s) of a profile, container or native: state,
endpoint, plan digest and uptime, and beside the plan what the server and the host do now
(the host tier, the host's memory, the device pools) with the alerts, their evidence and fix.

Exit 3 when nothing is there (as ``systemctl is-active``). ``--check``: 0 healthy, 3 an alert
(named) or nothing running, 5 when the server answers but its metrics do not (or not within
``--http-timeout``, or too large, or a series it reads is not a number).

Every server is read through ``httpread`` (a total deadline per request, a size cap, a series
cap); a look's NaN or +/-Inf is written as ``null`` in JSON and ``--record``, with a warning
naming it, and makes ``--check`` inconclusive; text is printed without control sequences.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Annotated, Optional

import typer

from escha_deploy.utils.httpread import DEFAULT_DEADLINE_S

from .bench import ApiKeyFileOpt, ApiKeyOpt  # the key as bench, canary and ask take it
from .options import FormatOpt, OptionalProfileOpt, OutputFormat, number_option

#: The longest ``--interval``, seconds (a day): a look a day is the slowest watch that means
#: anything; ``inf`` would reach ``time.sleep``, which refuses it.
MAX_INTERVAL_S = 86400.0
#: The longest ``--window``, seconds (a week of looks).
MAX_WINDOW_S = 7 * 86400.0

EXAMPLES = """
Examples:

  escha-deploy status --profile rtx5060ti-tp2-fp8 --format json

  escha-deploy status --watch --record day2.jsonl

  escha-deploy status --check --interval 5

  escha-deploy status --endpoint http://127.0.0.1:30000 --profile rtx5060ti-tp2-fp8 --check

Watching a running box: docs/launch.md.
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_LIFECYCLE

    @app.command("status", rich_help_panel=PANEL_LIFECYCLE, epilog=EXAMPLES)
    def status(
        ctx: typer.Context,
        profile: OptionalProfileOpt = None,
        endpoint: Annotated[Optional[str], typer.Option(
            "--endpoint", "-e", help="Watch the server at this URL (http://HOST:PORT), one escha-deploy did not "
            "start: its /metrics and /server_info. With --profile the plan's figures (planned on this host) "
            "stand beside it; without, they are omitted.")] = None,
        api_key: ApiKeyOpt = None,
        api_key_file: ApiKeyFileOpt = None,
        format: FormatOpt = OutputFormat.table,
        watch: Annotated[bool, typer.Option("--watch", "-w", help="Refresh every --interval seconds "
                                            "(rich live display) until Ctrl-C or --count looks.")] = False,
        check: Annotated[bool, typer.Option("--check", help="Two looks --interval apart (one when no server's "
                                            "metrics can be read); exit 0 healthy, 3 an alert or nothing "
                                            "running, 5 the server answers but its metrics do not.")] = False,
        interval: Annotated[float, typer.Option("--interval", parser=number_option(0.05, MAX_INTERVAL_S),
                                                help="Seconds between looks.")] = 5.0,
        window: Annotated[float, typer.Option("--window", parser=number_option(1.0, MAX_WINDOW_S),
                                              help="Seconds of looks --watch compares "
                                              "(counters over this window).")] = 300.0,
        http_timeout: Annotated[float, typer.Option(
            "--http-timeout", parser=number_option(0.1, 3600.0),
            help="Seconds one request to a server may take in all: connecting, headers and the whole "
            "/metrics body (not per byte); a slower answer is a named error (--check: exit 5).")] = DEFAULT_DEADLINE_S,
        count: Annotated[int, typer.Option("--count", parser=number_option(0, integer=True), help="Stop --watch after this many looks "
                                           "(0: until Ctrl-C).")] = 0,
        record: Annotated[Optional[Path], typer.Option("--record", help="Append each look to FILE, one JSON "
                                                       "object per line.")] = None,
        prefill_tps: Annotated[Optional[float], typer.Option(
            "--prefill-tps", parser=number_option(1.0, 1e9), help="Prefill rate (tokens/s) the load-back-vs-recompute alert compares "
            "with (default: the plan's: bench's last cold prefill, else hicache.prefill_tokens_per_s).")] = None,
    ) -> None:
        """Show the server(s) of a profile and what they do now: host tier, host memory, alerts."""
        from escha_deploy.utils.errors import Inconclusive, Refused
        from escha_deploy.utils.paths import check_output
        from escha_deploy.watch import record as rec
        from escha_deploy.watch.session import Watcher, find_targets

        from escha_deploy.profile import profile_name as _profile_name
        from .output import info, print_json, stdout_console, warn

        if watch and check:
            from escha_deploy.utils.errors import BadInput

            raise BadInput("status: --watch and --check do not go together (--check looks twice and exits)")
        if record is not None:
            check_output(record, "--record")
        from escha_deploy.utils.httpread import Policy

        policy = Policy(deadline_s=http_timeout)
        if endpoint is not None:
            targets = [_endpoint_target(ctx, endpoint, profile, api_key, api_key_file, http_timeout)]
        else:
            if api_key_file is not None:
                from escha_deploy.utils.errors import BadInput

                raise BadInput("status: --api-key-file goes with --endpoint (a server escha-deploy started is "
                               "read with the key it was started with)")
            targets = find_targets(_profile_name(profile), note=lambda line: info(f"status: {line}"))
        if not targets:
            raise Refused(f"status: nothing running{' for profile ' + _profile_name(profile) if profile else ''}")
        watchers = [Watcher(t, window_s=window, prefill_tokens_per_s=prefill_tps, since_start=not watch,
                            policy=policy) for t in targets]
        warned: set[str] = set()

        def finite(rows: list[dict]) -> tuple[list[dict], list[str]]:
            """The rows with NaN/Inf as null (JSON has neither), each named once in a warning as
            ``PROFILE: key.path``."""
            out, bad = [], []
            for row in rows:
                clean, paths = rec.finite_json(row)
                out.append(clean)
                bad += [f"{row.get('profile')}: {path}" for path in paths]
            for path in bad:
                if path not in warned:
                    warned.add(path)
                    warn(f"status: {path} is not a number (NaN or Inf); shown as null")
            return out, bad

        unproven: list[str] = []  # the last look's values that were not numbers (their paths)

        def look_all() -> list[dict]:
            rows = [w.look()[0] for w in watchers]
            for w in watchers:
                if w.docker_error:
                    warn(w.docker_error)
                    w.docker_error = None
            rows, unproven[:] = finite(rows)
            if record is not None:
                rec.append(record, {"t": time.time(), "targets": rows})
            return rows

        if watch:
            _watch(look_all, interval=interval, count=count, fmt=format)
            return
        rows = look_all()
        # a second look adds window rates; a server whose metrics could not be read at the first
        # look (not answering, too slow, too large, not a number) gives --check nothing more
        if check and not all(r["metrics_error"] for r in rows):
            time.sleep(interval)
            rows = look_all()
        if format is OutputFormat.json:
            print_json(rows)
        else:
            _table(rows, stdout_console())
        if check:
            alerts = [f"{_label(r)}: {a['id']}: {a['evidence']}" for r in rows for a in r["alerts"]]
            alerts += [f"{r['profile']}: not running: container {r['container']} is {r['state']}"
                       for r in rows if r["state"] != "running"]
            if alerts:
                raise Refused(*(f"status --check: alert {a}" for a in alerts),
                              hint="each alert's fix is in `escha-deploy status` and docs/launch.md")
            quiet = [f"{_label(r)}: {r['metrics_error']}" for r in rows if r["metrics_error"]]
            quiet += [f"{path} is not a number (NaN or Inf)" for path in unproven]
            if quiet:
                raise Inconclusive(*(f"status --check: {q}" for q in quiet),
                                   hint="/metrics must answer HTTP 200 with SGLang's series, all numbers, within "
                                   "--http-timeout (runtime.enable_metrics starts the server with --enable-metrics); "
                                   "docs/launch.md")


def _label(row: dict) -> str:
    """What a ``--check`` line names: the profile, or the URL of an ``--endpoint`` without one."""
    return row["endpoint"] if row.get("kind") == "endpoint" and row["profile"] == "-" else row["profile"]


def _endpoint_target(ctx: typer.Context, url: str, profile: str | None, api_key: str | None,
                     api_key_file: Path | None, deadline_s: float):
    """``--endpoint URL``: the URL checked as ``bench`` checks it, the key as ``bench`` takes it
    (``--api-key-file`` or ``ESCHA_API_KEY``; else the profile's ``container.api_key_file`` when
    readable), ``/server_info`` read once, and the ``--profile``'s plan on this host (None
    without one)."""
    from escha_deploy.launch.ready import Probe
    from escha_deploy.watch.session import _read_key, endpoint_target

    from .bench import _api_key, check_endpoint

    check_endpoint(url)
    key = _api_key(ctx, api_key, api_key_file)
    view, name = None, None
    if profile is not None:
        from escha_deploy.launch.planview import plan_view
        from escha_deploy.pipeline import BoxRuntime, Options, facts_source, plan_here
        from escha_deploy.profile import load_profile

        prof = load_profile(profile)
        name = prof.name
        plan = plan_here(prof, facts_source(None), BoxRuntime(), Options(check_argv=False, digest=True)).plan
        view = plan_view(plan, plan.plan_digest or "", prof.watch)
        key = key or _read_key(prof.container.api_key_file)
    got = Probe(url, key, server_info_s=deadline_s).server_info()
    why = None if got is not None else ("neither /server_info nor /get_server_info answered 200 with a JSON "
                                        f"object within {deadline_s:g} s")
    return endpoint_target(url.rstrip("/"), profile=name, plan=view, api_key=key, server_info=got,
                           server_info_why=why)


def _table(rows: list[dict], console) -> None:
    from rich.table import Table
    from rich.text import Text

    from escha_deploy.utils.termtext import printable
    from escha_deploy.watch.render import render_row

    cols = ("profile", "state", "endpoint", "plan_digest", "uptime_s", "restart_policy")
    table = Table(title_justify="left", box=None, pad_edge=False)
    for col in cols:
        table.add_column({"plan_digest": "plan", "uptime_s": "uptime s", "restart_policy": "restart"}
                         .get(col, col), overflow="fold")
    for r in rows:
        table.add_row(*(Text(printable(str(r[k]))) if r[k] is not None else "-" for k in cols))
    console.print(table)
    for r in rows:
        console.print(render_row(_printable(r)))


def _printable(value):
    """A row with every string in it without control sequences (``termtext.printable``):
    labels, names and errors quoted from a server or a state file reach the terminal."""
    from escha_deploy.utils.termtext import printable

    if isinstance(value, str):
        return printable(value)
    if isinstance(value, dict):
        return {_printable(k): _printable(v) for k, v in value.items()}  # a rank's label is a header
    if isinstance(value, list):
        return [_printable(v) for v in value]
    return value


def _watch(look_all, *, interval: float, count: int, fmt: OutputFormat) -> None:
    """Redraw every ``interval`` s (from the start of one look to the next) with rich's Live
    display, or (``--format json``) write one line per look holding the JSON array of rows: a
    stream for scripts."""
    from rich.console import Group
    from rich.live import Live

    from escha_deploy.watch.render import render_row
    from escha_deploy.watch.session import iso

    from .output import stdout_console

    n = 0
    try:
        if fmt is OutputFormat.json:  # JSON Lines: one array of rows per look, flushed
            import json
            import sys

            while True:
                t0 = time.monotonic()
                sys.stdout.write(json.dumps(look_all(), separators=(",", ":"), allow_nan=False) + "\n")
                sys.stdout.flush()
                n += 1
                if count and n >= count:
                    return
                _sleep_rest(interval, t0)
        console = stdout_console()
        with Live(console=console, auto_refresh=False, transient=False) as live:
            while True:
                t0 = time.monotonic()
                rows = look_all()
                n += 1
                live.update(Group(*(render_row(_printable(r)) for r in rows),
                                  f"look {n} at {iso(time.time())}, every {interval:g} s; Ctrl-C stops"),
                            refresh=True)
                if count and n >= count:
                    return
                _sleep_rest(interval, t0)
    except KeyboardInterrupt:
        pass


def _sleep_rest(interval: float, started: float) -> None:
    """Sleep what is left of ``interval`` since ``started`` (``time.monotonic()``): looks start
    every ``interval`` seconds, and one that took as long (a server answering at its deadline)
    is followed by the next at once."""
    time.sleep(max(0.0, interval - (time.monotonic() - started)))
