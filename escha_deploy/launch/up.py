"""The `up` path: from a profile to a ready server container on this host's Docker.

``up`` is gather, plan, apply: the GPU runtime check, doctor's in-image probes when no fresh
findings exist (so the pinned ceiling and allocator they measure are in the plan), then
``prepare`` (profile, facts, image capabilities, plan, ``LaunchSpec``; a flag the runtime would
refuse exits 2, every other refusal 3, and nothing is created), the spec written to a file the
container mounts read-only (it runs ``serve --spec``, which re-plans nothing), the stale
containers and the port, create/start through docker-py, wait for ready, switch the restart
policy, and check the logged sizes against the plan. Progress goes to the caller's ``Report``.

The preflight is one ordered list, ``CHECKS`` (each entry: its name, its function, what it
needs, the exit code it refuses with); ``up`` runs it and stops at the first failure,
``dry_run`` (``up --dry-run``) runs the same list without stopping and without creating
anything, and reports each check by name. A new check is one more entry.
"""

from __future__ import annotations

import errno
import os
import shlex
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from escha_deploy.utils.errors import BadInput, EschaError, Failed, Internal, Refused
from escha_deploy.pipeline.spec import CONTAINER_JIT_CACHE
from escha_deploy.utils.paths import plan_view_path, spec_path  # noqa: F401 (re-exported: up writes both)

from .prepare import Prepared, planned_sizes, prepare, read_secret
from . import first_use_check, guard, image_preflight
from .image_build import build_image
from .logpump import LogPump
from .progress import Report, quiet

if TYPE_CHECKING:
    from escha_deploy.pipeline.spec import LaunchSpec
    from escha_deploy.profile import Profile

#: Doctor's GPU probes in the profile's image (``doctor.doctor_probe.doctor_in_image``):
#: ``probe(client, prepared, report=report) -> bool``, True when they measured this host now
#: (the facts changed, so `up` plans again). Doctor sits above launch in the import contract
#: (.importlinter), so `up` takes it from its caller instead of importing it.
DoctorProbe = Callable[..., bool]

#: Test switch for sandboxes whose Docker cannot raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE:
#: runc fails with "error setting rlimit type 8"): memlock becomes this process's hard limit.
#: The stand-in tests set it; a real deployment never does (pinned pools need memlock -1).
CLAMP_MEMLOCK_ENV = "ESCHA_TEST_CLAMP_MEMLOCK"


@dataclass
class UpResult:
    """What `up` reports: the container, its endpoint URL, seconds to ready (None when it was
    already running), and one line per logged size that differs from the plan."""

    profile: str
    container: str
    endpoint: str
    state: str
    ready_seconds: float | None
    drift: list[str]
    note: str = ""


def fresh_findings_saved() -> bool:
    """True when doctor's saved findings for this host are younger than a day
    (``findings.MAX_AGE``) and were measured under the driver loaded now: `up` then reuses them
    instead of probing in the image."""
    from escha_deploy.facts.saved import load_findings
    from escha_deploy.facts.machine import host_id
    from escha_deploy.utils.paths import doctor_findings_path

    saved = load_findings(doctor_findings_path(), host_id=host_id())
    return saved is not None and saved.is_fresh(driver_now=driver_now())


def driver_now() -> str | None:
    """The NVIDIA driver loaded now, as NVML says (None: no NVML, no driver, no GPU)."""
    from escha_deploy.facts.machine import read_gpu_facts

    gpus = read_gpu_facts()
    return gpus.driver_version if gpus is not None else None


def write_plan_view(plan, plan_digest: str, spec_file: Path, watch=None) -> None:
    """The plan figures ``status`` compares the running server with (``CONTAINER.plan.json``)."""
    from escha_deploy.utils.paths import replace_file
    from escha_deploy.launch.planview import plan_view

    replace_file(plan_view_path(spec_file), plan_view(plan, plan_digest, watch).model_dump_json(indent=2).encode())


def write_spec(launch: LaunchSpec, path: Path) -> None:
    """Write the spec document atomically, readable by the container's user. Raises
    ``BadInput`` (exit 2), one line naming the file and the system's reason, when the cache
    folder cannot take it (``XDG_CACHE_HOME`` read-only, full, or a file); nothing is left
    behind and nothing is started."""
    from escha_deploy.pipeline.spec import spec_json
    from escha_deploy.utils.paths import replace_file

    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        replace_file(path, spec_json(launch).encode())
        path.chmod(0o644)
    except OSError as exc:
        # mkdir(exist_ok=True) says "File exists" for a file where a folder should be
        reason = os.strerror(errno.ENOTDIR) if isinstance(exc, FileExistsError) else exc.strerror or str(exc)
        raise BadInput(f"{path}: cannot write the launch spec: {reason}",
                       hint="up keeps its launch specs under $XDG_CACHE_HOME/escha-deploy (default "
                       "~/.cache/escha-deploy): make it writable or point XDG_CACHE_HOME at a folder that is") from None


