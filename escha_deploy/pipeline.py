"""One planning pipeline for every command that plans: ``plan``, ``up``, ``up --dry-run``,
``serve``, ``compose`` and every ``fleet`` verb.

    gather(facts sources) -> decide(profile, facts, runtime) -> Plan -> render(Plan) -> LaunchSpec

- ``gather``: the host facts (this machine, a described host, or a facts file), the model
  folder, the GPU records, and where each came from (``Gathered``).
- ``decide``: ``planner.plan`` on the gathered facts for a runtime (its capabilities and SGLang
  release), then the rendered argv checked against that release's flag catalog
  (``check_rendered_argv``); an unsafe plan is returned, never raised: each caller refuses it
  with ``Plan.refusal_lines``.
- ``render``: the ``LaunchSpec`` (argv, env, container settings, digest) of a plan and the
  facts it assumed (``launch_facts``). ``render_container``: the container half of a profile's
  launch alone, for a compose file planned by the container it starts (no host facts needed).

``make_plan``/``plan_here`` are the three steps as ``escha-deploy plan`` (and ``compose``'s
plan of this machine) calls them; ``launch.prepare.prepare`` (``up``, ``up --dry-run``),
``launch.serve.serve``, ``launch.compose.compose_profile`` and ``fleet.plan.plan_box`` call the
steps with their own facts sources and runtime. I/O stays at the edges: ``gather`` reads files
(and NVML), ``decide`` and ``render`` are pure. Heavy models are imported inside the functions
that need them, so a table plan never imports the launch-spec models.
"""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from escha_deploy.errors import BadInput
from escha_deploy.facts.provenance import FactSource, ProvenanceKind

if TYPE_CHECKING:
    from escha_deploy.arch import DraftFacts, ModelDirFacts
    from escha_deploy.facts.file import FactsFile
    from escha_deploy.facts.gpus import GpuRecord
    from escha_deploy.facts.host import Platform
    from escha_deploy.facts.runtime import RuntimeFacts
    from escha_deploy.flagcheck import FlagCheckResult
    from escha_deploy.facts.host import HostFacts
    from escha_deploy.launch_spec import ContainerSpec, LaunchFacts, LaunchSpec
    from escha_deploy.planner.result import ArgvCheck, Plan
    from escha_deploy.profile import Profile
    from escha_deploy.releases import ReleaseChoice
    from escha_deploy.runtime.description import RuntimeDescription


def profile_file(ref: str) -> str | None:
    """The host path to mount when ``ref`` names a file rather than a shipped profile
    (``profile.names_a_file``: the rule ``--profile`` reads it by), the file
    ``profile.resolve_profile_path`` reads (``./good`` may be ``./good.yaml``)."""
    from escha_deploy.errors import BadInput
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


class Gathered:
    """The plan's inputs besides the profile, and where each came from.

    ``host``: the host facts (live, described, or from a facts file); ``model_dir``: what the
    model folder says (``None`` when it is not here); ``gpus``: per-GPU records (from a facts
    file; empty otherwise); ``facts``: one ``facts.provenance.FactSource`` per fact, for
    ``up --dry-run`` and the launch spec (``sources``); ``runtime``: the box's runtime (SGLang
    release, capabilities: ``facts.runtime.RuntimeFacts``) as the facts file's ``runtime``
    section gives it (``None``: not described), with ``runtime_where`` naming that section;
    ``facts_file``: the facts file as read (``factsfile.load_facts_file``, once), ``None``
    without one (``fleet`` keeps it for the checks only a fleet has: a WSL2 node's networking
    mode, one image digest per instance); ``draft``: what ``model.draft``'s folder says
    (``arch.DraftFacts``; ``None`` without the key or the folder here).
    """

    def __init__(self, host: HostFacts, model_dir: ModelDirFacts | None, gpus: list[GpuRecord],
                 facts: list[FactSource], runtime: RuntimeFacts | None = None, runtime_where: str = "",
                 facts_file: FactsFile | None = None, draft: DraftFacts | None = None) -> None:
        self.host = host
        self.model_dir = model_dir
        self.draft = draft
        self.gpus = gpus
        self.facts = facts
        self.runtime = runtime
        self.runtime_where = runtime_where
        self.facts_file = facts_file

    @property
    def sources(self) -> list[FactSource]:
        """Where each fact came from, in order (``facts``, as the launch spec carries them)."""
        return list(self.facts)


