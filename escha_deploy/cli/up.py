"""``escha-deploy up``: preflight, create and start the server container, wait until it
really serves, check the logged sizes against the plan. Exit 3 at preflight (nothing
created, also when another `up` is starting the profile), 4 when the server fails, is
stopped by `down` or is not ready in time, 128 + N when signal N (Ctrl-C: SIGINT, 130)
interrupts the wait: the container is then stopped and kept for `logs`."""

from __future__ import annotations

from typing import TYPE_CHECKING, Annotated, Optional

import typer

from .options import DEFAULT_PROFILE, DryRunOpt, FactsOpt, FormatOpt, OutputFormat, ProfileOpt, SetOpt, number_option

if TYPE_CHECKING:
    from escha_deploy.profile import Profile

#: The prompt `up` suggests to `escha-deploy ask`.
FIRST_ASK = "Say hello in five words."

EXAMPLES = """
Examples:

  escha-deploy up --profile rtx5060ti-tp2-fp8 --detach

  escha-deploy up --profile rtx5060ti-tp2-fp8 --dry-run --format json

  escha-deploy up --profile rtx5060ti-tp2-fp8 --facts box.json --dry-run
"""


def register(app: typer.Typer) -> None:
    from .app import PANEL_LIFECYCLE

    @app.command("up", rich_help_panel=PANEL_LIFECYCLE, epilog=EXAMPLES)
    def up(
        profile: ProfileOpt = DEFAULT_PROFILE,
        set_: SetOpt = None,
        facts: FactsOpt = None,
        dry_run: DryRunOpt = False,
        build: Annotated[bool, typer.Option("--build", help="Build the image first when absent.")] = False,
        detach: Annotated[bool, typer.Option(
            "--detach", "-d", help="Return once ready, leaving the server running (restart policy "
            "on-failure) until `escha-deploy down`. Default: follow the log once ready; Ctrl-C or "
            "SIGTERM then stops and removes the container.")] = False,
        timeout: Annotated[Optional[float], typer.Option(
            "--timeout", help="Seconds to wait for ready (default: container.ready_timeout_s).",
            parser=number_option(1, 7 * 24 * 3600))] = None,
        format: FormatOpt = OutputFormat.table,
        canary: Annotated[bool, typer.Option(
            "--canary", help="Once ready, run the hybrid-restore canary (bench.canary): exit 3 on a "
            "mismatch, 5 when no host-tier hit proves the answer; the server keeps running.")] = False,
    ) -> None:
        """Start the server for a profile and wait until it serves.

        Ctrl-C (or SIGTERM) while waiting for ready stops the container (SIGTERM, the stop
        timeout, then SIGKILL) and keeps it, stopped, for `escha-deploy logs`; exit 130 (143).
        A second `up` of the same profile meanwhile exits 3; `down` meanwhile wins (exit 4).

        --dry-run runs every preflight check that needs no container, prints each one (ok,
        failed, not needed, not run) and exits as `up` would (3 refused, 2 bad input); it
        creates nothing.
        """
        from escha_deploy.doctor.doctor_probe import doctor_in_image
        from escha_deploy.launch.up import up as start

        from .output import info, report

        overrides = list(set_ or [])
        if dry_run:
            print_dry_run(profile, overrides, facts, format, build=build)
            return
        from escha_deploy.launch import guard

        # One signal scope from the first daemon call to the end of the follow: a SIGINT or
        # SIGTERM at any moment stops what this `up` started (never the default action,
        # which would leave a ready container running with its restart policy on-failure).
        mine = guard.Ready()
        follow = False
        try:
            with guard.signals_raise(report):
                try:
                    from escha_deploy.profile import load_profile

                    # loaded once: `up` plans it, --canary reads its API key file
                    prof = load_profile(profile, overrides)
                    res = start(profile, overrides, timeout_s=timeout, build=build, report=report,
                                facts_path=facts, ready=mine, loaded=prof, doctor_probe=doctor_in_image)
                    follow = not detach and mine.container is not None
                    _print_result(res, format, prof)
                    from .profiles import say_where_read

                    say_where_read(profile, "up")  # once it runs: an error before stays one line
                    if canary:
                        _canary(res.endpoint, prof)
                    if follow:
                        from escha_deploy.launch import manage

                        manage.logs(res.profile, follow=True, tail=0)
                except guard.Signalled as exc:
                    sig = guard.signal_name(exc.signum)
                    if mine.container is None:  # before the create (after it, `up` itself stops it)
                        raise guard.Interrupted(exc.signum, f"up: interrupted by {sig} before the container "
                                                "was created; nothing was started") from None
                    if detach:
                        raise guard.Interrupted(exc.signum, f"up: interrupted by {sig} after {mine.container} "
                                                "was ready; --detach leaves it running",
                                                hint="`escha-deploy down --profile ...` stops it") from None
                    follow = True  # between ready and the follow, as during it: stop and remove
                    info(f"up: {sig}: stopping and removing {mine.container}")
                finally:
                    if follow:
                        from escha_deploy.launch import manage

                        with guard.signals_deferred(report, f"up: still stopping {mine.container}",
                                                    then_obey=False):
                            stopped = manage.down(_profile_name(profile, overrides))
                        info("up: " + (", ".join(stopped) + " stopped and removed" if stopped
                                       else "nothing left running"))
        except guard.Signalled as exc:  # between the scope's first lines: nothing to stop yet
            raise guard.Interrupted(exc.signum, f"up: interrupted by {guard.signal_name(exc.signum)}") from None


