"""Gather: the plan's inputs besides the profile, read once into a frozen ``Gathered``. One
reader per kind of host (``read_this_host``, ``read_described_host``, ``read_facts_file_host``)
returns the host facts with where each came from; ``gather`` picks it, then reads the model
folder, the file L3 directory and the draft, and concatenates their sources."""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

from escha_deploy.utils.errors import BadInput
from escha_deploy.facts.provenance import FactSource, ProvenanceKind
from escha_deploy.pipeline.sources import DescribedHost, FactsFileHost, FactsSource, InContainer, ThisHost

if TYPE_CHECKING:
    from escha_deploy.sglang.arch import DraftFacts, ModelDirFacts
    from escha_deploy.facts.file import FactsFile
    from escha_deploy.facts.findings import DoctorFindings
    from escha_deploy.facts.gpus import GpuRecord
    from escha_deploy.facts.runtime import RuntimeFacts
    from escha_deploy.facts.host import HostFacts
    from escha_deploy.profile import Profile


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
    (``folders.read_l3_dir``: missing, not writable, its files unreadable; the room is the plan's;
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
    from escha_deploy.utils.units import fmt_gib

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
    from escha_deploy.facts.machine import read_this_host as read_machine
    from escha_deploy.utils.paths import doctor_findings_path

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
        if stale := f.driver_changed(host.gpus.driver_version if host.gpus is not None else None):
            fsrc = f"saved doctor findings ({doctor_findings_path()}), {stale}"
    facts += _findings_facts(host, f is not None, fsrc, "findings",
                             "no doctor findings for this host; `escha-deploy doctor` measures it")
    return HostReading(host, tuple(facts), _gpus_fact(host, "NVML, measured now", "nvml"), findings=f)


def read_described_host(src: DescribedHost) -> HostReading:
    """A host described in words (``--host-ram``, a fleet box's ``host_ram``): nothing of this
    machine is read, and a platform not given is the default, Linux."""
    from escha_deploy.facts.machine import described_host

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
    from escha_deploy.facts.factsfile import load_facts_file

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
    from escha_deploy.facts.machine import l3_dir_problems, read_draft_inputs, read_model_folder

    inside = isinstance(source, InContainer)
    src = source.facts if isinstance(source, InContainer) else source
    model_path = profile.model.path if inside else None
    draft_cfg = profile.model.draft
    draft_path = draft_cfg.path if inside and draft_cfg is not None else None
    l3_path = None
    if inside:
        from escha_deploy.pipeline.argv import CONTAINER_L3_DIR

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
    l3 = (l3_dir_problems(profile, l3_path, mla=bool(model_dir and model_dir.kv_rank_replicated))
          if check_here else None)
    l3_refusals = l3[0] if l3 is not None else None
    if l3 is not None:
        host = host.model_copy(update={"l3_checked": True, "l3_dir": l3[1]})
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