def _fmt_bytes(n: int | None) -> str:
    from escha_deploy.units import fmt_gib

    return "-" if n is None else f"{n:,} B ({fmt_gib(n)})"


def gather(profile: Profile, *, facts_path: str | None = None, platform: Platform | None = None,
           host_ram: int | None = None, model_path: str | None = None, draft_path: str | None = None,
           l3_path: str | None = None,
           check_here: bool | None = None, origin: str | None = None, env_facts: bool = True,
           secret_paths: bool = True, findings: bool = True, facts_what: str = "the facts file",
           facts_hint: str | None = None, l3_refusals: list[str] | None = None) -> Gathered:
    """Gather the plan's inputs one way for ``plan``, ``up``, ``serve``, ``compose`` and ``fleet``.

    ``facts_path``: a facts file (``--facts``; ``ESCHA_FACTS`` when not given): the host and
    findings come from it, nothing else of this machine is read but the model folder and the
    L3 directory's free space. Otherwise: ``host.gather_plan_inputs`` (this machine, with
    doctor's saved findings, or ``host_ram`` for a described host). ``model_path``: the model
    folder as this process sees it (``model.path`` inside the container); ``draft_path`` the
    draft's folder (``model.draft.path`` there; ``host.read_draft_inputs``); ``l3_path`` the L3
    directory likewise. ``check_here``: the server runs on this machine (``up``, ``serve``),
    so the L3 directory is checked here (``folders.check_l3_dir``); default: only for a plan of
    this host (not ``--host-ram``, not a facts file). The GPU records are NVML's (measured now)
    or the facts file's. Raises ``BadInput`` for an unreadable facts file, config.json or a model
    folder without config.json or weights, ``Refused`` for an unusable L3 directory.
    ``origin``: where a described host's memory was written (``fleet``: the fleet file's
    ``host_ram`` line), shown in the plan's reasons instead of ``--host-ram``. ``env_facts``:
    read ``ESCHA_FACTS`` when no ``facts_path`` is given (``fleet`` names each box's facts
    itself, so it passes False). ``secret_paths``: refuse a secret file setting that is no file
    here (``secret_path_problems``); ``fleet`` checks a box's key files against the fleet
    file's folder itself, and passes False. ``findings``: read doctor's saved findings for this
    machine (pinned ceiling, allocator, last prefill); ``doctor`` passes False, so that a
    ceiling once seen can be measured again. ``facts_what``/``facts_hint``: how the facts
    file is named in its reader's messages, and how to make a good one (``fleet``: a box's
    saved facts). ``l3_refusals``: a list that collects the L3 directory's refusals instead of
    raising them (``host.gather_plan_inputs``).
    """
    if secret_paths:
        secret_path_problems(profile)
    # the facts-file and findings models are imported only on the paths that read them
    from escha_deploy.host import gather_plan_inputs
    from escha_deploy.paths import doctor_findings_path, facts_file

    facts_path, named = facts_file(facts_path) if env_facts or facts_path else (None, "--facts")
    if facts_path and host_ram is not None:
        raise BadInput(f"{named} and --host-ram are mutually exclusive (the facts file describes the host)")
    sources: list[FactSource] = []
    gpus: list[GpuRecord] = []
    if facts_path:
        from escha_deploy.factsfile import load_facts_file

        try:
            ff = load_facts_file(facts_path, facts_what, hint=facts_hint)
        except BadInput as exc:
            if named == "--facts":
                raise
            raise BadInput(*(named + p[len(facts_path):] if p.startswith(f"{facts_path}:") else f"{named}: {p}"
                             for p in exc.problems), hint=exc.hint) from None
        host_only, model_dir = gather_plan_inputs(profile, host_ram=ff.host.mem_total_bytes,
                                                  platform=platform or ff.host.platform, model_path=model_path,
                                                  l3_path=l3_path, check_here=bool(check_here),
                                                  l3_refusals=l3_refusals)
        f = ff.findings
        l3 = profile.hicache.storage_dir if profile.hicache.storage_backend_is_file else None
        host = ff.host_facts(platform=platform, l3_dir=l3, l3_free_bytes=host_only.l3_free_bytes if l3 else None,
                             l3_checked=host_only.l3_checked)
        gpus = list(ff.gpus)
        where = f"facts file {facts_path}"
        sources += [FactSource(fact="platform", value=host.platform, source=where if platform is None else
                               "--wsl2/--linux", kind="facts_file" if platform is None else "command_line"),
                    FactSource(fact="MemTotal", value=_fmt_bytes(host.mem_total_bytes), source=where,
                               kind="facts_file"),
                    FactSource(fact="cgroup memory limit", value=_fmt_bytes(host.cgroup_limit_bytes), source=where,
                               kind="facts_file")]
        fsrc = where + (f" (doctor findings of {f.created_at})" if f else "")
        fkind: ProvenanceKind = "facts_file"
    else:
        host, model_dir = gather_plan_inputs(profile, platform=platform, host_ram=host_ram, model_path=model_path,
                                             l3_path=l3_path, check_here=check_here, use_findings=findings,
                                             l3_refusals=l3_refusals)
        if origin is not None:
            host = host.model_copy(update={"origin": origin})
        if host.gpus is not None:
            from escha_deploy.facts.file import records_from_inventory

            gpus = records_from_inventory(host.gpus)
        live = host.source == "live"
        where = "measured now (/proc/meminfo, the cgroup files)" if live else origin or "--host-ram"
        described: ProvenanceKind = "command_line" if origin is None else "fleet_file"
        sources += [FactSource(fact="platform", value=host.platform,
                               source="--wsl2/--linux" if platform else "measured now (/proc/version)",
                               kind="command_line" if platform else "proc"),
                    FactSource(fact="MemTotal", value=_fmt_bytes(host.mem_total_bytes), source=where,
                               kind="proc" if live else described),
                    # a described host has no cgroup limit unless the description gives one
                    FactSource(fact="cgroup memory limit", value=_fmt_bytes(host.cgroup_limit_bytes), source=where,
                               kind="cgroup" if live else described)]
        f = None
        fsrc = "none"
        fkind = "findings"
        if host.source == "live" and findings:
            from escha_deploy.facts.findings import MAX_AGE
            from escha_deploy.findings import load_findings

            f = load_findings(doctor_findings_path(), host_id=host.host_id)
            if f is not None:
                age = f.age()
                hours = age.total_seconds() / 3600
                fresh = age < MAX_AGE
                fsrc = (f"saved doctor findings, {hours:.1f} h old ({doctor_findings_path()})" if fresh else
                        f"saved doctor findings, {hours:.1f} h old: older than {MAX_AGE.days} day; "
                        "`escha-deploy doctor --fresh` measures again")
    if host.pinned_ceiling_bytes is not None and (f is not None):
        sources.append(FactSource(fact="pinned ceiling per process",
                                  value=_fmt_bytes(host.pinned_ceiling_bytes)
                                  + ("" if host.pinned_ceiling_reached else " (no pin failed: not a ceiling)"),
                                  source=fsrc, kind=fkind))
    else:
        sources.append(FactSource(fact="pinned ceiling per process", value="unmeasured",
                                  source="no doctor findings for this host; `escha-deploy doctor` measures it"
                                  if host.source == "live" else "not in the facts" if facts_path
                                  else f"{origin or '--host-ram'}: doctor findings describe this machine, "
                                  "not the described one",
                                  kind="unmeasured"))
    sources.append(FactSource(fact="host allocator", value=host.host_allocator or "auto",
                              source=fsrc if host.host_allocator else "default (the runtime picks)",
                              kind=fkind if host.host_allocator else "default"))
    if model_dir is not None:
        # read now from the folder's config.json and safetensors headers
        value = (_fmt_bytes(model_dir.tensor_bytes) + " of tensors (safetensors headers)" if model_dir.tensor_bytes
                 else _fmt_bytes(model_dir.safetensors_bytes) + " of safetensors files")
        sources.append(FactSource(fact="model", value=value, source=f"the model folder {model_dir.path}",
                                  kind="measurement"))
    else:
        from escha_deploy.planner import profile_weights_per_rank

        per_rank, wsrc = profile_weights_per_rank(profile)
        sources.append(FactSource(fact="model", value=_fmt_bytes(per_rank) + " per rank",
                                  source=f"profile ({wsrc}, model.architecture): no model folder here", kind="profile"))
    sources.append(FactSource(fact="GPUs", value=str(len(gpus)) + " described" if gpus else "not described",
                              source=(f"facts file {facts_path}" if facts_path else "NVML, measured now") if gpus
                              else "profile (runtime.tp_size)",
                              kind=("facts_file" if facts_path else "nvml") if gpus else "profile"))
    from escha_deploy.host import read_draft_inputs

    draft = read_draft_inputs(profile, draft_path=draft_path, model_path=model_path)
    if draft is not None:
        sources.append(FactSource(fact="draft model", value=_fmt_bytes(draft.weights_bytes) + (
            " of MTP tensors" if draft.own_folder else " of safetensors") + f", {draft.num_layers or '?'} layers",
            source=f"the draft folder {draft.path}", kind="measurement"))
    runtime = ff.runtime if facts_path else None
    return Gathered(host, model_dir, gpus, sources, runtime=runtime,
                    runtime_where=f"facts file {facts_path} runtime" if runtime is not None else "",
                    facts_file=ff if facts_path else None, draft=draft)


