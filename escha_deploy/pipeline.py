"""One planning pipeline for every command that plans: ``plan``, ``up``, ``up --dry-run``,
``serve``, ``compose``, ``doctor`` and every ``fleet`` verb. Each command is its choice of two
sources, and one call:

    plan_request(profile, facts source, runtime source, options)
      -> gather(profile, facts source)            -> Gathered (frozen)
      -> resolve_runtime(profile, gathered, runtime source) -> Runtime(release, capabilities, where)
      -> decide(profile, gathered, runtime)       -> Plan
      -> render(plan) for a launch                -> LaunchSpec (the argv rendered once, then checked)
      => Request(gathered, runtime, plan, launch, refusals, warnings)

- facts sources: ``ThisHost`` (with or without doctor's findings), ``DescribedHost``
  (``--host-ram``, a fleet box's ``host_ram``), ``FactsFileHost`` (``--facts``,
  ``$ESCHA_FACTS``, a fleet box's facts), ``InContainer`` (``serve`` inside the container);
  ``facts_source`` turns a command's options into one.
- runtime sources: ``ProfileTarget`` (an image built for the profile), ``RuntimeClaim`` (what an
  image's labels or this runtime's description say: ``up``, ``serve``), ``BoxRuntime`` (the
  box planned: this machine's description, a facts file's runtime section, ``--sglang-version``,
  ``plan --compare``'s release).
- ``decide`` and ``render`` are pure; ``gather`` reads files (and NVML). An unsafe plan is
  returned, never raised: ``Request.refusals`` says what refuses it. Heavy models are imported
  inside the functions that need them, so a table plan never imports the launch-spec models.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, NamedTuple, overload

from escha_deploy.errors import BadInput
from escha_deploy.facts.provenance import FactSource, ProvenanceKind

if TYPE_CHECKING:
    from escha_deploy.arch import DraftFacts, ModelDirFacts
    from escha_deploy.facts.file import FactsFile
    from escha_deploy.facts.findings import DoctorFindings
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


# --- where the facts come from: one small typed value per kind of source -------------------


class ThisHost(NamedTuple):
    """This machine, read now (/proc/meminfo, the cgroup files, NVML). ``findings``: with
    doctor's saved findings for this machine (pinned ceiling, allocator, last prefill);
    ``doctor`` plans without them, so that a ceiling once seen can be measured again.
    ``platform``: ``--wsl2``/``--linux`` (default detected). ``server_here``: the server runs
    here, so the file L3 directory is checked here (``folders.check_l3_dir``; ``doctor`` does
    not)."""

    findings: bool = True
    platform: Platform | None = None
    server_here: bool = True


class DescribedHost(NamedTuple):
    """A host described in words, not read (``--host-ram``, a fleet box's ``host_ram``):
    ``mem_total_bytes`` (bytes) and ``platform`` (``None``: not said, planned as Linux);
    ``origin`` where the memory was written
    (``None``: ``--host-ram``; ``fleet``: the fleet file's ``host_ram`` line). Doctor's findings
    describe this machine, so they are never read; its L3 directory is not this machine's."""

    mem_total_bytes: int
    platform: Platform | None = None
    origin: str | None = None


class FactsFileHost(NamedTuple):
    """A facts file (``--facts``, ``$ESCHA_FACTS``, a fleet box's ``facts``): the host, the GPU
    records, doctor's findings and the runtime section come from it; of this machine only the
    model folder and the L3 directory's free space are read. ``named``: how the file is named in
    messages (``--facts`` or ``ESCHA_FACTS=PATH``); ``what``/``hint``: its reader's wording
    (``fleet``: a box's saved facts); ``platform``: ``--wsl2``/``--linux`` over the file's;
    ``server_here``: the server runs here (``up --facts``, ``serve --facts``): the L3
    directory is checked here."""

    path: str
    named: str = "--facts"
    what: str = "the facts file"
    hint: str | None = None
    platform: Platform | None = None
    server_here: bool = False


class InContainer(NamedTuple):
    """Inside the server's container (``serve`` with ``ESCHA_SERVE_MODE=container``): the host
    facts come from ``facts`` (this machine or a facts file named by ``ESCHA_FACTS``), the model
    folder is read at ``model.path``, the draft's at ``model.draft.path`` and the L3 directory
    at ``flags.CONTAINER_L3_DIR``, where the container mounts them."""

    facts: ThisHost | FactsFileHost = ThisHost()


FactsSource = ThisHost | DescribedHost | FactsFileHost | InContainer


def facts_source(facts_path: str | None = None, *, host_ram: int | None = None, platform: Platform | None = None,
                 launch: bool = False) -> FactsSource:
    """The facts source a command's options name: ``facts_path`` (``--facts``; else
    ``$ESCHA_FACTS`` when set, ``paths.facts_file``), else ``host_ram`` (``--host-ram``, bytes),
    else this machine. The file L3 directory is checked here for a plan of this machine, and,
    with ``launch`` (``up``, ``serve``: the server runs here), whatever describes the host.
    Raises ``BadInput`` (exit 2) for a facts file and ``--host-ram`` together."""
    from escha_deploy.paths import facts_file

    path, named = facts_file(facts_path)
    if path and host_ram is not None:
        raise BadInput(f"{named} and --host-ram are mutually exclusive (the facts file describes the host)")
    if path:
        return FactsFileHost(path, named=named, platform=platform, server_here=launch)
    if host_ram is not None:
        return DescribedHost(host_ram, platform)
    return ThisHost(platform=platform)


class Gathered(NamedTuple):
    """The plan's inputs besides the profile, and where each came from; built once by
    ``gather`` and never changed after (an immutable ``NamedTuple``: ``decide`` does not depend on what ran
    before it).

    ``source``: the facts source it was gathered from; ``host``: the host facts (live,
    described, or from a facts file); ``model_dir``: what the model folder says (``None`` when
    it is not here); ``gpus`` (a property): the GPU records of ``host.gpus``, the one inventory
    (``facts.gpus.GpuRecord``: NVML's, measured now, or the facts file's; empty when neither);
    ``facts``: one ``facts.provenance.FactSource``
    per fact, for ``up --dry-run`` and the launch spec; ``runtime``: the box's runtime (SGLang
    release, capabilities: ``facts.runtime.RuntimeFacts``) as the facts file's ``runtime``
    section gives it (``None``: not described), with ``runtime_where`` naming that section;
    ``facts_file``: the facts file as read (``factsfile.load_facts_file``, once), ``None``
    without one (``fleet`` keeps it for the checks only a fleet has); ``draft``: what
    ``model.draft``'s folder says (``arch.DraftFacts``; ``None`` without the key or the folder
    here); ``l3_refusals``: the file L3 directory's problems when the server runs here
    (``folders.check_l3_dir``: missing, not writable, short of ``hicache.storage_max_size``;
    empty when fine or not checked): ``plan`` makes them reasons of an unsafe plan, ``up`` its
    ``L3 folder`` check, ``serve`` refuses them (exit 3); ``findings``: doctor's saved findings
    for this machine as its reader read them (``None`` for a described host, a facts file, whose
    findings are ``facts_file.findings``, or none saved), which ``plan --write-facts`` writes.
    """

    source: FactsSource
    host: HostFacts
    model_dir: ModelDirFacts | None
    facts: tuple[FactSource, ...]
    runtime: RuntimeFacts | None = None
    runtime_where: str = ""
    facts_file: FactsFile | None = None
    draft: DraftFacts | None = None
    l3_refusals: tuple[str, ...] = ()
    findings: DoctorFindings | None = None

    @property
    def sources(self) -> list[FactSource]:
        """Where each fact came from, in order (``facts``, as the launch spec carries them)."""
        return list(self.facts)

    @property
    def gpus(self) -> tuple[GpuRecord, ...]:
        """The GPU records the host's inventory holds (``host.gpus``: NVML's, measured now, or
        the facts file's; ``facts.gpus.records_from_inventory``), as the launch spec and a
        written facts file keep them; empty when neither."""
        from escha_deploy.facts.gpus import records_from_inventory

        return tuple(records_from_inventory(self.host.gpus))


def _fmt_bytes(n: int | None) -> str:
    from escha_deploy.units import fmt_gib

    return "-" if n is None else f"{n:,} B ({fmt_gib(n)})"




class HostReading(NamedTuple):
    """What one host reader read: the ``host`` facts, where each came from (``facts``: the
    platform, MemTotal, the cgroup limit, the pinned ceiling and the host allocator, in that
    order), where the GPU records came from (``gpus``), doctor's saved ``findings`` it read for
    this machine (``None``: none read; a facts file's are ``facts_file.findings``) and the
    ``facts_file`` as read (``None`` without one)."""

    host: HostFacts
    facts: tuple[FactSource, ...]
    gpus: FactSource
    findings: DoctorFindings | None = None
    facts_file: FactsFile | None = None


def _findings_facts(host: HostFacts, measured: bool, source: str, kind: ProvenanceKind,
                    unmeasured: str) -> tuple[FactSource, FactSource]:
    """The pinned ceiling's and the host allocator's lines: ``source``/``kind`` where findings
    were read (``measured``), ``unmeasured`` where the ceiling is not known."""
    if host.pinned_ceiling_bytes is not None and measured:
        ceiling = FactSource(fact="pinned ceiling per process", value=_fmt_bytes(host.pinned_ceiling_bytes)
                             + ("" if host.pinned_ceiling_reached else " (no pin failed: not a ceiling)"),
                             source=source, kind=kind)
    else:
        ceiling = FactSource(fact="pinned ceiling per process", value="unmeasured", source=unmeasured,
                             kind="unmeasured")
    allocator = FactSource(fact="host allocator", value=host.host_allocator or "auto",
                           source=source if host.host_allocator else "default (the runtime picks)",
                           kind=kind if host.host_allocator else "default")
    return ceiling, allocator


def _gpus_fact(host: HostFacts, source: str, kind: ProvenanceKind) -> FactSource:
    """Where the GPU records came from: ``source``/``kind`` when the host has some, else the
    profile's ``runtime.tp_size``."""
    from escha_deploy.facts.gpus import records_from_inventory

    gpus = records_from_inventory(host.gpus)
    if not gpus:
        return FactSource(fact="GPUs", value="not described", source="profile (runtime.tp_size)", kind="profile")
    return FactSource(fact="GPUs", value=f"{len(gpus)} described", source=source, kind=kind)


def read_this_host(profile: Profile, src: ThisHost) -> HostReading:
    """This machine, read now (``host.read_this_host``: /proc/meminfo, the cgroup files, NVML
    unless the profile gives the container no GPU), with doctor's saved findings for it when
    ``src.findings`` (read once, there), and where each fact came from."""
    from escha_deploy.facts.findings import MAX_AGE
    from escha_deploy.host import read_this_host as read_machine
    from escha_deploy.paths import doctor_findings_path

    # a profile that gives the container no GPU (``container.gpus: []``, a server that uses
    # none) plans without NVML: its GPUs are no fact of that server, and pynvml is not imported
    host, f = read_machine(platform=src.platform, gpus=profile.container.gpus != [], use_findings=src.findings)
    where = "measured now (/proc/meminfo, the cgroup files)"
    facts = [FactSource(fact="platform", value=host.platform,
                        source="--wsl2/--linux" if src.platform else "measured now (/proc/version)",
                        kind="command_line" if src.platform else "proc"),
             FactSource(fact="MemTotal", value=_fmt_bytes(host.mem_total_bytes), source=where, kind="proc"),
             FactSource(fact="cgroup memory limit", value=_fmt_bytes(host.cgroup_limit_bytes), source=where,
                        kind="cgroup")]
    fsrc = "none"
    if f is not None:
        age = f.age()
        hours = age.total_seconds() / 3600
        fsrc = (f"saved doctor findings, {hours:.1f} h old ({doctor_findings_path()})" if age < MAX_AGE else
                f"saved doctor findings, {hours:.1f} h old: older than {MAX_AGE.days} day; "
                "`escha-deploy doctor --fresh` measures again")
    facts += _findings_facts(host, f is not None, fsrc, "findings",
                             "no doctor findings for this host; `escha-deploy doctor` measures it")
    return HostReading(host, tuple(facts), _gpus_fact(host, "NVML, measured now", "nvml"), findings=f)


def read_described_host(src: DescribedHost) -> HostReading:
    """A host described in words (``--host-ram``, a fleet box's ``host_ram``): nothing of this
    machine is read, and a platform not given is the default, Linux."""
    from escha_deploy.host import described_host

    host = described_host(src.mem_total_bytes, src.platform or "linux")
    if src.origin is not None:
        host = host.model_copy(update={"origin": src.origin})
    where = src.origin or "--host-ram"
    kind: ProvenanceKind = "command_line" if src.origin is None else "fleet_file"
    platform = (FactSource(fact="platform", value=host.platform, source="--wsl2/--linux", kind="command_line")
                if src.platform else
                FactSource(fact="platform", value=host.platform,
                           source=f"default ({where} names no platform; --wsl2 describes a WSL2 host)",
                           kind="default"))
    facts = (platform,
             FactSource(fact="MemTotal", value=_fmt_bytes(host.mem_total_bytes), source=where, kind=kind),
             # a described host has no cgroup limit unless the description gives one
             FactSource(fact="cgroup memory limit", value=_fmt_bytes(host.cgroup_limit_bytes), source=where,
                        kind=kind),
             *_findings_facts(host, False, "none", "findings",
                              f"{where}: doctor findings describe this machine, not the described one"))
    return HostReading(host, facts, _gpus_fact(host, "", "profile"))


def read_facts_file_host(src: FactsFileHost) -> HostReading:
    """A facts file (``factsfile.load_facts_file``, read once): its host, doctor's findings and
    GPU records, ``--wsl2``/``--linux`` over its platform. Raises ``BadInput`` (exit 2) for an
    unreadable file, named as the command named it (``src.named``)."""
    from escha_deploy.factsfile import load_facts_file

    try:
        ff = load_facts_file(src.path, src.what, hint=src.hint)
    except BadInput as exc:
        if src.named == "--facts":
            raise
        raise BadInput(*(src.named + p[len(src.path):] if p.startswith(f"{src.path}:") else f"{src.named}: {p}"
                         for p in exc.problems), hint=exc.hint) from None
    host = ff.host_facts(platform=src.platform)
    where = f"facts file {src.path}"
    f = ff.findings
    facts = (FactSource(fact="platform", value=host.platform, source=where if src.platform is None else
                        "--wsl2/--linux", kind="facts_file" if src.platform is None else "command_line"),
             FactSource(fact="MemTotal", value=_fmt_bytes(host.mem_total_bytes), source=where, kind="facts_file"),
             FactSource(fact="cgroup memory limit", value=_fmt_bytes(host.cgroup_limit_bytes), source=where,
                        kind="facts_file"),
             *_findings_facts(host, f is not None, where + (f" (doctor findings of {f.created_at})" if f else ""),
                              "facts_file", "not in the facts"))
    return HostReading(host, facts, _gpus_fact(host, where, "facts_file"), facts_file=ff)


def gather(profile: Profile, source: FactsSource) -> Gathered:
    """Gather the plan's inputs one way for ``plan``, ``up``, ``serve``, ``compose``, ``fleet``
    and ``doctor``, from ``source`` (``ThisHost``, ``DescribedHost``, ``FactsFileHost``,
    ``InContainer``): its reader (``read_this_host``, ``read_described_host``,
    ``read_facts_file_host``: the host facts and where each came from), then the model folder
    (``host.read_model_folder``), the file L3 directory (``host.l3_dir_problems``) and the
    draft's folder (``host.read_draft_inputs``), their sources after the reader's. The model
    folder is read at ``model.host_dir`` (``model.path`` in the container), the L3 directory
    checked when the server runs here (its problems are ``Gathered.l3_refusals``, never raised
    here). Raises ``BadInput`` for an unreadable facts file, config.json or a model folder
    without config.json or weights."""
    from escha_deploy.host import l3_dir_problems, read_draft_inputs, read_model_folder

    inside = isinstance(source, InContainer)
    src = source.facts if isinstance(source, InContainer) else source
    model_path = profile.model.path if inside else None
    draft_cfg = profile.model.draft
    draft_path = draft_cfg.path if inside and draft_cfg is not None else None
    l3_path = None
    if inside:
        from escha_deploy.flags import CONTAINER_L3_DIR

        l3_path = CONTAINER_L3_DIR
    if isinstance(src, FactsFileHost):
        reading = read_facts_file_host(src)
    elif isinstance(src, DescribedHost):
        reading = read_described_host(src)
    else:
        reading = read_this_host(profile, src)
    host = reading.host
    model_dir = read_model_folder(profile, model_path)
    check_here = isinstance(src, (ThisHost, FactsFileHost)) and src.server_here
    l3_refusals = l3_dir_problems(profile, l3_path) if check_here else None
    if l3_refusals is not None:
        host = host.model_copy(update={"l3_checked": True})
    if model_dir is not None:
        # read now from the folder's config.json and safetensors headers
        value = (_fmt_bytes(model_dir.tensor_bytes) + " of tensors (safetensors headers)" if model_dir.tensor_bytes
                 else _fmt_bytes(model_dir.safetensors_bytes) + " of safetensors files")
        model = FactSource(fact="model", value=value, source=f"the model folder {model_dir.path}", kind="measurement")
    else:
        from escha_deploy.planner import profile_weights_per_rank

        per_rank, wsrc = profile_weights_per_rank(profile)
        model = FactSource(fact="model", value=_fmt_bytes(per_rank) + " per rank",
                           source=f"profile ({wsrc}, model.architecture): no model folder here", kind="profile")
    sources = [*reading.facts, model, reading.gpus]
    draft = read_draft_inputs(profile, draft_path=draft_path, model_path=model_path)
    if draft is not None:
        sources.append(FactSource(fact="draft model", value=_fmt_bytes(draft.weights_bytes) + (
            " of MTP tensors" if draft.own_folder else " of safetensors") + f", {draft.num_layers or '?'} layers",
            source=f"the draft folder {draft.path}", kind="measurement"))
    ff = reading.facts_file
    runtime = ff.runtime if ff is not None else None
    where = f"facts file {src.path} runtime" if isinstance(src, FactsFileHost) else ""
    return Gathered(source, host, model_dir, tuple(sources), runtime=runtime,
                    runtime_where=where if runtime is not None else "",
                    facts_file=ff, draft=draft, l3_refusals=tuple(l3_refusals or ()), findings=reading.findings)


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
    from escha_deploy.flagcheck import check_argv

    check = check_argv(list(prof.runtime.extra_args), set(prof.runtime.needs), version=runtime.release.version,
                       require_model=False)
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


def check_rendered_argv(result: Plan, prof: Profile, argv: Sequence[str] | None = None) -> ArgvCheck:
    """Check the server argv of ``result`` against its release's flag catalog plus the
    capabilities' declared flags: one refusal path for ``plan``, ``up``, ``serve``,
    ``compose`` and ``fleet``. ``argv``: the argv as rendered already (a launch spec's: the
    one that runs, native or container); ``None``: rendered here (``flags.server_args``).
    Errors (an unknown flag in ``runtime.extra_args``, ...) are bad input (``BadArgv``, exit 2)."""
    from escha_deploy.flagcheck import check_argv
    from escha_deploy.flags import server_args
    from escha_deploy.planner.result import ArgvCheck

    # flags a needed capability declares are valid here: a runtime that lacks the capability is
    # the missing-capability refusal's to name (exit 3), not a bad argv
    check = check_argv(list(argv) if argv is not None else server_args(result, prof), set(result.capabilities) | set(prof.runtime.needs),
                       version=result.sglang_release)
    if check.errors:
        raise _argv_problems(check)
    declared = [f"{u.flag} {' '.join(u.values)} ({u.capability})".replace("  ", " ") for u in check.declared()]
    return ArgvCheck(verified=len(check.flags) - len(declared), declared=declared, errors=[])




# --- where the runtime comes from ---------------------------------------------------------


class ProfileTarget(NamedTuple):
    """The runtime the profile asks for, as an image built for it provides: the profile's
    ``runtime.needs`` (assumed, so never refused for lacking one) and its
    ``runtime.sglang_version``, else the default release (``compose --facts``, ``doctor``)."""


class RuntimeClaim(NamedTuple):
    """What a runtime that will run the server says of itself: an image's labels or runtime
    description file (``up``, ``launch.prepare.image_runtime``) or this runtime's description
    (``serve``). ``release``: its SGLang release (``None``: it does not say), named in
    messages as ``release_where``; ``capabilities``: what it provides (``None``: the profile's
    needs, assumed), stated on the launch spec as coming from ``where`` (``kind``: the kind of
    source: ``image_labels``, ``runtime_description``, ``default``...). A release the profile
    names that differs from ``release`` is refused (exit 3, both named)."""

    release: str | None
    release_where: str
    capabilities: tuple[str, ...] | None
    where: str | None = None
    kind: ProvenanceKind = "profile"


class BoxRuntime(NamedTuple):
    """The runtime of the box planned, as ``plan`` and ``fleet plan`` find it: this machine's
    runtime description (``runtime_here``) when the facts are this machine's and ``here``, else
    the facts file's ``runtime`` section (``Gathered.runtime``), else the profile's needs.
    ``flag``: ``--sglang-version``; ``release``: ``(version, where)`` planned whatever the
    profile or runtime says (``plan --compare A``). ``here=False``: never read this machine's
    description (``fleet plan``: a box is another machine)."""

    flag: str | None = None
    release: tuple[str, str] | None = None
    here: bool = True


RuntimeSource = ProfileTarget | RuntimeClaim | BoxRuntime


class Runtime(NamedTuple):
    """The runtime a plan is made for, chosen once (``resolve_runtime``).

    ``release``: the ``releases.ReleaseChoice`` (version, where it came from); ``capabilities``:
    the runtime's (``None``: the profile's needs, as an image built for it provides);
    ``where``: where those capabilities were read (stated on the launch spec's sources, with
    ``kind``; ``None``: not stated); ``facts``: the plan's fact sources the runtime adds (a facts
    file's runtime section: its release and capabilities); ``binding``: ``(capabilities,
    where)`` whose lack of a capability the profile needs is refused (exit 3: this machine's
    description, a facts file's section that lists them), ``None`` when the needs were assumed;
    ``notes``: warnings the plan carries (a stale or ignored runtime description); ``described``:
    the runtime as a facts file's ``runtime`` section writes it (``plan --write-facts``;
    ``None``: not known)."""

    release: ReleaseChoice
    capabilities: frozenset[str] | None = None
    where: str | None = None
    kind: ProvenanceKind = "profile"
    facts: tuple[FactSource, ...] = ()
    binding: tuple[tuple[str, ...], str] | None = None
    notes: tuple[str, ...] = ()
    described: RuntimeFacts | None = None

    def lacking(self, profile: Profile) -> list[str]:
        """``where: runtime lacks capability 'c'`` for each capability ``profile`` needs that
        the binding runtime lacks (``runtime.description.require_capabilities``); ``[]`` when
        none lacks or the needs were assumed."""
        if self.binding is None:
            return []
        from escha_deploy.errors import Refused
        from escha_deploy.runtime.description import require_capabilities

        try:
            require_capabilities(list(self.binding[0]), tuple(profile.runtime.needs), self.binding[1])
        except Refused as exc:
            return list(exc.problems)
        return []


def resolve_runtime(profile: Profile, g: Gathered | None, source: RuntimeSource) -> Runtime:
    """The one place a runtime is chosen: its SGLang release (``releases.choose_release``: a
    runtime's own release, else ``--sglang-version``, else the profile's, else the default; two
    that differ are refused, exit 3, naming both) and capabilities, from ``source``
    (``ProfileTarget``, ``RuntimeClaim``, ``BoxRuntime``) and the gathered facts (a facts file's
    runtime section; ``None``: no facts, ``compose`` without ``--facts``). Raises ``BadInput``
    (exit 2) for a release that is not supported."""
    from escha_deploy.releases import ReleaseChoice, check_supported, choose_release

    claim: tuple[str | None, str] | None = None
    caps: frozenset[str] | None = None
    facts: list[FactSource] = []
    binding: tuple[tuple[str, ...], str] | None = None
    notes: list[str] = []
    desc: RuntimeDescription | None = None
    box: RuntimeFacts | None = None
    if isinstance(source, RuntimeClaim):
        claim = (source.release, source.release_where)
        caps = None if source.capabilities is None else frozenset(source.capabilities)
    elif isinstance(source, BoxRuntime):
        desc = runtime_here(notes) if source.here else None
        if desc is not None and g is not None and not isinstance(g.source, ThisHost):
            # a described box is another box: planned with its facts file's runtime or the
            # profile's needs, never this machine's description
            from escha_deploy import capabilities as capmod

            described = (g.source.named if isinstance(g.source, FactsFileHost) else
                         (g.source.origin or "--host-ram") if isinstance(g.source, DescribedHost) else "the facts")
            notes.append(f"{described} describes another box: planned with the profile's runtime.needs (the "
                         f"image built for it) or its facts file's runtime, not this machine's runtime description "
                         f"({capmod.runtime_description_path()})")
            desc = None
        box = g.runtime if g is not None and desc is None else None
        if desc is not None:
            from escha_deploy.capabilities import runtime_description_path

            claim = (desc.sglang_version, f"this runtime ({runtime_description_path()})")
            caps = frozenset(desc.capabilities)
            binding = (tuple(desc.capabilities), claim[1])
        elif box is not None and g is not None:
            if box.sglang_release is not None:
                claim = (box.sglang_release, f"{g.runtime_where}.sglang_release ({box.release_claim()[1]})")
                facts.append(FactSource(fact="SGLang release", value=box.sglang_release,
                                        source=f"{g.runtime_where}.sglang_release", kind="facts_file"))
            if (names := box.capability_names()) is not None:
                caps = frozenset(names)
                facts.append(FactSource(fact="capabilities", value=", ".join(sorted(names)) or "none",
                                        source=f"{g.runtime_where}.capabilities", kind="facts_file"))
                binding = (tuple(sorted(names)), f"{g.runtime_where}.capabilities")
    flag = source.flag if isinstance(source, BoxRuntime) else None
    if isinstance(source, BoxRuntime) and source.release is not None:  # plan --compare A: A, whatever is named
        release = ReleaseChoice(version=check_supported(*source.release), source=source.release[1])
    else:
        release = choose_release(image=claim, flag=flag, profile=profile.runtime.sglang_version)
    if isinstance(source, RuntimeClaim):
        return Runtime(release=release, capabilities=caps, where=source.where, kind=source.kind)
    return Runtime(release=release, capabilities=caps, facts=tuple(facts), binding=binding, notes=tuple(notes),
                   described=(box or _described_runtime(desc, flag)) if isinstance(source, BoxRuntime) else None)


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




# --- one request: the facts source and the runtime source a command chose --------------------


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
    if rt.notes:
        plan = plan.model_copy(update={"warnings": list(rt.notes) + list(plan.warnings)})
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


