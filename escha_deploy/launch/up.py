"""The `up` path: from a profile to a ready server container on this host's Docker.

``up`` is gather, plan, apply: the GPU runtime check, doctor's in-image probes when no fresh
findings exist (so the pinned ceiling and allocator they measure are in the plan), then
``prepare`` (profile, facts, image capabilities, plan, ``LaunchSpec``; a flag the runtime would
refuse exits 2, every other refusal 3, and nothing is created), the spec written to a file the
container mounts read-only (it runs ``serve --spec``, which re-plans nothing), the stale
containers and the port, create/start through docker-py, wait for ready, switch the restart
policy, and check the logged sizes against the plan. Progress goes to the caller's ``Report``.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

from escha_deploy.errors import Failed, Refused

from .prepare import Prepared, planned_sizes, prepare, read_secret
from . import guard
from .progress import Report, quiet

if TYPE_CHECKING:
    from escha_deploy.launch_spec import LaunchSpec

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


class _LogPump:
    """Follows a container's log in a thread; ``take()`` returns lines seen since last call;
    ``pause(s)`` waits up to ``s`` seconds, less when the server logs that it listens."""

    def __init__(self, container) -> None:
        from . import docker as dk

        self.q: queue.Queue[str] = queue.Queue()
        self.all: list[str] = []
        self._wake = threading.Event()
        self._t = threading.Thread(target=self._run, args=(dk, container), daemon=True)
        self._t.start()

    def _run(self, dk, container) -> None:
        from .ready import WAKE_PHASES, phase_of

        try:
            for line in dk.log_lines(container, follow=True):
                self.q.put(line)
                if phase_of(line) in WAKE_PHASES:
                    self._wake.set()
        except Exception:  # noqa: BLE001 - the container went away; the waiter sees it
            pass
        self._wake.set()  # the log ended: the waiter should look now (exited, or gone)

    def pause(self, seconds: float) -> None:
        """The ready wait's pause between polls (``ready.wait_ready``): ``seconds``, or until
        the server logs one of ``ready.WAKE_PHASES`` (or its log ends), whichever comes first."""
        if self._wake.wait(seconds):
            self._wake.clear()

    def following(self) -> bool:
        """True while the log stream is open: the daemon closes a followed log when the
        container stops, so this answers "still running?" without a round trip."""
        return self._t.is_alive()

    def take(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.q.get_nowait())
            except queue.Empty:
                break
        self.all.extend(out)
        return out


def spec_path(container: str) -> Path:
    """The host file ``up`` writes a container's ``LaunchSpec`` to (under the user cache
    directory; overwritten by the next ``up`` of that profile)."""
    from escha_deploy.paths import cache_dir

    return cache_dir() / "launch" / f"{container}.json"


def write_spec(launch: LaunchSpec, path: Path) -> None:
    """Write the spec document atomically, readable by the container's user."""
    from escha_deploy.launch_spec import spec_json

    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(spec_json(launch))
    tmp.chmod(0o644)
    tmp.replace(path)