class BadArgv(BadInput):
    """A flag of the rendered argv (``runtime.extra_args`` included) that the planned release's
    parser refuses: bad input (exit 2), told apart from the other bad input of a plan by
    ``compose``, which warns when this machine cannot be planned but refuses a bad argv."""


def _argv_problems(check: FlagCheckResult) -> BadArgv:
    return BadArgv(*(f"runtime.extra_args or rendered argv: {line}" for line in check.error_lines()))


def check_extra_args(prof: Profile) -> None:
    """Check the flags the profile adds (``runtime.extra_args``) against its release's flag
    catalog (``releases.choose_release`` on ``runtime.sglang_version``) plus the profile's
    needed capabilities' declared flags, with no plan: what a render without host facts can
    check (``compose`` without ``--facts``). Raises ``BadArgv`` (exit 2) with the lines
    ``check_rendered_argv`` gives for the same flags."""
    if not prof.runtime.extra_args:
        return
    from escha_deploy.flagcheck import check_argv
    from escha_deploy.releases import choose_release

    check = check_argv(list(prof.runtime.extra_args), set(prof.runtime.needs),
                       version=choose_release(profile=prof.runtime.sglang_version).version, require_model=False)
    if check.errors:
        raise _argv_problems(check)


def render_container(profile: Profile, *, overrides: Sequence[str] = (), profile_file: str | None = None,
                     platform: str = "linux") -> ContainerSpec:
    """The container half of ``profile``'s launch with no plan and no host facts
    (``launch_spec.container_spec``): for a compose file, whose container plans for itself
    (``serve --profile``) on the box it runs on. The one fact it takes is the ``platform``
    Docker runs on (default Linux: GPUs by device id; a WSL2 box's file is rendered from its
    facts file, ``compose --facts``); no plan digest label."""
    from escha_deploy.launch_spec import container_spec

    return container_spec(profile, platform=platform, overrides=overrides, profile_file=profile_file)


