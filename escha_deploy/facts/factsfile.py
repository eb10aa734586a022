"""The facts file: a described host as one input (``--facts FILE`` on ``plan``, ``up`` and
``serve``; ``ESCHA_FACTS`` in compose).

A versioned JSON document with three parts: ``host`` (what the kernel reports: MemTotal, the
huge-page reservation, the cgroup limit), ``findings`` (doctor's saved findings: pinned ceiling,
host allocator, NCCL smoke test) and ``gpus`` (one record per GPU, as NVML reports it), and an
optional fourth, ``runtime`` (``facts.runtime.RuntimeFacts``: the SGLang release, capabilities and
server image, each with its source; a file without it reads as before). ``load_facts_file`` is
the one reader: ``plan --facts``, ``up``/``serve --facts`` and ``fleet`` (a box's ``facts``)
read a facts file or a saved doctor report through it. Plans
made from a facts file read nothing of the machine they run on except the model folder and
the L3 directory's free space: the same file gives the same plan on the host and inside the
container, which is what makes ``up`` and ``docker compose up`` reach the same digest.

Write one with ``escha-deploy plan --write-facts FILE`` (this host, with its fresh doctor
findings) or by hand. Bytes are ``int``.
"""

from __future__ import annotations

import datetime as _dt
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, StrictBool, StrictInt, StrictStr, ValidationError, field_validator

# the facts file's models (re-exported: up, serve and compose name them from here)
from escha_deploy.facts.file import (FACTS_SCHEMA_VERSION, MAX_FACT_BYTES, FactsFile, GpuRecord, HostSection,  # noqa: F401
                         inventory_from_records, records_from_inventory)
from escha_deploy.facts.gpus import facts_towards
from escha_deploy.facts.runtime import RuntimeFacts
from escha_deploy.facts.saved import DoctorFindings
from escha_deploy.utils.paths import CONTAINER_FACTS_PATH, FACTS_ENV  # noqa: F401  (re-exported: defined in paths, which builds no model)

if TYPE_CHECKING:
    from escha_deploy.facts.host import HostFacts


def load_facts_file(path: str | Path, what: str = "the facts file", hint: str | None = None) -> FactsFile:
    """Read and check a facts file or a saved doctor report (``facts_file_from_data``): the one
    reader of ``--facts``, ``ESCHA_FACTS`` and a fleet box's ``facts``. ``what``/``hint`` name the
    file in the reader's messages (``jsonio.read_json``). Raises ``BadInput`` (exit 2) naming the
    file and the field, or both schema versions when the file is of another one."""
    from escha_deploy.utils.jsonio import read_json

    p = Path(path)
    return facts_file_from_data(read_json(p, what, hint), p)