def gpu_runtime_refusal(client, profile) -> Refused | None:
    """`up`'s GPU runtime check: the refusal (exit 3) when the profile wants GPUs
    (``container.gpus`` not ``[]``) and the daemon reports no NVIDIA runtime or CDI spec
    (``docker.gpu_runtime``, one ``docker info``); None when the check passes."""
    from . import docker as dk

    if profile.container.gpus != [] and dk.gpu_runtime(client) is None:
        return Refused(
            "docker: no NVIDIA GPU runtime (docker info lists no nvidia runtime or CDI spec); "
            "the server needs GPUs",
            hint="install the NVIDIA Container Toolkit and restart Docker; `escha-deploy doctor` checks it",
        )
    return None


def memlock_refusal(client, prep: Prepared) -> Refused | None:
    """`up`'s memlock check, before anything of the server is created: the refusal (exit 3)
    when the launch asks for ``--ulimit memlock=-1`` and this daemon cannot start a container
    with it (``docker.memlock_probe``: a one-second ``true`` container of the image); None when
    it can, when the image is not here (``prepare`` refuses that) or under the tests' switch
    ``ESCHA_TEST_CLAMP_MEMLOCK`` (memlock is then clamped to what this process may lock)."""
    from . import docker as dk

    if os.environ.get(CLAMP_MEMLOCK_ENV) == "1" or prep.image_present is False or prep.refusals:
        return None
    if not any(u["name"] == "memlock" and u["soft"] == -1 for u in prep.args.get("ulimits", [])):
        return None
    image = prep.args["image"]
    error = dk.memlock_probe(client, image)
    if error is None:
        return None
    return Refused(dk.memlock_refusal_line(image, error), hint=dk.MEMLOCK_DAEMON_FIX)


def existing_containers(client, prep: Prepared) -> tuple[object | None, list]:
    """The profile's containers as `up` sees them: ``(running, stale)``. ``running``: one that
    was confirmed ready (restart policy switched), which makes `up` a no-op; ``stale``: those
    `up` stops and removes first (never confirmed ready, or exited). Raises ``Refused`` (exit 3)
    when another live `up` is starting the profile (``guard.LABEL_UP_OWNER``). Reads only."""
    from . import docker as dk

    stale = []
    for c in dk.find(client, prep.profile.name):
        policy = (c.attrs.get("HostConfig", {}).get("RestartPolicy") or {}).get("Name") or "no"
        if c.status in ("running", "restarting") and policy != "no":
            return c, []
        starter = c.labels.get(guard.LABEL_UP_OWNER)
        if c.status in ("created", "running") and guard.owner_alive(starter) is not False:
            raise Refused(f"up: another `up` (pid {guard.owner_pid(starter)}) is starting profile "
                          f"{prep.profile.name} (container {c.name}, {c.status}); not starting a second",
                          hint=f"wait for it, or stop it: `escha-deploy down --profile {shlex.quote(prep.profile_ref or prep.profile.name)}`")
        stale.append(c)
    return None, stale


def stale_line(c) -> str:
    """How `up` names a stale container it replaces."""
    return (f"stale container {c.name} ({c.status}, never confirmed ready)" if c.status == "running"
            else f"stale container {c.name} ({c.status})")


def port_refusal(client, prep: Prepared, *, replaced: Sequence[str] = ()) -> Refused | None:
    """`up`'s port check, once stale containers are gone: the refusal (exit 3) when
    ``container.port`` cannot be bound, naming its holder (``docker.port_owner``); None when
    free. ``replaced``: names of stale containers `up` would stop first (a dry run, which stops
    nothing, counts their ports as free)."""
    from . import docker as dk

    spec = prep.spec
    owner = dk.port_owner(client, spec.port_host_ip, spec.port_host)
    words = (owner or "").split()
    if words[:1] == ["container"] and words[1:2] and words[1] in replaced:
        return None
    if owner and owner.split()[:2] == ["container", spec.name]:  # created since the check above
        return Refused(f"up: another `up` is starting profile {prep.profile.name} (container "
                       f"{spec.name} holds {spec.port_host_ip}:{spec.port_host}); not starting a second",
                       hint=f"wait for it, or stop it: `escha-deploy down --profile {shlex.quote(prep.profile_ref or prep.profile.name)}`")
    if owner:
        return Refused(f"container.port: {spec.port_host_ip}:{spec.port_host} is held by {owner}",
                       hint="stop it, or set container.port to a free port")
    return None