def check_rendered_argv(result: Plan, prof: Profile) -> ArgvCheck:
    """Render the server argv for ``result`` and check it against the flag catalog plus the
    capabilities' declared flags: one refusal path for ``plan``, ``up``, ``serve`` and
    ``compose``. Errors (an unknown flag in ``runtime.extra_args``, ...) are bad input (exit 2)."""
    from escha_deploy.flagcheck import check_argv
    from escha_deploy.flags import server_args
    from escha_deploy.planner.result import ArgvCheck

    # flags a needed capability declares are valid here: a runtime that lacks the capability is
    # the missing-capability refusal's to name (exit 3), not a bad argv
    check = check_argv(server_args(result, prof), set(result.capabilities) | set(prof.runtime.needs),
                       version=result.sglang_release)
    if check.errors:
        raise _argv_problems(check)
    declared = [f"{u.flag} {' '.join(u.values)} ({u.capability})".replace("  ", " ") for u in check.declared()]
    return ArgvCheck(verified=len(check.flags) - len(declared), declared=declared, errors=[])


def decide(profile: Profile, g: Gathered, *, capabilities: Collection[str] | None = None,
           ratio: float | None = None, hicache_size_gb: int | None = None,
           hicache_source: str | None = None, release: ReleaseChoice | None = None, check_argv: bool = True,
           digest: bool = False) -> Plan:
    """Plan ``profile`` on the gathered facts and check the rendered argv against the flag
    catalog (``BadInput``, exit 2, for a flag the runtime would refuse). ``capabilities``: the
    runtime's (default: the profile's needs, as an image built for it provides). ``hicache_source``:
    ``planner.plan``'s, where the profile's HiCache setting came from. ``release``: the
    ``releases.ReleaseChoice`` to plan (default: the profile's ``runtime.sglang_version``, else
    the default release); its parser checks the argv (``check_argv``: ``plan --compare`` leaves it
    to the comparison). ``digest``: fill ``plan_digest`` (the container launch's, as ``up`` and
    ``serve`` compute it; it imports the launch-spec models, which a table plan does not need)."""
    from escha_deploy.planner import plan as plan_profile
    from escha_deploy.releases import choose_release

    release = release or choose_release(profile=profile.runtime.sglang_version)
    result = plan_profile(profile, g.host, model_dir=g.model_dir, draft=g.draft, ratio=ratio,
                          hicache_size_gb=hicache_size_gb,
                          capabilities=None if capabilities is None else frozenset(capabilities),
                          hicache_source=hicache_source, release=release.version, release_source=release.source)
    from escha_deploy.checkpoint.lock import pin_state

    result = result.model_copy(update={"fact_sources": g.sources,
                                       "model_pin": pin_state(g.model_dir.path if g.model_dir else None)})
    if result.verdict == "unsafe":
        from escha_deploy.planner.fit import host_fit

        def replan(host: HostFacts) -> Plan:
            return plan_profile(profile, host, model_dir=g.model_dir, draft=g.draft, ratio=ratio,
                                hicache_size_gb=hicache_size_gb,
                                capabilities=None if capabilities is None else frozenset(capabilities),
                                hicache_source=hicache_source, release=release.version,
                                release_source=release.source)

        result = result.model_copy(update={"host_fit": host_fit(profile, result, g.host, replan)})
    if check_argv:  # plan --compare leaves it to the comparison, which names the flags the release refuses
        result = result.model_copy(update={"argv_check": check_rendered_argv(result, profile)})
    if not digest:
        return result
    return result.model_copy(update={"plan_digest": render(result, profile, g).plan_digest})


