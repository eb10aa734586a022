"""`up` and `up --dry-run` before anything touches the daemon's state: the pipeline
(``escha_deploy.pipeline``: gather -> decide -> render) with the image's runtime, and the
checks of what that launch needs here.

``prepare``: read the image's capabilities and SGLang release (with a docker client), run the
pipeline for that runtime, and collect what refuses the launch (exit 3, nothing created): an
unsafe plan, missing capabilities, an unlaunchable container spec, a model folder not here.
The secret-file readers ``up``, ``serve`` and ``bench`` share live here too.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from escha_deploy.utils.errors import BadInput, Refused
from escha_deploy.pipeline import (LaunchOptions, Options, RuntimeClaim, facts_source, hicache_off_warning,
                                   plan_request, profile_file, secret_path_problems, shown_path)

if TYPE_CHECKING:
    from escha_deploy.facts.provenance import ProvenanceKind
    from escha_deploy.pipeline.spec import ContainerSpec, LaunchSpec
    from escha_deploy.planner.result import Plan
    from escha_deploy.profile import Profile
    from escha_deploy.profile.models import Runtime

    from .drift import PlannedSizes


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


def _loops(p: Path) -> bool:
    """Whether following the link ``p`` never ends (``ELOOP``: it names itself, or a ring)."""
    import errno

    try:
        os.stat(p)
    except OSError as exc:
        return exc.errno == errno.ELOOP
    return False


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
            if os.path.islink(p):  # exists() follows it: a loop (ELOOP) or a missing target
                why = "a symbolic link that loops" if _loops(p) else "a symbolic link to no file"
                from escha_deploy.utils.termtext import shown

                raise BadInput(f"{what}: cannot read a value from {shown(path)}: {why}")
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


def image_capabilities(client, image: str, labels: dict[str, str] | None = None) -> list[str] | None:
    """Capabilities an image declares: its ``io.escha.runtime.capabilities`` label, else the
    runtime description file read from the image; None for a stock image. ``labels``: the
    image's labels when the caller already read them (saves an inspect)."""
    from escha_deploy.sglang.capabilities import RUNTIME_DESCRIPTION_PATH
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
    from escha_deploy.utils.jsonio import loads_json

    data = loads_json(raw, f"{image}:{RUNTIME_DESCRIPTION_PATH}", "the runtime description")
    try:
        return list(RuntimeDescription.model_validate(data).capabilities)
    except ValueError:
        raise BadInput(f"{image}:{RUNTIME_DESCRIPTION_PATH}: not a runtime description") from None


@dataclass(frozen=True)
class ImageRuntime:
    """The runtime ``up`` plans for, as the image tells it (``image_runtime``).

    ``capabilities``: the image's (None: not read, the plan assumes the profile's
    ``runtime.needs``); ``source``: where they came from, for the dry run's facts; ``missing``:
    the profile's needs the image lacks; ``refused_by``: the ``image`` and ``capabilities``
    refusals (``Prepared.refused_by``'s first checks); ``present``: whether the daemon had the
    image (None when no daemon was asked); ``claim``: what the image says of its runtime (its
    ``io.escha.runtime.sglang`` label's release, its capabilities), the source
    ``pipeline.resolve_runtime`` chooses the release from (else the profile's
    ``runtime.sglang_version``); ``kind``: the capabilities' kind of source."""

    capabilities: list[str] | None
    source: str
    missing: list[str]
    refused_by: dict[str, list[str]]
    present: bool | None
    claim: RuntimeClaim
    kind: ProvenanceKind = "profile"