def read_api_key(profile) -> str | None:
    """The API key from ``container.api_key_file`` (``prepare.read_secret``: ``BadInput``,
    exit 2, naming the file when it cannot be read), or None when the profile sets none."""
    f = profile.container.api_key_file
    return read_secret(f, "container.api_key_file") if f else None


def up(profile_ref: str, overrides: Sequence[str] = (), *, timeout_s: float | None = None,
       build: bool = False, report: Report = quiet, facts_path: str | None = None,
       on_phase: Callable[[str], None] | None = None, ready: guard.Ready | None = None,
       loaded: Profile | None = None, doctor_probe: DoctorProbe | None = None) -> UpResult:
    """Start the profile's server and return once it is ready (see module docstring).

    ``facts_path``: plan from a facts file instead of this machine. ``report`` receives
    progress and warnings; ``on_phase`` each startup phase once (default: an ``info`` line with
    the seconds since start). Raises ``BadInput`` (2, a flag the runtime would refuse) or
    ``Refused`` (3) at preflight (``CHECKS``, in order, stopping at the first failure), with
    nothing created, also when another `up` is starting the profile (``guard``); ``Failed`` (4)
    when the server exits, is killed, is stopped by `down`, refuses the API key or is not ready
    in time (the diagnosis lines are its problems); ``guard.Interrupted`` (128 + N) when SIGINT
    or SIGTERM arrives while waiting: the container is then stopped and kept. ``ready``: set to
    this `up`'s container once it is confirmed ready, for a caller whose own
    ``guard.signals_raise`` scope (opened before this call) covers the time after the return
    (the CLI's log follow). ``loaded``: ``profile_ref`` with ``overrides`` when the caller loaded
    it already (the CLI, which reads its API key for ``--canary``): it is loaded once.
    ``doctor_probe``: doctor's probes in the image (``DoctorProbe``), run by the ``doctor
    probes`` check when GPUs are requested and no fresh findings are saved (None: that check
    fails with ``Internal``, exit 1, when it is needed; every command passes doctor's).
    """
    from escha_deploy.profile import load_profile

    from . import docker as dk

    # the profile first: a bad one is the user's to fix (exit 2) whether or not Docker answers
    profile = loaded or load_profile(profile_ref, overrides)
    ctx = Preflight(profile_ref, tuple(overrides), profile, build=build, facts_path=facts_path, dry=False,
                    report=report, doctor_probe=doctor_probe)
    run_preflight(ctx)
    client, prep, sfile = ctx.client, ctx.prep, ctx.spec_file
    assert prep is not None
    spec = prep.spec
    from .first_request import endpoint_of

    endpoint = endpoint_of(spec.port_host_ip, spec.port_host)  # an IPv6 bind address bracketed (RFC 3986)
    if (running := ctx.running) is not None:
        return UpResult(prep.profile.name, running.name, endpoint, "running", None, [],
                        note=f"already running (container {running.name}); nothing to do")
    args = prep.args
    if os.environ.get(CLAMP_MEMLOCK_ENV) == "1":
        import resource

        hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
        args = {**args, "ulimits": [u if u["name"] != "memlock" else {**u, "soft": hard, "hard": hard}
                                    for u in args["ulimits"]]}
        report("warning", f"up: {CLAMP_MEMLOCK_ENV}=1: memlock clamped to {hard} B (test switch)")
    write_spec(prep.launch, sfile)
    try:
        write_plan_view(prep.plan, prep.launch.plan_digest, sfile, prep.profile.watch)
    except OSError as exc:
        sfile.unlink(missing_ok=True)
        raise BadInput(f"{plan_view_path(sfile)}: cannot write the plan view: {exc.strerror or exc}") from None
    report("info", f"up: plan {prep.launch.plan_digest[:12]}, spec {sfile}")
    me = guard.owner_label()
    args = {**args, "labels": {**args["labels"], guard.LABEL_UP_OWNER: me}}
    with guard.interruptible(client, name=spec.name, owner=me, stop_timeout_s=spec.stop_timeout_s,
                             profile=prep.profile_ref or prep.profile.name, report=report) as held:
        held.container = c = dk.create_and_start(client, args)
        res = _wait(client, c, prep, endpoint, ctx.api_key, timeout_s=timeout_s, report=report,
                    on_phase=on_phase)
        if ready is not None:
            ready.container = c.name
        return res