def render(plan: Plan, profile: Profile, g: Gathered, *, overrides: Sequence[str] = (), native: bool = False,
           profile_file: str | None = None, sources: Sequence[FactSource] = (), spec_file: str | None = None,
           facts_file: str | None = None) -> LaunchSpec:
    """The ``LaunchSpec`` of ``plan`` (``launch_spec.build_launch_spec``, pure) with the fact
    values it assumed (``launch_facts``): the digest ``up`` labels the container with, ``serve
    --print`` shows and ``plan --format json`` carries for the same facts. ``sources``: where
    each fact came from (``up --dry-run`` lists them; not in the digest). The other keywords are
    ``build_launch_spec``'s."""
    from escha_deploy.launch_spec import build_launch_spec

    return build_launch_spec(plan, profile, overrides=list(overrides), native=native, profile_file=profile_file,
                             facts=launch_facts(plan, g), sources=sources, spec_file=spec_file,
                             facts_file=facts_file)


def plan_launch(profile: Profile, g: Gathered, *, capabilities: Collection[str] | None = None,
                release: ReleaseChoice | None = None, capabilities_source: str | None = None,
                capabilities_kind: ProvenanceKind = "profile",
                overrides: Sequence[str] = (), native: bool = False, profile_file: str | None = None,
                spec_file: str | None = None, facts_file: str | None = None) -> tuple[Plan, LaunchSpec]:
    """``decide`` then ``render`` for a launch (``up``, ``serve --profile``, ``compose --facts``):
    the plan of ``profile`` on ``g`` for the runtime (``capabilities``, ``release``) and its
    ``LaunchSpec``, whose sources are ``g``'s plus, with ``capabilities_source``, where the
    runtime's capabilities came from (``capabilities_kind``: its kind of source; default the
    profile's needs, assumed). An unsafe plan is returned with its spec: the caller
    refuses it (``Plan.refusal_lines``) or shows it (``up --dry-run``, ``serve --print``). The
    render keywords are ``render``'s."""
    plan = decide(profile, g, capabilities=capabilities, release=release)
    sources = list(g.sources)
    if capabilities_source is not None:
        sources.append(FactSource(fact="capabilities", value=", ".join(sorted(plan.capabilities)) or "none",
                                  source=capabilities_source, kind=capabilities_kind))
    return plan, render(plan, profile, g, overrides=overrides, native=native, profile_file=profile_file,
                        sources=sources, spec_file=spec_file, facts_file=facts_file)


