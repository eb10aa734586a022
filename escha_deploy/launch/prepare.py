"""What `up`, `up --dry-run` and `serve` share: from a profile reference to a checked plan and
its ``LaunchSpec``, before anything touches the daemon's state.

``prepare`` is gather, plan, build: load the profile, read the host (and, with a docker client,
the image's capabilities), plan, build the launch spec, and refuse (exit 3, nothing created)
an unsafe plan, missing capabilities or an unlaunchable container spec.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, NamedTuple

from escha_deploy.errors import BadInput, Refused

if TYPE_CHECKING:
    from escha_deploy.arch import ModelDirFacts
    from escha_deploy.factsfile import GpuRecord
    from escha_deploy.host import HostFacts
    from escha_deploy.launch_spec import ContainerSpec, FactSource, LaunchFacts, LaunchSpec
    from escha_deploy.planner.result import ArgvCheck, Plan
    from escha_deploy.profile import Profile

    from .drift import PlannedSizes


def profile_file(ref: str) -> str | None:
    """The host path to mount when ``ref`` names a file rather than a shipped profile
    (``profile.names_a_file``: the rule ``--profile`` reads it by)."""
    from escha_deploy.profile import names_a_file

    p = Path(ref)
    if names_a_file(ref):
        return str(p.resolve()) if p.is_file() else None
    return None


#: A key or token file holds one line; 64 KiB is far more than any key.
MAX_SECRET_FILE = 64 * 1024


_CONTROL_NAMES = {0: "NUL", 10: "LF", 13: "CR"}


def secret_control_problem(value: str, where: str, *, offset: int = 0) -> str | None:
    """The line that refuses a secret holding a control character (CR, LF, NUL or another
    byte below 0x20, or DEL): ``"{where}: ... (byte N: a CR) ..."``, naming the byte offset in its
    UTF-8 encoding plus ``offset``, never the value; None when it has none. An HTTP header
    cannot carry one (h11 refuses it with the whole header value in its message)."""
    for i, b in enumerate(value.encode("utf-8", "surrogateescape")):
        if b < 0x20 or b == 0x7F:
            name = _CONTROL_NAMES.get(b, f"control byte 0x{b:02x}")
            return (f"{where}: the key holds a character that cannot go in an HTTP header (byte {i + offset}: "
                    f"a {name}); a key is one line of printable text (one trailing newline, LF or CRLF, is "
                    "fine in a file: a file saved on Windows ends in CRLF); the key is not shown")
    return None


def read_secret(path: str, what: str) -> str:
    """The secret a file holds: its text less one trailing newline (LF or CRLF), a UTF-8 byte
    order mark and surrounding spaces. Raises ``BadInput`` naming the file (never the value,
    and a path that is not an existing file never whole: it may be the key typed in the
    wrong place): not a regular file (``/dev/zero`` would be read forever), larger than
    ``MAX_SECRET_FILE`` bytes, not UTF-8, empty, or with any other CR, LF, NUL or control
    byte (named by its offset, ``secret_control_problem``)."""
    p = Path(path)
    try:
        if not p.exists():
            raise BadInput(f"{what}: cannot read a value from {shown_path(path)}: no such file")
        if not p.is_file():
            raise OSError
        with open(p, "rb") as fh:
            raw = fh.read(MAX_SECRET_FILE + 1)
        if len(raw) > MAX_SECRET_FILE:
            raise BadInput(f"{what}: {path} is larger than {MAX_SECRET_FILE} bytes; it should hold one key")
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError):
        raise BadInput(f"{what}: cannot read a value from {path}") from None
    bom = text.startswith("\ufeff")
    text = text[1:] if bom else text
    text = text[:-2] if text.endswith("\r\n") else text[:-1] if text.endswith("\n") else text
    lead = len(text) - len(text.lstrip(" "))
    value = text.strip(" ")
    # the offset in the file: after the byte order mark (3 bytes) and the leading spaces
    bad = secret_control_problem(value, f"{what}: {path}", offset=lead + (3 if bom else 0))
    if bad is not None:
        raise BadInput(bad)
    if not value:
        raise BadInput(f"{what}: cannot read a value from {path}: it is empty")
    return value


def secret_path_problems(profile: Profile) -> None:
    """Refuse (``BadInput``, exit 2) a secret file setting (``container.api_key_file``,
    ``container.hf_token_file``) that is neither an existing file here nor an absolute path (a
    file on the box that runs it): most likely the key itself, typed where its file's path
    goes, which every plan, dry run and compose file would otherwise print. Never printed
    whole (``shown_path``)."""
    bad = []
    for key in ("api_key_file", "hf_token_file"):
        v = getattr(profile.container, key)
        if v and not v.startswith("/") and not Path(v).is_file():
            bad.append(f"container.{key}: {shown_path(v)} is neither an existing file nor an absolute path")
    if bad:
        raise BadInput(*bad, hint="give the path of a file whose one line is the key, never the key itself")


def shown_path(path: str) -> str:
    """How a path that is not an existing file is printed: never whole (a key typed where its
    file's path goes, ``container.api_key_file=KEY``, would otherwise be echoed), only its
    length and first 3 characters."""
    return f"the path given ({len(path)} characters, starting {path[:3]!r}; not shown whole)"


def image_capabilities(client, image: str, labels: dict[str, str] | None = None) -> list[str] | None:
    """Capabilities an image declares: its ``io.escha.runtime.capabilities`` label, else the
    runtime description file read from the image; None for a stock image. ``labels``: the
    image's labels when the caller already read them (saves an inspect)."""
    from escha_deploy.capabilities import RUNTIME_DESCRIPTION_PATH
    from escha_deploy.runtime.description import RuntimeDescription, capabilities_from_labels

    from . import docker as dk

    if labels is None:
        labels = dk.image_labels(client, image) or {}
    caps = capabilities_from_labels(labels)
    if caps is not None:
        return caps
    raw = dk.read_file_from_image(client, image, RUNTIME_DESCRIPTION_PATH)
    if raw is None:
        return None
    from escha_deploy.jsonio import loads_json

    data = loads_json(raw, f"{image}:{RUNTIME_DESCRIPTION_PATH}", "the runtime description")
    try:
        return list(RuntimeDescription.model_validate(data).capabilities)
    except ValueError:
        raise BadInput(f"{image}:{RUNTIME_DESCRIPTION_PATH}: not a runtime description") from None


class Fact(NamedTuple):
    """One fact the plan used, its value as text and where it came from (``FactSource``'s fields)."""

    fact: str
    value: str
    source: str


class Gathered:
    """The plan's inputs besides the profile, and where each came from.

    ``host``: the host facts (live, described, or from a facts file); ``model_dir``: what the
    model folder says (``None`` when it is not here); ``gpus``: per-GPU records (from a facts
    file; empty otherwise); ``sources``: one ``FactSource`` per fact, for ``up --dry-run`` and
    the launch spec (built on first use: ``plan`` never reads them, so it does not import the
    launch-spec models).
    """

    def __init__(self, host: HostFacts, model_dir: ModelDirFacts | None, gpus: list[GpuRecord],
                 facts: list[Fact]) -> None:
        self.host = host
        self.model_dir = model_dir
        self.gpus = gpus
        self.facts = facts
        self._sources: list[FactSource] | None = None

    @property
    def sources(self) -> list[FactSource]:
        """``facts`` as ``launch_spec.FactSource`` documents, in the same order."""
        if self._sources is None:
            from escha_deploy.launch_spec import FactSource

            self._sources = [FactSource(fact=f.fact, value=f.value, source=f.source) for f in self.facts]
        return self._sources


def _fmt_bytes(n: int | None) -> str:
    from escha_deploy.units import fmt_gib

    return "-" if n is None else f"{n:,} B ({fmt_gib(n)})"


def gather(profile: Profile, *, facts_path: str | None = None, platform: str | None = None,
           host_ram: int | None = None, model_path: str | None = None, l3_path: str | None = None,
           check_here: bool | None = None) -> Gathered:
    """Gather the plan's inputs one way for ``plan``, ``up`` and ``serve``.

    ``facts_path``: a facts file (``--facts``; ``ESCHA_FACTS`` when not given): the host and
    findings come from it, nothing else of this machine is read but the model folder and the
    L3 directory's free space. Otherwise: ``host.gather_plan_inputs`` (this machine, with
    doctor's saved findings, or ``host_ram`` for a described host). ``model_path``: the model
    folder as this process sees it (``model.path`` inside the container); ``l3_path`` the L3
    directory likewise. ``check_here``: the server runs on this machine (``up``, ``serve``),
    so the L3 directory is checked here (``folders.check_l3_dir``); default: only for a plan of
    this host (not ``--host-ram``, not a facts file). The GPU records are NVML's (measured now)
    or the facts file's. Raises ``BadInput`` for an unreadable facts file, config.json or a model
    folder without config.json or weights, ``Refused`` for an unusable L3 directory.
    """
    secret_path_problems(profile)
    # the facts-file and findings models are imported only on the paths that read them
    from escha_deploy.host import HostFacts, gather_plan_inputs
    from escha_deploy.paths import doctor_findings_path, facts_file

    facts_path, named = facts_file(facts_path)
    if facts_path and host_ram is not None:
        raise BadInput(f"{named} and --host-ram are mutually exclusive (the facts file describes the host)")
    sources: list[Fact] = []
    gpus: list[GpuRecord] = []
    if facts_path:
        from escha_deploy.factsfile import inventory_from_records, load_facts_file

        try:
            ff = load_facts_file(facts_path)
        except BadInput as exc:
            if named == "--facts":
                raise
            raise BadInput(*(named + p[len(facts_path):] if p.startswith(f"{facts_path}:") else f"{named}: {p}"
                             for p in exc.problems), hint=exc.hint) from None
        host_only, model_dir = gather_plan_inputs(profile, host_ram=ff.host.mem_total_bytes,
                                                  platform=platform or ff.host.platform, model_path=model_path,
                                                  l3_path=l3_path, check_here=bool(check_here))
        f = ff.findings
        l3 = profile.hicache.storage_dir if profile.hicache.storage_backend_is_file else None
        host = HostFacts(
            source="facts", platform=platform or ff.host.platform, mem_total_bytes=ff.host.mem_total_bytes,
            hugetlb_bytes=ff.host.hugetlb_bytes, cgroup_limit_bytes=ff.host.cgroup_limit_bytes,
            host_id=ff.host.host_id, pinned_ceiling_bytes=f.pinned_ceiling_bytes if f else None,
            pinned_ceiling_reached=f.pinned_ceiling_reached if f else False,
            host_allocator=f.host_allocator if f else None, l3_dir=l3,
            restore_bandwidth=f.restore_bandwidth if f else None,
            l3_free_bytes=host_only.l3_free_bytes if l3 else None, l3_checked=host_only.l3_checked,
            gpus=inventory_from_records(list(ff.gpus)))
        gpus = list(ff.gpus)
        where = f"facts file {facts_path}"
        sources += [Fact(fact="platform", value=host.platform, source=where),
                    Fact(fact="MemTotal", value=_fmt_bytes(host.mem_total_bytes), source=where),
                    Fact(fact="cgroup memory limit", value=_fmt_bytes(host.cgroup_limit_bytes), source=where)]
        fsrc = where + (f" (doctor findings of {f.created_at})" if f else "")
    else:
        host, model_dir = gather_plan_inputs(profile, platform=platform, host_ram=host_ram, model_path=model_path,
                                             l3_path=l3_path, check_here=check_here)
        if host.gpus is not None:
            from escha_deploy.factsfile import records_from_inventory

            gpus = records_from_inventory(host.gpus)
        where = "measured now (/proc/meminfo, the cgroup files)" if host.source == "live" else "--host-ram"
        sources += [Fact(fact="platform", value=host.platform,
                               source="--wsl2/--linux" if platform else "measured now (/proc/version)"),
                    Fact(fact="MemTotal", value=_fmt_bytes(host.mem_total_bytes), source=where),
                    Fact(fact="cgroup memory limit", value=_fmt_bytes(host.cgroup_limit_bytes), source=where)]
        f = None
        fsrc = "none"
        if host.source == "live":
            from escha_deploy.findings import MAX_AGE, load_findings

            f = load_findings(doctor_findings_path(), host_id=host.host_id)
            if f is not None:
                age = f.age()
                hours = age.total_seconds() / 3600
                fresh = age < MAX_AGE
                fsrc = (f"saved doctor findings, {hours:.1f} h old ({doctor_findings_path()})" if fresh else
                        f"saved doctor findings, {hours:.1f} h old: older than {MAX_AGE.days} day; "
                        "`escha-deploy doctor --fresh` measures again")
    if host.pinned_ceiling_bytes is not None and (f is not None):
        sources.append(Fact(fact="pinned ceiling per process",
                                  value=_fmt_bytes(host.pinned_ceiling_bytes)
                                  + ("" if host.pinned_ceiling_reached else " (no pin failed: not a ceiling)"),
                                  source=fsrc))
    else:
        sources.append(Fact(fact="pinned ceiling per process", value="unmeasured",
                                  source="no doctor findings for this host; `escha-deploy doctor` measures it"
                                  if host.source == "live" else "not in the facts" if facts_path
                                  else "--host-ram: doctor findings describe this machine, not the described one"))
    sources.append(Fact(fact="host allocator", value=host.host_allocator or "auto",
                              source=fsrc if host.host_allocator else "default (the runtime picks)"))
    if model_dir is not None:
        sources.append(Fact(fact="model", value=_fmt_bytes(model_dir.safetensors_bytes) + " of safetensors",
                                  source=f"the model folder {model_dir.path}"))
    else:
        from escha_deploy.planner import profile_weights_per_rank

        per_rank, wsrc = profile_weights_per_rank(profile)
        sources.append(Fact(fact="model", value=_fmt_bytes(per_rank) + " per rank",
                                  source=f"profile ({wsrc}, model.architecture): no model folder here"))
    sources.append(Fact(fact="GPUs", value=str(len(gpus)) + " described" if gpus else "not described",
                              source=(f"facts file {facts_path}" if facts_path else "NVML, measured now") if gpus
                              else "profile (runtime.tp_size)"))
    return Gathered(host, model_dir, gpus, sources)


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
        raise BadInput(*(f"runtime.extra_args or rendered argv: {line}" for line in check.error_lines()))
    declared = [f"{u.flag} {' '.join(u.values)} ({u.capability})".replace("  ", " ") for u in check.declared()]
    return ArgvCheck(verified=len(check.flags) - len(declared), declared=declared, errors=[])


def plan_gathered(profile: Profile, g: Gathered, *, capabilities: Sequence[str] | None = None,
                  ratio: float | None = None, hicache_size_gb: int | None = None,
                  hicache_source: str | None = None, release=None, check_argv: bool = True,
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
    result = plan_profile(profile, g.host, model_dir=g.model_dir, ratio=ratio, hicache_size_gb=hicache_size_gb,
                       capabilities=None if capabilities is None else frozenset(capabilities),
                       hicache_source=hicache_source, release=release.version, release_source=release.source)
    if check_argv:  # plan --compare leaves it to the comparison, which names the flags the release refuses
        result = result.model_copy(update={"argv_check": check_rendered_argv(result, profile)})
    if not digest:
        return result
    from escha_deploy.launch_spec import build_launch_spec

    return result.model_copy(update={"plan_digest": build_launch_spec(result, profile,
                                                                      facts=launch_facts(result, g)).plan_digest})


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
    )


@dataclass
class Prepared:
    """Everything `up` decided before touching the daemon's state.

    ``launch``: the ``LaunchSpec`` document (argv, env, digest, the facts assumed and their
    sources); ``spec``: its container half; ``args``: docker-py ``containers.create`` keyword
    arguments (``docker.create_args``); ``argv``: the SGLang server command line, as
    ``launch.argv``; ``warnings``: the plan's warnings (one line each); ``refusals``: why it
    must not start (unsafe plan, missing capabilities, unlaunchable container), exit 3;
    ``missing_capabilities``: those the image lacks (empty when the image was not read).
    """

    profile: Profile
    plan: Plan
    launch: LaunchSpec
    spec: ContainerSpec
    args: dict[str, Any]
    argv: list[str]
    warnings: list[str] = field(default_factory=list)
    refusals: list[str] = field(default_factory=list)
    missing_capabilities: list[str] = field(default_factory=list)
    capabilities_source: str = ""
    profile_ref: str = ""
    #: ``refusals`` by the check that made them: ``image``, ``capabilities``, ``plan``,
    #: ``container settings``, ``model folder`` (what ``up --dry-run`` lists per check)
    refused_by: dict[str, list[str]] = field(default_factory=dict)
    #: whether the daemon had the image: None when no daemon was asked
    image_present: bool | None = None

    def refuse(self) -> None:
        """Raise ``Refused`` (exit 3) with every refusal, when there is any."""
        if self.refusals:
            raise Refused(*self.refusals, hint=self.hint)

    @property
    def hint(self) -> str | None:
        if self.missing_capabilities:
            return "build the image with our series: `escha-deploy build --hicache` (docs/runtime.md)"
        if self.plan.verdict == "unsafe":
            return f"`escha-deploy plan --profile {self.profile_ref}` shows the budget"
        return None

    def dry_run(self) -> dict[str, Any]:
        """What `up --dry-run` prints: the plan's verdict, reasons and warnings as `plan` gives
        them, the missing capabilities, the digest, where each fact came from, the container
        config, the server argv and the server's environment (``LaunchSpec.env``: what ``serve
        --spec`` sets for SGLang in the container, as ``serve --print`` shows it; redacted)."""
        from escha_deploy.secretargs import redact_argv

        from .redact import Redactor

        r = Redactor()
        return {
            "profile": self.profile.name,
            "verdict": self.plan.verdict,
            "sglang_release": self.plan.sglang_release,
            "sglang_release_source": self.plan.sglang_release_source,
            "hicache": self.plan.hicache.enabled,
            "plan_digest": self.launch.plan_digest,
            "reasons": list(self.plan.reasons),
            "warnings": self.warnings,
            "missing_capabilities": self.missing_capabilities,
            "capabilities_source": self.capabilities_source,
            "refusals": self.refusals,
            "facts": [s.model_dump() for s in self.launch.sources],
            "container": json.loads(r(json.dumps(self.args))),
            "argv": [r(a) for a in redact_argv(self.argv)],
            "env": {k: r(v) for k, v in self.launch.env.items()},
        }


def prepare(profile_ref: str, overrides: Sequence[str], *, client=None, need_image: bool = True,
            profile: Profile | None = None, facts_path: str | None = None,
            spec_file: str | None = None, image_files: bool = True,
            mounts_here: bool | None = None) -> Prepared:
    """Load, gather, plan and build the launch spec (gather -> plan -> spec).

    With ``client``, reads the image's capabilities (``need_image``: a missing image is a
    refusal); without, the plan assumes the image provides the profile's needs.
    ``image_files``: for an image without the capability label, read its runtime description
    file (a created, never started, removed container); ``up --dry-run`` passes False and its
    capabilities then stay unchecked. ``mounts_here``: the model folder to bind-mount must be a
    folder on this host (default: with ``client``, a launch here). Raises
    ``BadInput`` (exit 2) for bad input, including a flag the runtime would refuse; never
    raises for an unsafe plan or missing capabilities: those are ``Prepared.refusals``, so
    ``up --dry-run`` can show them as ``plan`` does before exiting 3 (``Prepared.refuse``).
    ``spec_file``: where ``up`` will write the spec (the container mounts it).
    """
    from escha_deploy.launch_spec import FactSource, build_launch_spec
    from escha_deploy.profile import load_profile

    from . import docker as dk

    profile = profile or load_profile(profile_ref, overrides)
    g = gather(profile, facts_path=facts_path, check_here=True)
    caps: list[str] | None = None
    caps_source = "assumed: the profile's runtime.needs (image not read)"
    refusals: list[str] = []
    by: dict[str, list[str]] = {}
    missing: list[str] = []
    present: bool | None = None
    if client is not None:
        from docker.errors import DockerException

        from escha_deploy.runtime.description import capabilities_from_labels

        try:
            labels = dk.image_labels(client, profile.container.image)
        except DockerException as exc:  # e.g. an empty or malformed reference the daemon refuses
            first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
            raise BadInput(f"container.image: {profile.container.image!r}: the daemon refuses it ({first})") from None
        present = labels is not None
        if labels is None:
            if need_image:
                by["image"] = [f"container.image: {profile.container.image} is not present; build it "
                               "(`escha-deploy up --build`, or `escha-deploy build`)"]
        elif image_files or capabilities_from_labels(labels) is not None:
            caps = image_capabilities(client, profile.container.image, labels) or []
            caps_source = f"the image {profile.container.image}"
            missing = [c for c in profile.runtime.needs if c not in caps]
            by["capabilities"] = [f"{profile.container.image}: runtime lacks capability {c!r}" for c in missing]
        else:
            caps_source = (f"assumed: the profile's runtime.needs (the image {profile.container.image} has no "
                           "capability label; its runtime description file was not read)")
    from escha_deploy.releases import choose_release
    from escha_deploy.runtime.description import LABEL_SGLANG

    image_release = (labels or {}).get(LABEL_SGLANG) if client is not None and present else None
    release = choose_release(image=(image_release, f"the image {profile.container.image} (label {LABEL_SGLANG})"),
                             profile=profile.runtime.sglang_version)
    plan = plan_gathered(profile, g, capabilities=caps, release=release)
    if plan.verdict == "unsafe":
        by["plan"] = plan.refusal_lines()
    warnings = [f"plan: {w}" for w in plan.warnings]
    if plan.verdict == "hicache_off":
        warnings.insert(0, "plan: HiCache is off for this host (" + "; ".join(plan.reasons) + ")")
    sources = [*g.sources, FactSource(fact="capabilities", value=", ".join(sorted(plan.capabilities)) or "none",
                                           source=caps_source)]
    launch = build_launch_spec(plan, profile, overrides=list(overrides), profile_file=profile_file(profile_ref),
                               facts=launch_facts(plan, g), sources=sources, spec_file=spec_file)
    spec = launch.container
    by["container settings"] = dk.check_spec(spec)
    if client is not None if mounts_here is None else mounts_here:  # a launch here: the model folder is mounted
        by["model folder"] = [f"model.host_dir / container.model_dir: {m.source} is not a folder on this host"
                              for m in spec.mounts if m.target == profile.model.path and not os.path.isdir(m.source)]
    by = {k: v for k, v in by.items() if v}
    refusals = [line for lines in by.values() for line in lines]
    return Prepared(profile, plan, launch, spec, dk.create_args(spec), list(launch.argv), warnings, refusals,
                    missing, caps_source, profile_ref=profile_ref, refused_by=by, image_present=present)


def planned_sizes(plan: Plan) -> PlannedSizes:
    """The plan's per-rank figures as ``drift.PlannedSizes`` (planner/result.py ``PerRank``)."""
    from .drift import PlannedSizes

    pr = plan.per_rank
    hic = plan.hicache.enabled
    return PlannedSizes(
        kv_tokens=pr.device_kv_tokens,
        host_kv_tokens=pr.host_kv_tokens if hic else None,
        host_kv_bytes=pr.host_kv_bytes if hic else None,
        host_mamba_bytes=(pr.host_mamba_bytes or None) if hic else None,
        device_mamba_slots=pr.device_mamba_slots or None,
    )