@dataclass
class Preflight:
    """One preflight's state, shared by its checks: what `up` (``dry=False``) or ``up
    --dry-run`` (``dry=True``) was asked, and what the checks found so far (``client``: None
    while the daemon has not answered; ``prep``: ``prepare``'s answer once a check needs the
    plan; ``running``/``stale``: the profile's containers; ``api_key``: the key read;
    ``failed``: the names of the checks that failed so far, in order: only the dry run goes on
    past one)."""

    profile_ref: str
    overrides: tuple[str, ...]
    profile: Profile
    build: bool
    facts_path: str | None
    dry: bool
    report: Report = quiet
    client: Any = None
    prep: Prepared | None = None
    running: Any = None
    stale: list = field(default_factory=list)
    api_key: str | None = None
    failed: list[str] = field(default_factory=list)
    doctor_probe: DoctorProbe | None = None
    #: why the checks that need the daemon did not run (the dry run, with no client)
    daemon_note: str = "the Docker daemon does not answer"

    @property
    def spec_file(self) -> Path:
        from escha_deploy.pipeline.spec import container_name

        return spec_path(container_name(self.profile.name))

    def planned(self) -> Prepared:
        """``prepare`` once, as each mode needs it: `up` builds the image first under
        ``--build``; the dry run plans without the daemon when it does not answer, does not
        refuse an absent image under ``--build``, reads no image file and checks the mounts here."""
        if self.prep is None:
            if self.dry:
                self.prep = prepare(self.profile_ref, self.overrides, client=self.client,
                                    need_image=not self.build, profile=self.profile,
                                    facts_path=self.facts_path, spec_file=str(self.spec_file),
                                    image_files=False, mounts_here=True)
            else:
                if self.build:
                    rt = self.profile.runtime
                    build_image(self.client, self.profile.container.image, base_image=rt.base_image,
                                release=rt.sglang_version, report=self.report)
                self.prep = prepare(self.profile_ref, self.overrides, client=self.client, profile=self.profile,
                                    facts_path=self.facts_path, spec_file=str(self.spec_file))
        return self.prep


#: What a check's function answers when it passes or does not apply: ``(state, detail)``, the
#: state ``ok``, ``not run`` (dry run only) or ``not needed``. A failing check raises.
Outcome = tuple[str, str]


@dataclass(frozen=True)
class Check:
    """One entry of `up`'s preflight (``CHECKS``).

    ``run(ctx)`` returns an ``Outcome`` or raises the ``EschaError`` `up` refuses with
    (``refuses``: its exit code, 3 refused or 2 bad input); it sees ``ctx.dry`` and does in `up`
    what the dry run only describes (doctor's probes, replacing stale containers).
    ``not_needed(ctx)``: why `up` would skip it for this profile (None: it is needed).
    ``needs``: what it needs: ``daemon`` (a dry run without one reports it ``not run``,
    ``without_daemon`` added to the line), ``plan`` (``prepare``'s answer; its refusals, by the
    check named in ``Prepared.refused_by``, fail it), ``container`` (a throw-away container of
    the image: only `up` makes one)."""

    name: str
    run: Callable[[Preflight], Outcome]
    needs: tuple[str, ...] = ()
    refuses: int = 3
    not_needed: Callable[[Preflight], str | None] = lambda ctx: None
    without_daemon: str = ""


def _raise_or_ok(err: EschaError | None, detail: str = "") -> Outcome:
    if err is not None:
        raise err
    return "ok", detail


def _docker_daemon(ctx: Preflight) -> Outcome:
    from . import docker as dk

    ctx.client = dk.connect(timeout_s=3) if ctx.dry else dk.connect()
    # 3 s tells a dry run quickly that no daemon answers; the calls after it (a throw-away
    # container's create, start and logs) get the daemon's usual time: a loaded daemon took more
    # than 3 s to create one and the dry run ended in a traceback
    ctx.client.api.timeout = dk.API_TIMEOUT_S
    return "ok", ""


def _image(ctx: Preflight) -> Outcome:
    prep = ctx.planned()
    if prep.image_present is False and ctx.build:
        return "not run", f"--build would build {ctx.profile.container.image} first (`escha-deploy build --hicache`)"
    return "ok", ""


def _capabilities(ctx: Preflight) -> Outcome:
    prep, image = ctx.planned(), ctx.profile.container.image
    if prep.image_present is False and ctx.build:
        return "not run", f"{image} is not built yet; the plan assumed the profile's runtime.needs"
    if "image" in prep.refused_by:
        return "not run", f"{image} is not present"
    if prep.capabilities_source.startswith("assumed"):
        return "not run", (f"{image} has no capability label; `up` reads its runtime description file "
                           "through a created container, which a dry run does not make")
    return "ok", ""