def hicache_off_warning(plan: Plan) -> str | None:
    """The one warning a launch gives when the plan turned HiCache off (verdict ``hicache_off``:
    the server is launchable without it), the same line from ``up`` (``launch/prepare.py``),
    ``serve --profile`` (``launch/serve.py``) and ``compose --facts`` (``launch/compose.py``):
    ``plan: HiCache is off (REASONS)``, the plan's reasons joined by ``; ``. None for any other
    verdict."""
    if plan.verdict != "hicache_off":
        return None
    return "plan: HiCache is off (" + "; ".join(plan.reasons) + ")"


def launch_facts(plan: Plan, g: Gathered) -> LaunchFacts:
    """The fact values ``plan`` assumed, as the digest covers them (no sources, no times,
    no readings of a moment such as MemAvailable)."""
    from escha_deploy.launch_spec import LaunchFacts

    h = g.host
    md = g.model_dir
    return LaunchFacts(
        platform=h.platform, mem_total_bytes=h.mem_total_bytes, hugetlb_bytes=h.hugetlb_bytes,
        cgroup_limit_bytes=h.cgroup_limit_bytes, memory_base_bytes=h.memory_base_bytes,
        pinned_ceiling_bytes=h.pinned_ceiling_bytes, pinned_ceiling_reached=h.pinned_ceiling_reached,
        host_allocator=h.host_allocator, capabilities=sorted(plan.capabilities), gpus=list(g.gpus),
        model_safetensors_bytes=md.safetensors_bytes if md else None,
        model_arch=md.arch.model_dump(mode="json") if md and md.arch else None,
        sglang_release=plan.sglang_release,
        draft_weights_bytes=g.draft.weights_bytes if g.draft else None,
        draft_num_layers=g.draft.num_layers if g.draft else None,
    )


def runtime_here(notes: list[str] | None = None) -> RuntimeDescription | None:
    """This machine's runtime description (``capabilities.runtime_description_path()``:
    $ESCHA_RUNTIME_DESCRIPTION, else /etc/escha/runtime.json, written by ``runtime apply``), or
    ``None`` for none; ``runtime.description.read_description``, whose models are imported only
    when the file is there. A stale one (its ``sglang_dir`` no longer exists: that SGLang was
    removed or replaced) is ignored, with a line appended to ``notes`` naming it."""
    from escha_deploy import capabilities as caps

    path = caps.runtime_description_path()
    if not Path(path).is_file():
        return None
    from escha_deploy.runtime.description import read_description

    desc = read_description(path)
    if desc is not None and not Path(desc.sglang_dir).is_dir():
        if notes is not None:
            notes.append(f"{path}: stale runtime description (its sglang_dir {desc.sglang_dir} no longer exists): "
                         "ignored; planned with the profile's runtime.needs")
        return None
    return desc


def _described(kw: dict[str, Any]) -> str | None:
    """What describes another box in ``make_plan``'s keywords (``--host-ram``, a facts file
    given or named by $ESCHA_FACTS), or ``None`` for this machine."""
    from escha_deploy.paths import facts_file

    if kw.get("host_bytes") is not None:
        return "--host-ram"
    facts, named = facts_file(kw.get("facts_path"))
    return named if facts is not None else None


def plan_here(profile_ref: str, overrides: Sequence[str],
              **kw: Any) -> tuple[Plan, tuple[list[str], str] | None]:
    """``make_plan`` called as ``escha-deploy plan`` calls it (``compose`` plans this machine
    through it too, so both reach one verdict): the capabilities are those of this machine's
    runtime description (``runtime_here``), or, with none, the profile's needs (the image built
    for it). A described box (``--host-ram``, ``--facts``) is another box: it is planned with
    its facts file's runtime section when that lists capabilities, else with the profile's
    needs, never this machine's description, and the plan says so when this machine has one.
    ``kw``: ``make_plan``'s other keywords. Returns ``(plan, runtime)``: ``runtime`` is
    ``(capabilities, where)`` of the runtime planned (this machine's description, or the facts
    file's runtime section), whose lack of a needed capability the caller refuses (exit 3), or
    ``None`` when the profile's needs were assumed."""
    notes: list[str] = []
    described = _described(kw)
    desc = runtime_here(notes)
    if described is not None:
        if desc is not None:
            from escha_deploy import capabilities as capmod

            notes.append(f"{described} describes another box: planned with the profile's runtime.needs (the "
                         f"image built for it) or its facts file's runtime, not this machine's runtime description "
                         f"({capmod.runtime_description_path()})")
        desc = None
    caps = frozenset(desc.capabilities) if desc is not None else None
    result = make_plan(profile_ref, overrides, capabilities=caps, desc=desc, here_runtime=described is None, **kw)
    if notes:
        result = result.model_copy(update={"warnings": notes + list(result.warnings)})
    if desc is not None:
        from escha_deploy.capabilities import runtime_description_path

        return result, (list(desc.capabilities), f"this runtime ({runtime_description_path()})")
    return result, facts_runtime_planned(result)