def _profile_name(profile: str, overrides: list[str]) -> str:
    from escha_deploy.profile import profile_name

    return profile_name(profile, overrides) or profile


def _print_result(res, fmt: OutputFormat, prof: Profile) -> None:
    """The ready server: one line on stdout (or the JSON object), then on stderr the first
    request to send (``launch.first_request``: curl and the OpenAI client, the key read from its
    file); the JSON carries it as ``first_request`` (``curl``, ``python``)."""
    from escha_deploy.launch.first_request import for_profile

    from .output import info, print_json

    first = for_profile(prof, res.endpoint)
    if fmt is OutputFormat.json:
        print_json({**res.__dict__, "first_request": {"curl": first.curl, "python": first.python}})
    else:
        info(f"up: {res.note}" if res.note else f"up: ready in {res.ready_seconds:.1f} s")
        typer.echo(f"{res.profile}\t{res.state}\t{res.endpoint}\t{res.container}")
        for line in first.lines():
            info(line)
        info(f'or: escha-deploy ask -p {prof.name} "{FIRST_ASK}"')


def _canary(endpoint: str, prof: Profile) -> None:
    """``--canary``: the hybrid-restore canary against the ready server (it keeps running);
    ``prof``: the profile `up` started."""
    from escha_deploy.bench.canary import canary_check
    from escha_deploy.launch.prepare import read_secret

    from .output import info

    key = (read_secret(prof.container.api_key_file, "container.api_key_file")
           if prof.container.api_key_file else None)
    info(f"up: running the restore canary against {endpoint}")
    canary_check(endpoint, step=lambda s: info(f"canary: {s}"), api_key=key)  # the one "canary: " prefix


def print_dry_run(profile: str, overrides: list[str], facts: str | None, fmt: OutputFormat, *,
                  build: bool = False) -> None:
    """``up --dry-run``'s output for ``profile`` with ``overrides`` (``--set`` items) and an
    optional facts file: the facts the plan used and their sources, the verdict and reasons,
    warnings, the docker-py create arguments, the server argv and `up`'s preflight checks (or
    the same as JSON); then the error `up` would raise (exit 3 refused, 2 bad input) with every
    failed check. ``launch.up.dry_run`` runs the checks: nothing is created, no spec file
    written, nothing built (``build``: an absent image is not refused, `up --build` builds it).
    ``fleet up --box NAME --dry-run`` calls this too, with the box's profile and ``set``."""
    from escha_deploy.launch.up import dry_run

    from .output import info, print_json

    dry = dry_run(profile, overrides, build=build, facts_path=facts)
    err = dry.error()
    if dry.prep is None:  # bad input: no plan to show, but every check reached and the rest, named
        assert err is not None
        checks = dry.all_checks()
        if fmt is OutputFormat.json:
            print_json({"profile": profile, "verdict": None, "refusals": [p for e in dry.errors for p in e.problems],
                        "checks": checks})
        else:
            _print_checks(checks, "# up's preflight checks (no plan: the error below comes first)")
        raise err
    from escha_deploy.launch.first_request import endpoint_of, for_profile

    data = dry.data()
    spec = dry.prep.spec
    first = for_profile(dry.prep.profile, endpoint_of(spec.port_host_ip, spec.port_host))
    if fmt is OutputFormat.json:
        print_json({**data, "first_request": {"curl": first.curl, "python": first.python}})
    else:
        import shlex

        import yaml

        for w in data["warnings"]:
            info(f"warning: {w}")
        typer.echo("# facts the plan used, and where each came from")
        for f in data["facts"]:
            typer.echo(f"#   {f['fact']}: {f['value']}  [{f['source']}]")
        typer.echo(f"# verdict {data['verdict']}, plan digest {data['plan_digest']}")
        for r in data["reasons"]:
            typer.echo(f"#   - {r}")
        typer.echo("# container (docker-py containers.create arguments)")
        typer.echo(yaml.safe_dump(data["container"], sort_keys=False).rstrip())
        from escha_deploy.pipeline.spec import SPEC_TARGET

        typer.echo(f"# server argv (inside the container, run by `escha-deploy serve --spec {SPEC_TARGET}`)")
        typer.echo(shlex.join(data["argv"]))
        typer.echo("# server environment (set for SGLang by serve --spec, as serve --print shows it)")
        for k, v in data["env"].items():
            typer.echo(f"{k}={shlex.quote(v)}")
        _print_checks(data["checks"], "# up's preflight checks (the verdict above is the plan's)")
        typer.echo("# once `up` is ready, the " + first.lines()[0].removesuffix(":"))
        typer.echo(first.curl)
    for w in dry.warnings():
        info(f"warning: {w}")
    if err is not None:
        raise err


def _print_checks(checks: list[dict], title: str) -> None:
    """``up --dry-run``'s check table on stdout: one line per check, its state and why."""
    typer.echo(title)
    for c in checks:
        why = "; ".join(c["problems"]) or c["detail"]
        typer.echo(f"#   {c['state']:<10} {c['name']}" + (f": {why}" if why else ""))