def _model_folder(ctx: Preflight) -> Outcome:
    if any(m.target == ctx.profile.model.path for m in ctx.planned().spec.mounts):
        return "ok", ""
    return "not needed", "no model folder is mounted (model.host_dir is not set)"


def _memlock(ctx: Preflight) -> Outcome:
    if ctx.dry:
        return "not run", ("`up` starts a one-second container of the image with --ulimit memlock=-1 "
                           "first; `escha-deploy doctor --profile P` runs the same probe")
    return _raise_or_ok(memlock_refusal(ctx.client, ctx.planned()))


def _doctor_probes_not_needed(ctx: Preflight) -> str | None:
    if not ctx.planned().args.get("device_requests") or ctx.facts_path:
        return "no GPUs requested" if ctx.facts_path is None else "--facts given"
    return None


def _doctor_probes(ctx: Preflight) -> Outcome:
    if ctx.dry:
        if fresh_findings_saved():
            return "ok", "doctor's saved findings are younger than a day; `up` reuses them"
        return "not run", ("`up` runs them in a container of the image; "
                           f"`escha-deploy doctor --profile {ctx.profile_ref}` runs them without the server")
    # doctor's probes come before the plan that runs, and take their pinned target from the
    # first plan: when they measure now, the facts changed, so the pipeline runs again on them
    # (the profile loaded and the image read once: the first plan's runtime)
    first = ctx.planned()
    if ctx.doctor_probe is None:
        raise Internal("up: no doctor probe was given to the preflight (launch.up.up's doctor_probe)")
    if ctx.doctor_probe(ctx.client, first, report=ctx.report):
        ctx.prep = prepare(ctx.profile_ref, ctx.overrides, client=ctx.client, profile=ctx.profile,
                           spec_file=str(ctx.spec_file), runtime=first.runtime)
        ctx.prep.refuse()
    return "ok", ""


def _existing_container(ctx: Preflight) -> Outcome:
    from . import docker as dk

    prep = ctx.planned()
    if not ctx.dry:  # the plan `up` starts is final: its warnings, before the containers
        for w in prep.warnings:
            ctx.report("warning", w)
    # One container per profile: running -> no-op; anything else is stale and replaced.
    ctx.running, ctx.stale = existing_containers(ctx.client, prep)
    if ctx.running is not None:
        return "ok", f"already running (container {ctx.running.name}); `up` would do nothing"
    if ctx.dry:
        return "ok", "; ".join(f"`up` would replace {stale_line(c)}" for c in ctx.stale) or "none"
    for c in ctx.stale:
        # Never confirmed ready (restart policy still "no": an `up` died while starting) or
        # exited: stale. Stop with the grace period (sglang#22779: never SIGKILL first), remove.
        ctx.report("info", f"up: replacing {stale_line(c)}")
        with guard.signals_deferred(ctx.report, f"up: still replacing {c.name}"):  # then obeyed
            pub = dk.published(c)
            dk.stop(c, prep.spec.stop_timeout_s)
            if pub:
                dk.wait_port_free(*pub)
    return "ok", ""


def _port(ctx: Preflight) -> Outcome:
    # a dry run stops nothing: the stale containers' ports count as free
    return _raise_or_ok(port_refusal(ctx.client, ctx.planned(),
                                     replaced=[c.name for c in ctx.stale] if ctx.dry else ()))


def _api_key_file(ctx: Preflight) -> Outcome:
    ctx.api_key = read_api_key(ctx.profile)
    return "ok", ""