def make_plan(profile_ref: str, overrides: Sequence[str], *, ratio: float | None = None,
              hicache_size: int | None = None, host_bytes: int | None = None, platform: Platform | None = None,
              capabilities: frozenset[str] | None = None, facts_path: str | None = None,
              on_gathered: Callable[[Gathered], None] | None = None, prof: Profile | None = None,
              hicache_source: str | None = None, sglang_version: str | None = None,
              desc: RuntimeDescription | None = None, release: ReleaseChoice | None = None,
              check_argv: bool = True, digest: bool = False, here_runtime: bool = True) -> Plan:
    """``escha-deploy plan``'s pipeline: gather (profile, host facts, model folder), then decide,
    flag check included, through the functions ``up``, ``serve``, ``compose`` and ``fleet`` call.
    ``prof``: ``profile_ref`` with ``overrides`` when the caller loaded it already.
    ``hicache_source``: where the HiCache setting came from, for the plan's label.
    ``sglang_version``: ``--sglang-version``; the release is chosen by ``releases.choose_release``
    from this machine's runtime description (``desc``), the flag and the profile.
    ``here_runtime``: False for a plan of another box (no description of this machine read).
    A facts file's ``runtime`` section (``Gathered.runtime``) is that box's runtime, planned by
    ``planned_runtime`` as ``fleet plan`` plans a box's (``desc`` and ``capabilities``, this
    machine's, win: they are not given for a described box).
    ``on_gathered``: called with the ``Gathered`` facts before the plan (``plan --write-facts``),
    whose ``runtime`` is then the runtime planned when one is described (the facts file's, this
    machine's description, or ``--sglang-version``), else ``None``."""
    if prof is None:
        from escha_deploy.profile import load_profile

        prof = load_profile(profile_ref, list(overrides))
    if capabilities is None and here_runtime:
        # inside an image (or a host patched with `runtime apply`): plan the runtime that is
        # here, not the one the profile asks for (without our 0001 that is stock 0.5.19's host
        # check); a capability it lacks is refused by the caller, exit 3, as `serve --print` does
        desc = runtime_here()
        capabilities = frozenset(desc.capabilities) if desc is not None else None
    # the L3 directory is checked here, not in gather: `up` and `serve` refuse before start
    # with its problem alone, while a plan still shows the budget with that problem as a reason
    g = gather(prof, facts_path=facts_path, platform=platform, host_ram=host_bytes, check_here=False)
    box = g.runtime if desc is None else None
    release, capabilities = planned_runtime(prof, g, desc=desc, sglang_version=sglang_version, release=release,
                                            capabilities=capabilities)
    l3_refusals = check_l3_here(prof, g)
    if on_gathered is not None:
        g.runtime = box or _described_runtime(desc, sglang_version)
        on_gathered(g)
    result = decide(prof, g, capabilities=capabilities, ratio=ratio, hicache_size_gb=hicache_size,
                    hicache_source=hicache_source, release=release, check_argv=check_argv, digest=digest)
    if l3_refusals:
        # the server would be refused before start (exit 3), as an unsafe plan is
        reasons = l3_refusals + (result.reasons if result.verdict == "unsafe" else [])
        result = result.model_copy(update={"verdict": "unsafe", "reasons": reasons})
    return result