def up(profile_ref: str, overrides: Sequence[str] = (), *, timeout_s: float | None = None,
       build: bool = False, report: Report = quiet, facts_path: str | None = None,
       on_phase: Callable[[str], None] | None = None) -> UpResult:
    """Start the profile's server and return once it is ready (see module docstring).

    ``facts_path``: plan from a facts file instead of this machine. ``report`` receives
    progress and warnings; ``on_phase`` each startup phase once (default: an ``info`` line with
    the seconds since start). Raises ``BadInput`` (2, a flag the runtime would refuse) or
    ``Refused`` (3) at preflight, with nothing created, also when another `up` is starting the
    profile (``guard``); ``Failed`` (4) when the server exits, is killed, is stopped by `down`,
    refuses the API key or is not ready in time (the diagnosis lines are its problems);
    ``guard.Interrupted`` (128 + N) when SIGINT or SIGTERM arrives while waiting: the container
    is then stopped and kept.
    """
    from escha_deploy.launch_spec import container_name
    from escha_deploy.profile import load_profile

    from . import docker as dk

    client = dk.connect()
    profile = load_profile(profile_ref, overrides)
    wants_gpus = profile.container.gpus != []
    if wants_gpus and dk.gpu_runtime(client) is None:
        raise Refused(
            "docker: no NVIDIA GPU runtime (docker info lists no nvidia runtime or CDI spec); "
            "the server needs GPUs",
            hint="install the NVIDIA Container Toolkit and restart Docker; `escha-deploy doctor` checks it",
        )
    if build:
        build_image(client, profile.container.image, report=report)
    sfile = spec_path(container_name(profile.name))
    prep = prepare(profile_ref, overrides, client=client, profile=profile, facts_path=facts_path,
                   spec_file=str(sfile))
    if prep.args.get("device_requests") and not facts_path and not prep.refusals:
        # doctor's probes come before the plan that runs: when they measure now, plan again
        if doctor_in_image(client, prep, report=report):
            prep = prepare(profile_ref, overrides, client=client, profile=profile, spec_file=str(sfile))
    prep.refuse()
    spec = prep.spec
    for w in prep.warnings:
        report("warning", w)
    endpoint = f"http://{'127.0.0.1' if spec.port_host_ip in ('0.0.0.0', '127.0.0.1') else spec.port_host_ip}:{spec.port_host}"
    # One container per profile: running -> no-op; anything else is stale and replaced.
    for c in dk.find(client, prep.profile.name):
        policy = (c.attrs.get("HostConfig", {}).get("RestartPolicy") or {}).get("Name") or "no"
        if c.status in ("running", "restarting") and policy != "no":
            return UpResult(prep.profile.name, c.name, endpoint, "running", None, [],
                            note=f"already running (container {c.name}); nothing to do")
        starter = c.labels.get(guard.LABEL_UP_OWNER)
        if c.status in ("created", "running") and guard.owner_alive(starter) is not False:
            raise Refused(f"up: another `up` (pid {guard.owner_pid(starter)}) is starting profile "
                          f"{prep.profile.name} (container {c.name}, {c.status}); not starting a second",
                          hint=f"wait for it, or stop it: escha-deploy down --profile {prep.profile.name}")
        # Never confirmed ready (restart policy still "no": an `up` died while starting) or
        # exited: stale. Stop with the grace period (sglang#22779: never SIGKILL first), remove.
        report("info", f"up: replacing stale container {c.name} ({c.status}, never confirmed ready)"
               if c.status == "running" else f"up: replacing stale container {c.name} ({c.status})")
        pub = dk.published(c)
        dk.stop(c, spec.stop_timeout_s)
        if pub:
            dk.wait_port_free(*pub)
    owner = dk.port_owner(client, spec.port_host_ip, spec.port_host)
    if owner and owner.split()[:2] == ["container", spec.name]:  # created since the check above
        raise Refused(f"up: another `up` is starting profile {prep.profile.name} (container "
                      f"{spec.name} holds {spec.port_host_ip}:{spec.port_host}); not starting a second",
                      hint=f"wait for it, or stop it: escha-deploy down --profile {prep.profile.name}")
    if owner:
        raise Refused(f"container.port: {spec.port_host_ip}:{spec.port_host} is held by {owner}",
                      hint="stop it, or set container.port to a free port")
    api_key = (read_secret(prep.profile.container.api_key_file, "container.api_key_file")
               if prep.profile.container.api_key_file else None)
    args = prep.args
    if os.environ.get(CLAMP_MEMLOCK_ENV) == "1":
        import resource

        hard = resource.getrlimit(resource.RLIMIT_MEMLOCK)[1]
        args = {**args, "ulimits": [u if u["name"] != "memlock" else {**u, "soft": hard, "hard": hard}
                                    for u in args["ulimits"]]}
        report("warning", f"up: {CLAMP_MEMLOCK_ENV}=1: memlock clamped to {hard} B (test switch)")
    write_spec(prep.launch, sfile)
    report("info", f"up: plan {prep.launch.plan_digest[:12]}, spec {sfile}")
    me = guard.owner_label()
    args = {**args, "labels": {**args["labels"], guard.LABEL_UP_OWNER: me}}
    with guard.interruptible(client, name=spec.name, owner=me, stop_timeout_s=spec.stop_timeout_s,
                             profile=prep.profile.name, report=report) as held:
        held.container = c = dk.create_and_start(client, args)
        return _wait(client, c, prep, endpoint, api_key, timeout_s=timeout_s, report=report,
                     on_phase=on_phase)


def _wait(client, c, prep: Prepared, endpoint: str, api_key: str | None, *, timeout_s: float | None,
          report: Report, on_phase: Callable[[str], None] | None) -> UpResult:
    """`up` after the start: wait for ready (or the end ``guard.Watch`` classifies), switch the
    restart policy, compare the logged sizes with the plan."""
    from docker.errors import NotFound

    from . import docker as dk
    from .drift import compare, parse_sizes
    from .ready import Probe, wait_ready

    spec = prep.spec
    report("info", f"up: started {c.name} ({c.short_id}) from {spec.image}; waiting for {endpoint}")
    pump = _LogPump(c)
    probe = Probe(endpoint, api_key)
    watch = guard.Watch(client, c)

    def alive() -> bool:
        # No inspect per poll: only once the followed log has ended is the daemon asked
        # (``guard.Watch``: a container removed by `down`, or a daemon gone, reads as ended).
        return pump.following() or watch.alive()

    timeout = float(timeout_s if timeout_s is not None else prep.profile.container.ready_timeout_s)
    seen: set[str] = set()
    t0 = time.monotonic()

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
        from .diagnose import Facts, diagnose  # the failure path's log reader (rules and models)

        time.sleep(0.2)
        pump.take()
        end = guard.End()
        if res.reason == "server exited":
            end = watch.end()
        else:  # timed out, or the key refused: the server runs but cannot serve; stop it
            dk.stop(c, spec.stop_timeout_s)
            pump.take()
        # daemon_gone, oom_kill and http_status are read by the diagnosis table's event rows
        diag = diagnose(pump.all, Facts(exit_code=end.exit_code, hicache_enabled=prep.plan.hicache.enabled,
                                        platform=prep.plan.platform,
                                        timed_out=res.reason == "timed out",
                                        health_ok=res.health_ok, generate_ok=res.generate_ok,
                                        daemon_gone=end.daemon_gone, oom_kill=end.oom_killed,
                                        http_status=res.http_status))
        for ln in diag.lines():
            report("info", ln)
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
                     hint=f"the stopped container keeps its log: escha-deploy logs --profile {prep.profile.name}"
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
    drift = compare(planned_sizes(prep.plan), parse_sizes(pump.all))
    lines = [i.line() for i in drift.items]
    for ln in lines:
        report("warning", ln)
    return UpResult(prep.profile.name, c.name, endpoint, "running", round(res.seconds, 3), lines)