#: `up`'s checks before it creates anything, in its order: `up` runs each and stops at the first
#: failure; ``up --dry-run`` runs the same list, reporting each by name (``dry_run``).
CHECKS: list[Check] = [
    Check("docker daemon", _docker_daemon),
    Check("NVIDIA runtime", lambda ctx: _raise_or_ok(gpu_runtime_refusal(ctx.client, ctx.profile)),
          needs=("daemon",), not_needed=lambda ctx: "container.gpus is []" if ctx.profile.container.gpus == [] else None),
    Check("image", _image, needs=("daemon", "plan")),
    Check("capabilities", _capabilities, needs=("daemon", "plan"),
          without_daemon="; the plan assumed the profile's runtime.needs"),
    Check("plan", lambda ctx: ("ok", f"verdict {ctx.planned().plan.verdict}"), needs=("plan",)),
    Check("container settings", lambda ctx: ("ok", ""), needs=("plan",)),
    Check("model folder", _model_folder, needs=("plan",)),
    Check("L3 folder", lambda ctx: ("ok", f"{ctx.profile.hicache.storage_dir}: exists, writable, the cap free"),
          needs=("plan",), not_needed=lambda ctx: None if ctx.profile.hicache.storage_backend_is_file
          else "no file L3 (hicache.l3)"),
    Check("memlock", _memlock, needs=("plan", "container"),
          not_needed=lambda ctx: f"{CLAMP_MEMLOCK_ENV}=1 clamps memlock (test switch)"
          if os.environ.get(CLAMP_MEMLOCK_ENV) == "1" else None),
    Check("doctor probes", _doctor_probes, needs=("plan", "container"), not_needed=_doctor_probes_not_needed),
    Check("sglang pre-flight", lambda ctx: image_preflight.check(ctx.client, ctx.planned(), dry=ctx.dry,
                                                                  report=ctx.report, failed=ctx.failed),
          needs=("daemon", "plan"), not_needed=lambda ctx: image_preflight.not_needed(ctx.planned()),
          without_daemon="; it runs at `up`, in a container of the image"),
    Check("first use", lambda ctx: first_use_check.check(ctx.client, ctx.planned(), dry=ctx.dry),
          needs=("daemon", "plan", "container")),
    Check("existing container", _existing_container, needs=("daemon", "plan")),
    Check("port", _port, needs=("daemon", "plan")),
    Check("api key file", _api_key_file, refuses=2,
          not_needed=lambda ctx: None if ctx.profile.container.api_key_file else "container.api_key_file is not set"),
]

#: The names of ``CHECKS``, in order (what ``up --dry-run`` reports).
PREFLIGHT = tuple(c.name for c in CHECKS)

_NO_DAEMON = "the Docker daemon does not answer"
_DAEMON_ERROR = "the Docker daemon answered with an error"


@dataclass
class CheckResult:
    """One of `up`'s preflight checks as the dry run saw it. ``state``: ``ok``, ``failed``
    (``problems``: the lines `up` refuses with), ``not run`` (the dry run could not run it;
    ``detail`` says why) or ``not needed`` (`up` would not run it for this profile)."""

    name: str
    state: str
    detail: str = ""
    problems: list[str] = field(default_factory=list)


def run_preflight(ctx: Preflight) -> tuple[list[CheckResult], list[EschaError]]:
    """Run ``CHECKS`` in order. `up` (``ctx.dry`` False) raises the first failure; the dry run
    records every check and error and goes on, except that it stops when ``prepare`` raises
    (bad input or a refused folder: no plan to check against). A check that needs the plan
    fails with ``prepare``'s refusals made by its name (all of them, one error, the first time).
    Once a ready container of the profile is found, the rest are ``not needed``."""
    results: list[CheckResult] = []
    errors: list[EschaError] = []
    plan_refused = False

    def fail(check: Check, err: EschaError) -> None:
        if not ctx.dry:
            raise err
        results.append(CheckResult(check.name, "failed", "", list(err.problems)))
        ctx.failed.append(check.name)
        errors.append(err)

    def daemon_failed(exc: Exception) -> EschaError:
        """A Docker API error (the daemon answered 500, a container went meanwhile): one line,
        exit 3. The dry run then goes on as for a daemon that does not answer: no client, the
        plan made again without it, the checks that need it "not run"."""
        from . import docker as dk

        err = dk.daemon_refusal(exc, "up --dry-run" if ctx.dry else "up")
        if ctx.dry:
            ctx.client = None
            ctx.daemon_note = _DAEMON_ERROR
        return err

    for check in CHECKS:
        if ctx.running is not None:
            results.append(CheckResult(check.name, "not needed", "the profile's server is already running"))
            continue
        try:
            try:
                if "plan" in check.needs:
                    ctx.planned()
                why = check.not_needed(ctx)
            except Exception as exc:
                from . import docker as dk

                if not dk.is_daemon_error(exc):
                    raise
                err = daemon_failed(exc)
                if not ctx.dry:
                    raise err from None
                errors.append(err)
                ctx.prep = None
                if "plan" in check.needs:
                    ctx.planned()
                why = check.not_needed(ctx)
        except EschaError as exc:
            if not ctx.dry:
                raise
            errors.append(exc)
            return results, errors
        if why is not None:
            results.append(CheckResult(check.name, "not needed", why))
        elif "daemon" in check.needs and ctx.client is None:
            results.append(CheckResult(check.name, "not run", ctx.daemon_note + check.without_daemon))
        else:
            try:
                try:
                    state, detail = check.run(ctx)
                except Exception as exc:
                    from . import docker as dk

                    if not dk.is_daemon_error(exc):
                        raise
                    raise daemon_failed(exc) from None
                results.append(CheckResult(check.name, state, detail))
            except EschaError as exc:
                fail(check, exc)
        prep = ctx.prep
        if prep is not None and check.name in prep.refused_by:  # prepare's refusals, by the check that made them
            results[-1].state, results[-1].problems = "failed", list(prep.refused_by[check.name])
            if check.name not in ctx.failed:
                ctx.failed.append(check.name)
            if prep.refusals and not plan_refused:
                plan_refused = True
                err = Refused(*prep.refusals, hint=prep.hint)
                if not ctx.dry:
                    raise err
                errors.append(err)
    return results, errors


