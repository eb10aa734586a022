"""``escha-deploy compose``: render compose.yaml for a profile (the same container settings
as ``up``), to stdout or a file.

Without ``--facts`` the file is machine-independent and plans nothing
(``launch.compose.compose_profile``); the profile is planned once, against this machine, as
``plan`` plans it (``pipeline.plan_here``): a verdict other than ``ok`` is said on stderr, since
``docker compose up`` here would meet it in ``serve``, and a rendered argv its release refuses
is refused (exit 2, nothing written). With ``--facts`` the plan is the box's and an unsafe one
is refused (exit 3); this machine is not planned."""

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
        """Render a docker compose file for a profile.

        The container plans against the box it runs on (`serve`). With --facts FILE (the
        box's facts) the plan is the box's: unsafe exits 3 and nothing is rendered. Without it,
        a plan of this machine that is not ok is printed as warnings on stderr (exit 0). The
        build context is the escha-deploy checkout, relative to the file's folder.
        """
        from escha_deploy.cli.output import info
        from escha_deploy.launch.compose import build_context, compose_profile, source_checkout
        from escha_deploy.utils.paths import check_output, facts_file, write_output

        overrides = list(set_ or [])
        facts, _ = facts_file(facts)  # as --facts documents, and as plan reads it
        if output:
            check_output(output, "--output")
        checkout = source_checkout()
        rendered = compose_profile(profile, overrides, facts_file=facts,
                                   context=build_context(output, checkout))
        lines = [f"compose: warning: {w}" for w in rendered.warnings]
        if not facts:
            lines += plan_here_lines(profile, overrides)
        if checkout is None:
            lines.append(
                "compose: warning: no escha-deploy checkout here (no Dockerfile.hicache in the current "
                "folder or beside the installed package), so the file has no `build:` section; build "
                f"the image from a checkout first: `escha-deploy build --hicache --context CHECKOUT "
                f"--tag {rendered.image}`")
        for line in lines:
            info(line)
        if output:
            write_output(output, rendered.text, "--output")
            info(f"compose: wrote {output}")
        else:
            typer.echo(rendered.text, nl=False)


def plan_here_lines(profile: str, overrides: list[str]) -> list[str]:
    """The stderr lines for the plan of ``profile`` on this machine (``pipeline.plan_here``, the
    call ``escha-deploy plan`` makes: same capabilities, the L3 folder checked here): none for ``ok``; for
    ``unsafe`` or ``hicache_off`` one ``compose: warning: on this machine the plan is VERDICT:
    REASON`` line per reason and a last one saying why the file was rendered anyway and what
    ``docker compose up`` would do here; one line per problem when this machine cannot be
    planned (an unreadable model folder). A rendered argv the planned release refuses
    (``pipeline.BadArgv``) is raised: the container's ``serve`` would refuse it on any box."""
    from escha_deploy.utils.errors import EschaError
    from escha_deploy.pipeline import BadArgv, BoxRuntime, facts_source, plan_here
    from escha_deploy.profile import load_profile

    try:
        here = plan_here(load_profile(profile, overrides), facts_source(), BoxRuntime()).plan
    except BadArgv:
        raise
    except EschaError as exc:
        return [f"compose: warning: cannot plan on this machine: {p}" for p in exc.problems]
    if here.verdict == "ok":
        return []
    lines = [f"compose: warning: on this machine the plan is {here.verdict}: {r}" for r in here.reasons]
    sets = "".join(f" --set {o}" for o in overrides)
    what = ("would be refused by `serve` (exit 3)" if here.verdict == "unsafe"
            else "would start SGLang without HiCache")
    lines.append(f"compose: warning: rendered anyway, as the container plans against the box it runs on; "
                 f"`docker compose up` on this machine {what} (`escha-deploy plan --profile {profile}{sets}` "
                 "shows the budget; `compose --facts FILE` renders for a box and refuses its unsafe plan)")
    return lines