def planned_runtime(prof: Profile, g: Gathered, *, desc: RuntimeDescription | None = None,
                    sglang_version: str | None = None, release: ReleaseChoice | None = None,
                    capabilities: frozenset[str] | None = None) -> tuple[ReleaseChoice, frozenset[str] | None]:
    """The runtime a plan of ``prof`` on ``g`` is made for: ``(release, capabilities)``, as
    ``plan`` and ``fleet plan`` both plan it (``decide`` takes the pair).

    ``desc``: this machine's runtime description (its release and capabilities win: not given
    for a described box). Otherwise a facts file's ``runtime`` section (``Gathered.runtime``) is
    that box's runtime: its release is chosen as an image's is (``releases.choose_release(image=
    ...)``: a profile's or ``--sglang-version``'s release that differs is refused, exit 3, naming
    both) and its capabilities, when it lists them, are planned; each is appended to ``g.facts``
    as a ``facts_file`` source. ``release``/``capabilities``: the caller's own (win). Neither
    described: the profile's ``runtime.sglang_version`` (else the default release) and
    ``None`` (the profile's needs, as an image built for it provides)."""
    from escha_deploy.releases import choose_release

    box = g.runtime if desc is None else None
    claim: tuple[str | None, str] | None = None
    if desc is not None:
        from escha_deploy.capabilities import runtime_description_path

        claim = (desc.sglang_version, f"this runtime ({runtime_description_path()})")
    elif box is not None and box.sglang_release is not None:
        claim = (box.sglang_release, f"{g.runtime_where}.sglang_release ({box.release_claim()[1]})")
    release = release or choose_release(image=claim, flag=sglang_version, profile=prof.runtime.sglang_version)
    if box is not None:
        if box.sglang_release is not None:
            g.facts.append(FactSource(fact="SGLang release", value=box.sglang_release,
                                      source=f"{g.runtime_where}.sglang_release", kind="facts_file"))
        if capabilities is None and (names := box.capability_names()) is not None:
            capabilities = frozenset(names)
            g.facts.append(FactSource(fact="capabilities", value=", ".join(sorted(names)) or "none",
                                      source=f"{g.runtime_where}.capabilities", kind="facts_file"))
    return release, capabilities


def facts_runtime_lacks(result: Plan, prof: Profile) -> list[str]:
    """The lines a plan made for a facts file's runtime section that lists capabilities is
    refused with (exit 3) when one the profile needs (``runtime.needs``) is not among them
    (``runtime.description.require_capabilities``, ``where: runtime lacks capability 'c'``);
    ``[]`` when none lacks or the plan assumed the profile's needs. ``plan --facts`` and
    ``fleet plan`` refuse the same lines."""
    from escha_deploy.errors import Refused
    from escha_deploy.runtime.description import require_capabilities

    planned = facts_runtime_planned(result)
    if planned is None:
        return []
    try:
        require_capabilities(planned[0], tuple(prof.runtime.needs), planned[1])
    except Refused as exc:
        return list(exc.problems)
    return []


def facts_runtime_planned(result: Plan) -> tuple[list[str], str] | None:
    """``(capabilities, where)`` of the facts file's runtime section ``result`` was planned
    for when that section lists capabilities (``planned_runtime``'s ``facts_file`` source),
    else ``None`` (the profile's needs were assumed, or this machine's description planned)."""
    box = next((f for f in result.fact_sources if f.fact == "capabilities" and f.kind == "facts_file"), None)
    return (list(result.capabilities), box.source) if box is not None else None


def _described_runtime(desc: RuntimeDescription | None, sglang_version: str | None) -> RuntimeFacts | None:
    """The runtime a plan with no facts-file runtime describes, as a facts file's ``runtime``
    section: this machine's runtime description, else ``--sglang-version`` (the release alone;
    capabilities not known), else ``None`` (not known: no section written)."""
    if desc is not None:
        from escha_deploy.capabilities import runtime_description_path

        return desc.runtime_facts(str(runtime_description_path()))
    if sglang_version is None:
        return None
    from escha_deploy.facts.provenance import Provenance
    from escha_deploy.facts.runtime import RuntimeFacts

    return RuntimeFacts(sglang_release=sglang_version,
                        sglang_release_source=Provenance(kind="command_line", where="--sglang-version"))


def check_l3_here(prof: Profile, g: Gathered) -> list[str]:
    """The file L3 directory's refusals (``folders.check_l3_dir``: missing, not writable, short
    of ``hicache.storage_max_size``) when the plan is of this machine (a live host: not
    ``--host-ram``, not a facts file), where ``up`` would check it; marks the host as checked
    so the plan does not say it describes another host. ``[]``: fine, or not this host's to check."""
    hc = prof.hicache
    # the file backend needs hicache.l3.dir (a profile rule): no folder, nothing to check
    if not hc.storage_backend_is_file or hc.storage_dir is None or g.host.source != "live":
        return []
    from escha_deploy.folders import check_l3_dir

    g.host = g.host.model_copy(update={"l3_checked": True})
    return check_l3_dir(hc.storage_dir, hc.storage_max_size)
