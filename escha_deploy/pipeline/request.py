"""One request: the facts source and the runtime source a command chose, planned through
``gather``, ``resolve_runtime``, ``decide`` and, for a launch, ``render`` (``plan_request``;
``plan_here`` as ``plan`` calls it), with the checks every command shares before it plans."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, overload

from escha_deploy.utils.errors import BadInput
from escha_deploy.facts.provenance import FactSource
from escha_deploy.pipeline.decision import _check_extra_args, check_rendered_argv, decide
from escha_deploy.pipeline.gathering import Gathered, gather
from escha_deploy.pipeline.rendering import render, render_container
from escha_deploy.pipeline.runtime import Runtime, resolve_runtime
from escha_deploy.pipeline.sources import BoxRuntime, FactsSource, RuntimeSource

if TYPE_CHECKING:
    from escha_deploy.pipeline.spec import ContainerSpec, LaunchSpec
    from escha_deploy.planner.result import Plan
    from escha_deploy.profile import Profile


def profile_file(ref: str) -> str | None:
    """The host path to mount when ``ref`` names a file rather than a shipped profile
    (``profile.names_a_file``: the rule ``--profile`` reads it by), the file
    ``profile.resolve_profile_path`` reads (``./good`` may be ``./good.yaml``)."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.profile import names_a_file, resolve_profile_path

    if not names_a_file(ref):
        return None
    try:
        p = resolve_profile_path(ref)
    except BadInput:
        return None
    return str(p.resolve()) if p.is_file() else None


def secret_path_problems(profile: Profile, base: Path | None = None) -> None:
    """Refuse (``BadInput``, exit 2) a secret file setting (``container.api_key_file``,
    ``container.hf_token_file``) that is neither an existing file here nor an absolute path (a
    file on the box that runs it): most likely the key itself, typed where its file's path
    goes, which every plan, dry run and compose file would otherwise print. Never printed
    whole (``shown_path``). ``base``: the folder a relative path is read against (default the
    current one; ``fleet``: the fleet file's, where it finds a box's key files)."""
    bad = []
    for key in ("api_key_file", "hf_token_file"):
        v = getattr(profile.container, key)
        if v and not v.startswith("/") and not (Path(base, v) if base is not None else Path(v)).is_file():
            bad.append(f"container.{key}: {shown_path(v)} is neither an existing file nor an absolute path")
    if bad:
        raise BadInput(*bad, hint="give the path of a file whose one line is the key, never the key itself")


def shown_path(path: str) -> str:
    """How a path that is not an existing file is printed: never whole (a key typed where its
    file's path goes, ``container.api_key_file=KEY``, would otherwise be echoed), only its
    length and first 3 characters."""
    return f"the path given ({len(path)} characters, starting {path[:3]!r}; not shown whole)"


def hicache_off_warning(plan: Plan) -> str | None:
    """The one warning a launch gives when the plan turned HiCache off (verdict ``hicache_off``:
    the server is launchable without it), the same line from ``up`` (``launch/prepare.py``),
    ``serve --profile`` (``launch/serve.py``) and ``compose --facts`` (``launch/compose.py``):
    ``plan: HiCache is off (REASONS)``, the plan's reasons joined by ``; ``. None for any other
    verdict."""
    if plan.verdict != "hicache_off":
        return None
    return "plan: HiCache is off (" + "; ".join(plan.reasons) + ")"


class LaunchOptions(NamedTuple):
    """What a launch renders besides the plan (``launch_spec.build_launch_spec``'s keywords):
    ``overrides`` (``--set`` items the container's ``serve`` gets), ``native`` (the server runs
    on this host: host paths, loopback), ``profile_file`` (a profile file to mount),
    ``spec_file`` (where ``up`` writes the spec), ``facts_file`` (a facts file the container
    plans from)."""

    overrides: tuple[str, ...] = ()
    native: bool = False
    profile_file: str | None = None
    spec_file: str | None = None
    facts_file: str | None = None


class Options(NamedTuple):
    """How a request plans: ``ratio``/``hicache_size_gb``/``hicache_source`` (``plan``'s
    ``--ratio``, ``--hicache-size`` and where the HiCache setting came from), ``check_argv``
    (check the rendered argv against the release's flag catalog; ``plan --compare`` and
    ``doctor`` do not), ``digest`` (fill the plan's ``plan_digest``: ``plan --format json``,
    ``fleet``), ``launch`` (render the ``LaunchSpec``: ``up``, ``serve``, ``compose --facts``;
    ``None``: a plan alone)."""

    ratio: float | None = None
    hicache_size_gb: int | None = None
    hicache_source: str | None = None
    check_argv: bool = True
    digest: bool = False
    launch: LaunchOptions | None = None


class Request(NamedTuple):
    """A planned request: the ``gathered`` facts, the ``runtime`` chosen, the ``plan`` (its
    ``argv_check`` read from the one argv rendered), the ``launch`` spec (``None`` without
    ``Options.launch``), and one list each of ``refusals`` (exit 3: the L3 directory's
    problems, an unsafe plan's ``plan: REASON`` lines, a capability the binding runtime lacks)
    and ``warnings`` (the HiCache-off line, the runtime's notes, the plan's warnings)."""

    gathered: Gathered
    runtime: Runtime
    plan: Plan
    launch: LaunchSpec | None
    refusals: tuple[str, ...]
    warnings: tuple[str, ...]