def facts_file_from_data(data: object, p: Path) -> FactsFile:
    """``load_facts_file`` for JSON already read from ``p`` (named in the errors): a doctor
    report through ``facts_from_doctor_report``, else a facts file of this schema version."""
    from escha_deploy.utils.errors import BadInput

    if not isinstance(data, dict):
        raise BadInput(f"{p}: a facts file is a JSON object")
    if is_doctor_report(data):
        return facts_from_doctor_report(data, p)
    version = data.get("schema_version")
    if type(version) is not int or version != FACTS_SCHEMA_VERSION:  # true == 1 and 1.0 == 1 in Python
        from escha_deploy import __version__

        raise BadInput(f"{p}: schema_version: facts file schema version {version!r}; this escha-deploy "
                       f"{__version__} reads version {FACTS_SCHEMA_VERSION} (write one with "
                       "`escha-deploy plan --write-facts FILE`, or pass `escha-deploy doctor --format json`'s report)")
    try:
        return FactsFile.model_validate(data)
    except ValidationError as exc:
        raise BadInput(*(f"{p}: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors())) from None


_FactBytes = Annotated[StrictInt, Field(ge=0, le=MAX_FACT_BYTES)]


class _View(BaseModel):
    """Base of the parts of a doctor report ``facts_from_doctor_report`` reads: strict types
    (JSON's own: an int is no string, no bool, no float), other keys ignored."""

    model_config = ConfigDict(extra="ignore", defer_build=True)


class _ReportMemory(_View):
    mem_total_bytes: Annotated[StrictInt, Field(gt=0, le=MAX_FACT_BYTES)] | None = None
    hugetlb_bytes: _FactBytes | None = None
    cgroup_limit_bytes: Annotated[StrictInt, Field(gt=0, le=MAX_FACT_BYTES)] | None = None


class _ReportPinned(_View):
    largest_bytes: _FactBytes | None = None
    reached: StrictBool | None = None


class _ReportNccl(_View):
    ok: StrictBool | None = None
    env: dict[StrictStr, StrictStr] = Field(default_factory=dict)


class _ReportProbes(_View):
    source: StrictStr | None = None
    skipped: object = None
    unavailable: object = None
    host_allocator: Literal["register", "pinned"] | None = None
    pinned: _ReportPinned | None = None
    nccl: list[_ReportNccl] = Field(default_factory=list)


class _ReportImage(_View):
    ref: StrictStr | None = None
    id: StrictStr | None = None


class _ReportFacts(_View):
    platform: Literal["linux", "wsl2"] | None = None
    host_id: StrictStr | None = None
    wsl_networking_mode: StrictStr | None = None
    image: _ReportImage | None = None
    memory: _ReportMemory | None = None
    memory_error: StrictStr | None = None
    probes: _ReportProbes | None = None
    gpus: dict | None = None


class _Report(_View):
    """``doctor --format json``'s report as far as a facts file needs it."""

    created_at: StrictStr | None = None
    facts: _ReportFacts

    @field_validator("created_at")
    @classmethod
    def _iso_time(cls, value: str | None) -> str | None:
        from .file import iso_time

        return iso_time(value)


def is_doctor_report(data: object) -> bool:
    """True for ``escha-deploy doctor --format json``'s report (``checks`` and ``facts``, no
    ``schema_version``), which ``--facts`` and ``fleet plan`` read as a facts file."""
    return (isinstance(data, dict) and "schema_version" not in data and isinstance(data.get("facts"), dict)
            and "checks" in data)


def _gpus_of_an_earlier_report(gpus: dict, source: str | Path) -> tuple[dict, dict[str, str]]:
    """A doctor report's ``facts.gpus`` in today's shape (``facts.gpus.GpuInventory``: one
    ``GpuRecord`` per GPU, each with its pair facts), and the keys renamed on the way (today's
    name -> the report's, for error messages). Reports written before escha-deploy kept one GPU
    shape list each GPU's memory as ``vram_bytes`` and the pair facts at the top, keyed
    ``"i-j"`` (``p2p``, ``topology``); a report in today's shape comes back as it is. Raises
    ``BadInput`` for a pair key that is not ``"i-j"``."""
    from escha_deploy.utils.errors import BadInput

    legacy = {k: gpus[k] for k in ("p2p", "topology") if k in gpus}
    records = gpus.get("gpus")
    old_memory = isinstance(records, list) and any(isinstance(g, dict) and "vram_bytes" in g for g in records)
    if not legacy and not old_memory:
        return gpus, {}
    out = {k: v for k, v in gpus.items() if k not in legacy}
    renamed: dict[str, str] = {}
    pair_facts: dict[str, dict[tuple[int, int], str]] = {}
    for key, facts in legacy.items():
        if not isinstance(facts, dict):
            raise BadInput(f"{source}: facts.gpus.{key}: Input should be a valid dictionary")
        pair_facts[key] = {}
        for pair, fact in facts.items():
            i, sep, j = str(pair).partition("-")
            if not (sep and i.isdigit() and j.isdigit()):
                raise BadInput(f"{source}: facts.gpus.{key}: {pair!r} is not a GPU pair (\"i-j\", e.g. \"0-1\")")
            pair_facts[key][int(i), int(j)] = fact
    if isinstance(records, list):
        fixed = []
        for g in records:
            if isinstance(g, dict):
                g = dict(g)
                if "vram_bytes" in g:
                    g["memory_total_bytes"] = g.pop("vram_bytes")
                    renamed["memory_total_bytes"] = "vram_bytes"
                for key, facts in pair_facts.items():
                    g[key] = facts_towards(g.get("index"), facts)
            fixed.append(g)
        out["gpus"] = fixed
    return out, renamed


def facts_from_doctor_report(report: dict, source: str | Path = "report") -> FactsFile:
    """The facts file a saved doctor report describes: the one conversion ``plan --facts``,
    ``up``/``serve --facts`` and ``fleet plan`` share. ``host`` from ``facts.platform``,
    ``facts.memory`` (MemTotal, huge pages, cgroup limit) and ``facts.host_id``; ``findings``
    from ``facts.probes`` (pinned ceiling, allocator, NCCL smoke test) when they ran; ``gpus``
    from ``facts.gpus`` (NVML only); ``host.wsl_networking_mode`` from the same key of ``facts``; ``runtime`` from ``facts.image`` (the server image on the box's
    daemon: its reference and configuration digest; the release is not in a report). Readings of a moment (MemAvailable, cgroup usage) are left
    out. Raises ``BadInput`` naming the file and the missing or wrong key."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.facts.gpus import GpuInventory

    if not isinstance(report, dict) or not isinstance(report.get("facts"), dict):
        raise BadInput(f"{source}: facts: missing; this is not a doctor report (`escha-deploy doctor --format json`)")
    try:
        view = _Report.model_validate(report)
    except ValidationError as exc:  # a key of the wrong type: its path, e.g. facts.memory.mem_total_bytes
        raise BadInput(*(f"{source}: {'.'.join(str(x) for x in e['loc'])}: {e['msg']}" for e in exc.errors()[:5])) from None
    facts = view.facts
    memory = facts.memory or _ReportMemory()
    if not memory.mem_total_bytes:
        raise BadInput(f"{source}: facts.memory.mem_total_bytes: missing "
                       f"({facts.memory_error or 'no memory facts'})")
    probes = facts.probes or _ReportProbes()
    pinned = probes.pinned or _ReportPinned()
    # probes that could not run there (no torch: `unavailable`) are unknown, never findings
    ran = probes.source not in (None, "not run") and not probes.skipped and not probes.unavailable
    created = view.created_at or ""
    findings = None
    if ran:
        try:
            findings = DoctorFindings(
                created_at=created, host_id=facts.host_id or "", platform=facts.platform,
                host_allocator=probes.host_allocator, pinned_ceiling_bytes=pinned.largest_bytes,
                pinned_ceiling_reached=bool(pinned.reached),
                nccl_smoke_ok=probes.nccl[-1].ok if probes.nccl else None,
                # the environment the smoke test passed with, as doctor saves it (run.probe_findings)
                nccl_env=next((dict(a.env) for a in probes.nccl if a.ok), {}))
        except ValidationError as exc:  # an env naming another program's variable
            raise BadInput(*(f"{source}: facts.probes.nccl.env: {e['msg']}" for e in exc.errors()[:5])) from None
    gpus, renamed = _gpus_of_an_earlier_report(facts.gpus, source) if facts.gpus else (None, {})
    try:
        inv = GpuInventory.model_validate(gpus) if gpus else None
    except ValidationError as exc:  # the key as the report spells it
        raise BadInput(*(f"{source}: facts.gpus.{'.'.join(renamed.get(str(x), str(x)) for x in e['loc'])}: {e['msg']}"
                         for e in exc.errors()[:5])) from None
    image = facts.image
    try:
        runtime = None if image is None or not (image.ref or image.id) else RuntimeFacts(
            image_ref=image.ref, image_id=image.id)
    except ValidationError as exc:  # the image's fields as the report names them
        raise BadInput(*(f"{source}: facts.image.{str(e['loc'][0]).removeprefix('image_')}: {e['msg']}"
                         for e in exc.errors()[:5])) from None
    try:
        return FactsFile(
            escha_version=None, created_at=created or None,
            host=HostSection(platform=facts.platform or "linux", mem_total_bytes=memory.mem_total_bytes,
                             hugetlb_bytes=memory.hugetlb_bytes or 0, cgroup_limit_bytes=memory.cgroup_limit_bytes,
                             host_id=facts.host_id or "", wsl_networking_mode=facts.wsl_networking_mode),
            findings=findings, gpus=records_from_inventory(inv), runtime=runtime)
    except ValidationError as exc:
        raise BadInput(*(f"{source}: facts.{'.'.join(str(x) for x in e['loc'])}: {e['msg']}"
                         for e in exc.errors()[:5])) from None


def facts_from_host(host: HostFacts, findings: DoctorFindings | None, gpus: list[GpuRecord] = (), *,
                    runtime: RuntimeFacts | None = None) -> FactsFile:
    """A facts file describing ``host`` (live facts) with ``findings`` and ``runtime`` (``None``:
    no runtime section); MemAvailable, cgroup usage and free disk are left out: they are readings
    of a moment, stale by the next start."""
    from escha_deploy import __version__

    return FactsFile.from_host(host, findings, gpus, runtime=runtime, escha_version=__version__,
                               created_at=_dt.datetime.now(_dt.timezone.utc).isoformat(timespec="seconds"))