def doctor_in_image(client, prep: Prepared, *, timeout_s: float = 600, report: Report = quiet) -> bool:
    """Doctor's GPU probes inside the profile's image (its cgroup, /dev/shm, memlock and WSL2
    pinned ceiling are what count), reusing saved findings younger than a day
    (``findings.MAX_AGE``). Runs ``python -m escha_deploy.doctor.probe_all``
    in a throw-away container with the launch's GPUs, ipc and ulimits; saves the answer as
    findings under the host's id. A failed all-reduce smoke test refuses (exit 3) before the
    server is created. Returns True when the probes ran now (the findings changed), False when
    saved findings were fresh. Only reached where Docker has a GPU runtime (not testable here).
    """
    from escha_deploy.doctor.facts import ProbeFacts
    from escha_deploy.doctor.run import probe_findings
    from escha_deploy.findings import load_findings, save_findings
    from escha_deploy.host import host_id
    from escha_deploy.paths import doctor_findings_path

    from . import docker as dk

    hid = host_id()
    saved = load_findings(doctor_findings_path(), host_id=hid)
    if saved is not None and saved.is_fresh():
        report("info", "up: reusing doctor findings younger than a day")
        return False
    world = int(prep.profile.runtime.tp_size)
    target = int(prep.plan.per_rank.pinned_bytes) or 1
    args = {k: v for k, v in prep.args.items()
            if k in ("image", "device_requests", "ipc_mode", "shm_size", "ulimits", "security_opt",
                     "environment", "init")}
    args.update(entrypoint=["python3", "-m", "escha_deploy.doctor.probe_all"],
                command=["--target", str(target), "--world-size", str(world)],
                labels={dk.LABEL_MANAGED_BY: "escha-deploy-doctor"}, detach=True)
    report("info", f"up: running doctor's probes in {prep.spec.image}")
    c = client.containers.create(**dk.to_docker({**args, "mounts": [], "ulimits": args["ulimits"]}))
    try:
        c.start()
        code = c.wait(timeout=timeout_s)["StatusCode"]
        out = c.logs(stdout=True, stderr=False).decode().strip().splitlines()
    finally:
        c.remove(force=True)
    if code != 0 or not out:
        raise Refused(f"doctor: probes in {prep.spec.image} found no usable GPU (exit {code})",
                      hint=f"`escha-deploy doctor --profile {prep.profile_ref}` shows the checks")
    data = json.loads(out[-1])
    probes = ProbeFacts.model_validate(data["probes"])
    import datetime as dt

    findings = probe_findings(probes, host_id=hid, platform=data.get("platform", prep.plan.platform),
                              created_at=dt.datetime.now(dt.timezone.utc).isoformat())
    save_findings(findings, doctor_findings_path())
    if world >= 2 and findings.nccl_smoke_ok is False:
        raise Refused(f"doctor: the {world}-GPU all-reduce smoke test failed in {prep.spec.image}",
                      hint=f"`escha-deploy doctor --profile {prep.profile_ref}` prints the NCCL settings it tried")
    return True


def build_image(client, image: str, *, report: Report = quiet) -> None:
    """``--build``: when ``image`` is absent, build it with ``escha-deploy build --hicache --tag
    IMAGE`` (the builder, run as a child of this same installation; its progress goes to
    stderr). Raises ``Refused`` (exit 3, nothing created) when the build fails."""
    import subprocess

    from . import docker as dk

    if dk.image_labels(client, image) is not None:
        return
    report("info", f"up: building {image} (escha-deploy build --hicache)")
    r = subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", "build", "--hicache",
                        "--tag", image], stdout=sys.stderr)
    if r.returncode != 0:
        raise Refused(f"--build: `escha-deploy build --hicache --tag {image}` failed (exit {r.returncode})")