@overload
def plan_request(profile: Profile, facts: FactsSource, runtime: RuntimeSource,
                 options: Options = ...) -> Request: ...


@overload
def plan_request(profile: Profile, facts: None, runtime: RuntimeSource, options: Options = ...) -> ContainerSpec: ...


def plan_request(profile: Profile, facts: FactsSource | None, runtime: RuntimeSource,
                 options: Options = Options()) -> Request | ContainerSpec:
    """The one path every command plans by: ``gather`` (from ``facts``), ``resolve_runtime``
    (from ``runtime``; its one call site), ``decide``, and for a launch ``render``; the server
    argv is rendered once (for a launch: the spec's, which the flag check then reads; for a
    plan: the digest's, or the check's alone). Raises ``BadInput`` (exit 2: bad facts, a flag
    the release refuses: ``BadArgv``) and ``Refused`` (exit 3: releases that contradict each
    other); never for an unsafe plan or an L3 problem (``Request.refusals``).

    ``facts=None``: no host facts, so no plan (``compose`` without ``--facts``: the container
    plans for itself on the box it runs on): the profile's ``runtime.extra_args`` are checked
    against the runtime's release (``BadArgv``) and the container half is returned
    (``render_container``, with ``Options.launch``'s overrides and profile file)."""
    g = gather(profile, facts) if facts is not None else None
    rt = resolve_runtime(profile, g, runtime)
    if g is None:
        _check_extra_args(profile, rt)
        co = options.launch or LaunchOptions()
        return render_container(profile, overrides=co.overrides, profile_file=co.profile_file)
    plan = decide(profile, g, rt, ratio=options.ratio, hicache_size_gb=options.hicache_size_gb,
                  hicache_source=options.hicache_source, check_argv=options.check_argv and options.launch is None,
                  digest=options.digest and options.launch is None)
    over = _platform_over_file(facts, g)
    if rt.notes or over:
        plan = plan.model_copy(update={"warnings": over + list(rt.notes) + list(plan.warnings)})
    from escha_deploy.sglang.releases import late_check_review

    if review := late_check_review(rt.release.version):
        plan = plan.model_copy(update={"warnings": list(plan.warnings) + [review]})
    if g.findings is not None and (stale := g.findings.driver_changed(
            g.host.gpus.driver_version if g.host.gpus is not None else None)):
        plan = plan.model_copy(update={"warnings": [f"doctor's saved findings were {stale}"] + list(plan.warnings)})
    launch = None
    if (lo := options.launch) is not None:
        sources = list(plan.fact_sources)
        if rt.where is not None:
            sources.append(FactSource(fact="capabilities", value=", ".join(sorted(plan.capabilities)) or "none",
                                      source=rt.where, kind=rt.kind))
        launch = render(plan, profile, g, overrides=lo.overrides, native=lo.native, profile_file=lo.profile_file,
                        sources=sources, spec_file=lo.spec_file, facts_file=lo.facts_file)
        if options.check_argv:  # the argv that runs, as rendered once
            plan = plan.model_copy(update={"argv_check": check_rendered_argv(plan, profile, launch.argv)})
        if options.digest:  # the launch's digest: what decide's would be (overrides and paths are not in it)
            plan = plan.model_copy(update={"plan_digest": launch.plan_digest})
    refusals = list(g.l3_refusals) + (plan.refusal_lines() if plan.verdict == "unsafe" else []) \
        + rt.lacking(profile)
    off = hicache_off_warning(plan)
    warnings = ([off] if off else []) + list(plan.warnings)
    return Request(g, rt, plan, launch, tuple(refusals), tuple(warnings))


def _platform_over_file(facts: FactsSource | None, g: Gathered) -> list[str]:
    """The line that says ``--wsl2``/``--linux`` overrode a facts file that says the other: the
    option wins (``FactsFileHost.platform``), but not without a word."""
    from escha_deploy.pipeline.sources import FactsFileHost

    ff = g.facts_file
    if not isinstance(facts, FactsFileHost) or facts.platform is None or ff is None \
            or ff.host.platform == facts.platform:
        return []
    return [f"--{facts.platform}: {facts.named} {facts.path} says the host is {ff.host.platform}; "
            f"planned for {facts.platform}, as the option says"]


def plan_here(profile: Profile, facts: FactsSource, runtime: BoxRuntime, options: Options = Options()) -> Request:
    """``plan_request`` as ``escha-deploy plan`` plans (``compose`` and ``diagnose`` plan this
    machine through it too, so all reach one verdict): the file L3 directory's problems, when
    the server would run here, make the plan unsafe, with those problems first among its
    reasons (``up`` would refuse before start, exit 3). A secret file setting that is no file
    here is refused first (``secret_path_problems``, exit 2)."""
    secret_path_problems(profile)
    req = plan_request(profile, facts, runtime, options)
    if not req.gathered.l3_refusals:
        return req
    result = req.plan
    reasons = list(req.gathered.l3_refusals) + (result.reasons if result.verdict == "unsafe" else [])
    plan = result.model_copy(update={"verdict": "unsafe", "reasons": reasons})
    return Request(req.gathered, req.runtime, plan, req.launch, req.refusals, req.warnings)