@dataclass
class DryRun:
    """What ``up --dry-run`` found: ``prep`` (None when the plan could not be made: then only
    ``errors`` count), one ``CheckResult`` per ``PREFLIGHT`` name reached, and the errors `up`
    would raise, in `up`'s order (the first one's class is `up`'s exit code)."""

    prep: Prepared | None
    checks: list[CheckResult]
    errors: list[EschaError]

    def error(self) -> EschaError | None:
        """Every failed check as one error of the first failure's class (exit 2 or 3, as `up`
        would exit), its hints joined; an internal error of escha-deploy's own code among them
        (the SGLang pre-flight's harness) makes it ``Internal`` (exit 1), whatever came first:
        no profile change clears it. None when every check that ran passed."""
        if not self.errors:
            return None
        hints = list(dict.fromkeys(e.hint for e in self.errors if e.hint))
        internal = [e for e in self.errors if isinstance(e, Internal)]
        cls = type(internal[0]) if internal else type(self.errors[0])
        return cls(*(p for e in self.errors for p in e.problems), hint="; ".join(hints) or None)

    def all_checks(self) -> list[dict]:
        """Every ``PREFLIGHT`` check as a dict (``CheckResult``): those reached, then the rest
        ``not run`` because the plan could not be made (``prep`` None: the first error says why)."""
        seen = {c.name for c in self.checks}
        rest = [CheckResult(n, "not run", "no plan to check against (the first error says why)")
                for n in PREFLIGHT if n not in seen]
        return [asdict(c) for c in [*self.checks, *rest]]

    def warnings(self) -> list[str]:
        """One line per check the dry run did not run (never reported as passed)."""
        return [f"up --dry-run: not checked: {c.name} ({c.detail})" for c in self.checks if c.state == "not run"]

    def data(self) -> dict:
        """``Prepared.dry_run`` plus ``checks`` and ``refusals`` (every failed check's lines)."""
        assert self.prep is not None
        return {**self.prep.dry_run(), "refusals": [p for e in self.errors for p in e.problems],
                "checks": [asdict(c) for c in self.checks]}


def dry_run(profile_ref: str, overrides: Sequence[str] = (), *, build: bool = False,
            facts_path: str | None = None) -> DryRun:
    """`up`'s preflight without its side effects: ``CHECKS``, the list `up` runs, through the
    same functions, reporting all failures instead of stopping at the first.

    Not run, and named so: checks that need the daemon when it does not answer; checks that
    need a container of the image (memlock, doctor's probes); an image's runtime description
    file when it has no capability label (read through a created container); ``--build``'s
    build. Creates no container but the ``sglang pre-flight`` check's throw-away one (removed at
    once, no network), writes no spec file, builds nothing.
    """
    from escha_deploy.profile import load_profile

    try:  # the profile first, as `up` reads it: a bad one is exit 2 whether or not Docker answers
        profile = load_profile(profile_ref, overrides)
    except EschaError as exc:
        return DryRun(None, [], [exc])
    ctx = Preflight(profile_ref, tuple(overrides), profile, build=build, facts_path=facts_path, dry=True)
    checks, errors = run_preflight(ctx)
    return DryRun(ctx.prep, checks, errors)  # prep None: prepare raised (bad input, a refused folder)