def image_runtime(client, profile: Profile, *, need_image: bool = True, image_files: bool = True) -> ImageRuntime:
    """Read the runtime of ``profile``'s image through ``client`` (None: no daemon, the profile's
    needs are assumed): its capability label or, with ``image_files``, its runtime description
    file; its SGLang release label. ``need_image``: an absent image is a refusal. Raises
    ``BadInput`` for an image reference the daemon refuses."""
    from escha_deploy.runtime.description import LABEL_SGLANG

    from . import docker as dk

    caps: list[str] | None = None
    caps_source = "assumed: the profile's runtime.needs (image not read)"
    caps_kind: ProvenanceKind = "profile"
    by: dict[str, list[str]] = {}
    missing: list[str] = []
    present: bool | None = None
    labels = None
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
            caps_kind = "image_labels" if capabilities_from_labels(labels) is not None else "runtime_description"
            missing = [c for c in profile.runtime.needs if c not in caps]
            by["capabilities"] = [f"{profile.container.image}: runtime lacks capability {c!r}" for c in missing]
        else:
            caps_source = (f"assumed: the profile's runtime.needs (the image {profile.container.image} has no "
                           "capability label; its runtime description file was not read)")
    image_release = (labels or {}).get(LABEL_SGLANG) if present else None
    claim = RuntimeClaim(image_release, f"the image {profile.container.image} (label {LABEL_SGLANG})",
                         None if caps is None else tuple(caps), caps_source, caps_kind)
    return ImageRuntime(caps, caps_source, missing, by, present, claim, caps_kind)


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
    #: ``container settings``, ``model folder``, ``L3 folder`` (what ``up --dry-run`` lists per check)
    refused_by: dict[str, list[str]] = field(default_factory=dict)
    #: whether the daemon had the image: None when no daemon was asked
    image_present: bool | None = None
    #: the image's runtime the plan is for (``image_runtime``), for a second plan of the same launch
    runtime: ImageRuntime | None = None

    def refuse(self) -> None:
        """Raise ``Refused`` (exit 3) with every refusal, when there is any."""
        if self.refusals:
            raise Refused(*self.refusals, hint=self.hint)

    @property
    def hint(self) -> str | None:
        if self.missing_capabilities:
            from escha_deploy.runtime.description import capability_hint

            return capability_hint(self.missing_capabilities, native=False)
        if self.plan.verdict == "unsafe":
            return f"`escha-deploy plan --profile {self.profile_ref}` shows the budget"
        return None

    def dry_run(self) -> dict[str, Any]:
        """What `up --dry-run` prints: the plan's verdict, reasons and warnings as `plan` gives
        them, the missing capabilities, the digest, where each fact came from, the container
        config, the server argv and the server's environment (``LaunchSpec.env``: what ``serve
        --spec`` sets for SGLang in the container, as ``serve --print`` shows it; redacted)."""
        from escha_deploy.utils.secretargs import redact_argv

        from escha_deploy.utils.redact import Redactor

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
            mounts_here: bool | None = None, runtime: ImageRuntime | None = None) -> Prepared:
    """The pipeline for ``up``: load, gather, decide for the image's runtime, render the launch
    spec (``pipeline.plan_request``: this machine or ``--facts``, the image's ``RuntimeClaim``).

    With ``client``, reads the image's capabilities (``need_image``: a missing image is a
    refusal); without, the plan assumes the image provides the profile's needs.
    ``image_files``: for an image without the capability label, read its runtime description
    file (a created, never started, removed container); ``up --dry-run`` passes False and its
    capabilities then stay unchecked. ``mounts_here``: the model folder to bind-mount must be a
    folder on this host (default: with ``client``, a launch here). Raises
    ``BadInput`` (exit 2) for bad input, including a flag the runtime would refuse; never
    raises for an unsafe plan, missing capabilities or an unusable file L3 folder: those are
    ``Prepared.refusals``, so
    ``up --dry-run`` can show them as ``plan`` does before exiting 3 (``Prepared.refuse``).
    ``spec_file``: where ``up`` will write the spec (the container mounts it). ``runtime``: the
    image's runtime as an earlier ``prepare`` read it (``Prepared.runtime``): ``up`` plans again
    after doctor's probes measured this host, without loading the profile or reading the image
    a second time.
    """
    from escha_deploy.profile import load_profile

    from . import docker as dk

    profile = profile or load_profile(profile_ref, overrides)
    secret_path_problems(profile)
    facts = facts_source(facts_path, launch=True)
    rt = runtime or image_runtime(client, profile, need_image=need_image, image_files=image_files)
    by = {k: list(v) for k, v in rt.refused_by.items()}
    req = plan_request(profile, facts, rt.claim, Options(launch=LaunchOptions(
        overrides=tuple(overrides), profile_file=profile_file(profile_ref), spec_file=spec_file)))
    plan, launch = req.plan, req.launch
    assert launch is not None
    if plan.verdict == "unsafe":
        by["plan"] = plan.refusal_lines()
    warnings = [f"plan: {w}" for w in plan.warnings]
    if (off := hicache_off_warning(plan)) is not None:
        warnings.insert(0, off)
    spec = launch.container
    by["container settings"] = dk.check_spec(spec)
    if client is not None if mounts_here is None else mounts_here:  # a launch here: the model folder is mounted
        by["model folder"] = [f"model.host_dir / container.model_dir: {m.source} is not a folder on this host"
                              for m in spec.mounts if m.target == profile.model.path and not os.path.isdir(m.source)]
    by["L3 folder"] = list(req.gathered.l3_refusals)
    by = {k: v for k, v in by.items() if v}
    refusals = [line for lines in by.values() for line in lines]
    return Prepared(profile, plan, launch, spec, dk.create_args(spec), list(launch.argv), warnings, refusals,
                    list(rt.missing), rt.source, profile_ref=profile_ref, refused_by=by, image_present=rt.present,
                    runtime=rt)


def planned_sizes(plan: Plan, runtime: Runtime | None = None) -> PlannedSizes:
    """The plan's per-rank figures as ``drift.PlannedSizes`` (planner/result.py ``PerRank``), the
    figures ``up`` and ``serve`` compare with what the server logged and reports once ready.

    With the profile's ``runtime`` section (``Profile.runtime``) also the two figures it sets:
    ``context_length`` (tokens, ``--context-length``; None when unset: SGLang takes the model
    config's) and the effective max running requests, SGLang 0.5.19's
    ``kv_cache_configurator.py: KVCacheConfigurator.resolve_max_num_reqs`` on the planned pools:
    ``min(--max-running-requests, device KV tokens // 2, device mamba slots //
    planner.MAMBA_SLOTS_PER_REQUEST)`` (the mamba cap on a hybrid model; 5 slots per request
    with extra_buffer and the overlap scheduler, the planner's assumption); None when the
    profile leaves ``max_running_requests`` to SGLang's estimate."""
    from escha_deploy.planner import MAMBA_SLOTS_PER_REQUEST

    from .drift import PlannedSizes

    pr = plan.per_rank
    hic = plan.hicache.enabled
    mrr = runtime.max_running_requests if runtime is not None else None
    if mrr is not None:
        mrr = min(mrr, pr.device_kv_tokens // 2)
        if pr.device_mamba_slots:
            mrr = min(mrr, pr.device_mamba_slots // MAMBA_SLOTS_PER_REQUEST)
    return PlannedSizes(
        kv_tokens=pr.device_kv_tokens,
        host_kv_tokens=pr.host_kv_tokens if hic else None,
        host_kv_bytes=pr.host_kv_bytes if hic else None,
        host_mamba_bytes=(pr.host_mamba_bytes or None) if hic else None,
        device_mamba_slots=pr.device_mamba_slots or None,
        max_running_requests=mrr,
        context_length=runtime.context_length if runtime is not None else None,
    )
