"""Decide: ``planner.plan`` (pure) on the gathered facts for the chosen runtime, and the flag
check of the one argv rendered (``check_rendered_argv``; ``BadArgv``, exit 2)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from escha_deploy.utils.errors import BadInput
from escha_deploy.pipeline.rendering import render

if TYPE_CHECKING:
    from escha_deploy.pipeline.gathering import Gathered
    from escha_deploy.pipeline.runtime import Runtime
    from escha_deploy.sglang.flagcheck import FlagCheckResult
    from escha_deploy.facts.host import HostFacts
    from escha_deploy.planner.result import ArgvCheck, Plan
    from escha_deploy.profile import Profile


class BadArgv(BadInput):
    """A flag of the rendered argv (``runtime.extra_args`` included) that the planned release's
    parser refuses: bad input (exit 2), told apart from the other bad input of a plan by
    ``compose``, which warns when this machine cannot be planned but refuses a bad argv."""


def _argv_problems(check: FlagCheckResult) -> BadArgv:
    return BadArgv(*(f"runtime.extra_args or rendered argv: {line}" for line in check.error_lines()))


def _check_extra_args(prof: Profile, runtime: Runtime) -> None:
    """Check the flags the profile adds (``runtime.extra_args``) against ``runtime``'s release's
    flag catalog plus the profile's needed capabilities' declared flags, with no plan: what a
    render without host facts can check (``plan_request`` with no facts: ``compose`` without
    ``--facts``). Raises ``BadArgv`` (exit 2) with the lines ``check_rendered_argv`` gives
    for the same flags."""
    if not prof.runtime.extra_args:
        return
    from escha_deploy.sglang.flagcheck import check_argv

    check = check_argv(list(prof.runtime.extra_args), set(prof.runtime.needs), version=runtime.release.version,
                       require_model=False)
    if check.errors:
        raise _argv_problems(check)


def check_rendered_argv(result: Plan, prof: Profile, argv: Sequence[str] | None = None) -> ArgvCheck:
    """Check the server argv of ``result`` against its release's flag catalog plus the
    capabilities' declared flags: one refusal path for ``plan``, ``up``, ``serve``,
    ``compose`` and ``fleet``. ``argv``: the argv as rendered already (a launch spec's: the
    one that runs, native or container); ``None``: rendered here (``flags.server_args``).
    Errors (an unknown flag in ``runtime.extra_args``, ...) are bad input (``BadArgv``, exit 2)."""
    from escha_deploy.sglang.flagcheck import check_argv
    from escha_deploy.pipeline.argv import server_args
    from escha_deploy.planner.result import ArgvCheck

    # flags a needed capability declares are valid here: a runtime that lacks the capability is
    # the missing-capability refusal's to name (exit 3), not a bad argv
    check = check_argv(list(argv) if argv is not None else server_args(result, prof), set(result.capabilities) | set(prof.runtime.needs),
                       version=result.sglang_release)
    if check.errors:
        raise _argv_problems(check)
    declared = [f"{u.flag} {' '.join(u.values)} ({u.capability})".replace("  ", " ") for u in check.declared()]
    return ArgvCheck(verified=len(check.flags) - len(declared), declared=declared, errors=[])


def decide(profile: Profile, g: Gathered, runtime: Runtime, *, ratio: float | None = None,
           hicache_size_gb: int | None = None, hicache_source: str | None = None, check_argv: bool = True,
           digest: bool = False) -> Plan:
    """Plan ``profile`` on the gathered facts for ``runtime`` (``resolve_runtime``: its release
    and capabilities; ``None`` capabilities: the profile's needs) and check the rendered argv
    against that release's flag catalog (``BadArgv``, exit 2, for a flag the runtime would
    refuse; ``check_argv=False``: ``plan --compare`` leaves it to the comparison, ``doctor``
    runs no server, ``plan_request`` checks the launch spec's argv instead). ``hicache_source``:
    ``planner.plan``'s, where the profile's HiCache setting came from. ``digest``: fill
    ``plan_digest`` (the container launch's, as ``up`` and ``serve`` compute it; it imports the
    launch-spec models, which a table plan does not need). Pure: reads nothing."""
    from escha_deploy.planner import plan as plan_profile

    release = runtime.release
    caps = runtime.capabilities

    def replan(host: HostFacts) -> Plan:
        return plan_profile(profile, host, model_dir=g.model_dir, draft=g.draft, ratio=ratio,
                            hicache_size_gb=hicache_size_gb, capabilities=caps, hicache_source=hicache_source,
                            release=release.version, release_source=release.source)

    result = replan(g.host)
    from escha_deploy.checkpoint import pin_state

    result = result.model_copy(update={"fact_sources": g.sources + list(runtime.facts),
                                       "model_pin": pin_state(g.model_dir.path if g.model_dir else None)})
    if result.verdict == "unsafe":
        from escha_deploy.planner.fit import host_fit

        result = result.model_copy(update={"host_fit": host_fit(profile, result, g.host, replan)})
    # the argv is rendered once: the digest's launch spec when there is one, else the check's
    spec = render(result, profile, g) if digest else None
    if check_argv:  # plan --compare leaves it to the comparison, which names the flags the release refuses
        argv = spec.argv if spec is not None else None
        result = result.model_copy(update={"argv_check": check_rendered_argv(result, profile, argv)})
    if spec is None:
        return result
    return result.model_copy(update={"plan_digest": spec.plan_digest})