def _wait(client, c, prep: Prepared, endpoint: str, api_key: str | None, *, timeout_s: float | None,
          report: Report, on_phase: Callable[[str], None] | None) -> UpResult:
    """`up` after the start: wait for ready (or the end ``guard.Watch`` classifies), switch the
    restart policy, compare the logged sizes with the plan."""
    from docker.errors import NotFound

    from . import docker as dk
    from .drift import check
    from .ready import Probe, wait_ready

    spec = prep.spec
    report("info", f"up: started {c.name} ({c.short_id}) from {spec.image}; waiting for {endpoint}")
    jit = next((m for m in spec.mounts if m.kind == "volume" and m.target == CONTAINER_JIT_CACHE), None)
    if jit is not None:
        report("info", f"up: kernels compiled on first use (FlashInfer, Triton, torch extensions, SGLang) go to the "
                       f"named volume {jit.source} at {jit.target}, kept across restarts")
    pump = LogPump(c)
    probe = Probe(endpoint, api_key)
    timeout = float(timeout_s if timeout_s is not None else prep.profile.container.ready_timeout_s)
    seen: set[str] = set()
    t0 = time.monotonic()
    watch = guard.Watch(client, c, until=t0 + timeout, report=report)

    def alive() -> bool:
        # No inspect per poll: only once the followed log has ended is the daemon asked
        # (``guard.Watch``: a container removed by `down`, or a daemon gone for longer than
        # ``guard.RECONNECT_S``, reads as ended); a container still running is followed again.
        if pump.following():
            return True
        if watch.alive():
            pump.refollow()
            return True
        return False

    def show(phase: str) -> None:
        if phase not in seen:  # every rank logs each phase; show it once
            seen.add(phase)
            if on_phase is not None:
                on_phase(phase)
            else:
                report("info", f"up: [{time.monotonic() - t0:6.1f} s] {phase}")

    try:
        res = wait_ready(probe, timeout_s=timeout, alive=alive, new_lines=pump.take, on_phase=show,
                         pause=pump.pause)
    finally:
        probe.close()
    if not res.ready:
        from .diagnose import Facts, diagnose, launch_facts  # the failure path's log reader (rules and models)

        time.sleep(0.2)
        pump.take()
        end = guard.End()
        if res.reason == "server exited":
            end = watch.end()
        else:  # timed out, or the key refused: the server runs but cannot serve; stop it
            dk.stop(c, spec.stop_timeout_s)
            pump.take()
        # daemon_gone, oom_kill and http_status are read by the diagnosis table's event rows
        # launch_facts: what this launch already sets (no fix may say to set it), HiCache, the
        # platform and the plan's largest registered host buffer; the log's lines masked first,
        # as `logs` and `serve` mask them: the evidence is printed
        from escha_deploy.utils.redact import Redactor

        redact = Redactor([api_key or ""])
        diag = diagnose([redact(ln) for ln in pump.all], Facts(**launch_facts(prep.plan, prep.launch), exit_code=end.exit_code,
                                        timed_out=res.reason == "timed out",
                                        health_ok=res.health_ok, generate_ok=res.generate_ok,
                                        daemon_gone=end.daemon_gone, oom_kill=end.oom_killed,
                                        http_status=res.http_status))
        from escha_deploy.utils.redact import printable

        for ln in diag.lines():
            report("info", printable(ln))
        if res.reason == "timed out":
            what = "was not ready within %.0f s" % timeout
        elif res.reason == "unauthorized":
            what = ("refused the API key (HTTP 401 on /generate): the key in container.api_key_file "
                    "is not the one the server was started with; the container was stopped")
        else:
            what = end.what()
        causes = ", ".join(m.id for m in diag.matches) or "no known signature"
        kept = res.reason == "server exited" and not (end.gone or end.daemon_gone or end.kill_signal)
        raise Failed(f"up: the server {what} ({causes})",
                     hint=f"the stopped container keeps its log: `escha-deploy logs --profile {shlex.quote(prep.profile_ref or prep.profile.name)}`"
                     if kept else None)
    # The server logged its phases and pool sizes before it answered ready, but the following
    # thread may not have delivered them yet (a fast start is ready on the first poll): read the
    # log written so far once, so the progress lines and the drift check see all of it.
    from .ready import phase_of

    pump.take()
    for line in list(dk.log_lines(c, follow=False))[len(pump.all):]:
        pump.all.append(line)
        if ph := phase_of(line):
            show(ph)
    try:
        dk.set_restart_after_ready(c, spec.restart_after_ready)
    except NotFound:
        raise Failed(f"up: the server {guard.End(gone=True).what()}") from None
    from .ready import HEALTHY_WAIT_S, read_server_info

    # the ready wait saw /health 200 already: this costs one /health unless the server stalls again
    got = read_server_info(Probe(endpoint, api_key), wait_s=HEALTHY_WAIT_S,
                           progress=lambda line: report("info", f"up: {line}"))
    drift = check(planned_sizes(prep.plan, prep.profile.runtime), pump.all, got.info, got.why)
    for level, ln in drift.report_lines("up"):
        report(level, ln)
    lines = [i.line() for i in drift.items]
    return UpResult(prep.profile.name, c.name, endpoint, "running", round(res.seconds, 3), lines)


_LogPump = LogPump  # the name the ready-wait tests import
