"""`up`, `down`, `status`, `logs` and `serve` as functions the thin CLI modules call.

``up`` is gather, plan, apply (style-anchors rule 1): load the profile, read the host and the
image, plan, build the container spec, run the preflight (every failure exits 3 and creates
nothing), then create/start through docker-py, wait for ready, switch the restart policy,
and check the logged sizes against the plan.
"""

from __future__ import annotations

import json
import os
import queue
import sys
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from escha_deploy.errors import BadInput, Failed, Refused

from escha_deploy.secretargs import redact_argv

from .redact import Redactor

#: The documented test switch: `serve` skips its GPU preflight (so the real image can be
#: started on a machine without a GPU and reach SGLang's child process). Never set in production.
SKIP_GPU_PREFLIGHT_ENV = "ESCHA_SKIP_GPU_PREFLIGHT"
#: Test switch for sandboxes whose Docker cannot raise RLIMIT_MEMLOCK (no CAP_SYS_RESOURCE:
#: runc fails with "error setting rlimit type 8"): memlock becomes this process's hard limit.
#: The stand-in tests set it; a real deployment never does (pinned pools need memlock -1).
CLAMP_MEMLOCK_ENV = "ESCHA_TEST_CLAMP_MEMLOCK"


def _profile_file(ref: str) -> str | None:
    """The host path to mount when ``ref`` names a file rather than a shipped profile."""
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or os.sep in ref:
        return str(p.resolve()) if p.is_file() else None
    return None


def read_secret(path: str, what: str) -> str:
    """The first line of a secret file, stripped. Raises ``BadInput`` naming the file."""
    try:
        value = Path(path).read_text().strip().splitlines()[0].strip()
    except (OSError, IndexError):
        raise BadInput(f"{what}: cannot read a value from {path}") from None
    if not value:
        raise BadInput(f"{what}: {path} is empty")
    return value


def image_capabilities(client, image: str) -> list[str] | None:
    """Capabilities an image declares: its ``io.escha.runtime.capabilities`` label, else the
    runtime description file read from the image; None for a stock image."""
    from escha_deploy.runtime.description import RuntimeDescription, capabilities_from_labels

    from . import docker as dk

    labels = dk.image_labels(client, image) or {}
    caps = capabilities_from_labels(labels)
    if caps is not None:
        return caps
    from escha_deploy.capabilities import RUNTIME_DESCRIPTION_PATH

    raw = dk.read_file_from_image(client, image, RUNTIME_DESCRIPTION_PATH)
    if raw is None:
        return None
    try:
        return list(RuntimeDescription.model_validate(json.loads(raw)).capabilities)
    except ValueError:
        raise BadInput(f"{image}:{RUNTIME_DESCRIPTION_PATH}: not a runtime description") from None


@dataclass
class Prepared:
    """Everything `up` decided before touching the daemon's state."""

    profile: Any
    plan: Any
    launch: Any  # LaunchSpec
    spec: Any  # its ContainerSpec
    args: dict[str, Any]
    argv: list[str]
    warnings: list[str] = field(default_factory=list)

    def dry_run(self) -> dict[str, Any]:
        """What `up --dry-run` prints: the container config and the server argv, redacted."""
        r = Redactor()
        return {
            "profile": self.profile.name,
            "verdict": self.plan.verdict,
            "hicache": self.plan.hicache.enabled,
            "container": json.loads(r(json.dumps(self.args))),
            "argv": [r(a) for a in redact_argv(self.argv)],
            "warnings": self.warnings,
        }


def prepare(profile_ref: str, overrides: Sequence[str], *, client=None, need_image: bool = True,
            profile: Any = None) -> Prepared:
    """Load, gather, plan and build the spec; refuse (``Refused``, exit 3) on an unsafe plan,
    missing capabilities or an unlaunchable spec. With ``client``, also reads the image's
    capabilities (``need_image``: a missing image is refused)."""
    from escha_deploy.host import gather_plan_inputs
    from escha_deploy.planner import plan as make_plan
    from escha_deploy.profile import load_profile
    from escha_deploy.runtime.description import require_capabilities

    from . import docker as dk

    profile = profile or load_profile(profile_ref, overrides)
    host, model_dir = gather_plan_inputs(profile)
    caps: list[str] | None = None
    warnings: list[str] = []
    if client is not None:
        if dk.image_labels(client, profile.container.image) is None:
            if need_image:
                raise Refused(
                    f"container.image: {profile.container.image} is not present",
                    hint="build it (`escha-deploy up --build`, or `escha-deploy build`)",
                )
        else:
            caps = image_capabilities(client, profile.container.image)
            require_capabilities(caps, profile.runtime.needs, profile.container.image)
    plan = make_plan(profile, host, model_dir=model_dir, capabilities=None if caps is None else frozenset(caps))
    if plan.verdict == "unsafe":
        raise Refused(*[f"plan: {r}" for r in plan.reasons] or ["plan: unsafe"],
                      hint="`escha-deploy plan --profile NAME` shows the budget")
    if plan.verdict == "hicache_off":
        warnings.append("plan: HiCache is off for this host (" + "; ".join(plan.reasons) + ")")
    from escha_deploy.launch_spec import build_launch_spec

    launch = build_launch_spec(plan, profile, overrides=list(overrides),
                               profile_file=_profile_file(profile_ref))
    spec = launch.container
    problems = dk.check_spec(spec)
    if client is not None:  # a real launch: the model folder must exist to be mounted
        for m in spec.mounts:
            if m.target == profile.model.path and not Path(m.source).is_dir():
                problems.append(f"model.host_dir / container.model_dir: {m.source} is not a folder on this host")
    if problems:
        raise Refused(*problems)
    return Prepared(profile, plan, launch, spec, dk.create_args(spec), list(launch.argv), warnings)


# --------------------------------------------------------------------------- up


@dataclass
class UpResult:
    profile: str
    container: str
    endpoint: str
    state: str
    ready_seconds: float | None
    drift: list[str]
    note: str = ""


class _LogPump:
    """Follows a container's log in a thread; ``take()`` returns lines seen since last call."""

    def __init__(self, container) -> None:
        from . import docker as dk

        self.q: queue.Queue[str] = queue.Queue()
        self.all: list[str] = []
        self._t = threading.Thread(target=self._run, args=(dk, container), daemon=True)
        self._t.start()

    def _run(self, dk, container) -> None:
        try:
            for line in dk.log_lines(container, follow=True):
                self.q.put(line)
        except Exception:  # noqa: BLE001 - the container went away; the waiter sees it
            pass

    def take(self) -> list[str]:
        out = []
        while True:
            try:
                out.append(self.q.get_nowait())
            except queue.Empty:
                break
        self.all.extend(out)
        return out


def up(profile_ref: str, overrides: Sequence[str] = (), *, timeout_s: float | None = None,
       build: bool = False, progress=None) -> UpResult:
    """Start the profile's server and return once it is ready (see module docstring).

    Raises ``Refused`` (3) at preflight, with nothing created; ``Failed`` (4) when the server
    exits or is not ready in time (the diagnosis lines are its problems).
    """
    from escha_deploy.cli.output import info, warn

    from . import docker as dk
    from .diagnose import Facts, diagnose
    from .drift import compare, parse_sizes
    from .ready import Probe, wait_ready

    from escha_deploy.profile import load_profile

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
        _build_image(client, profile.container.image)
    prep = prepare(profile_ref, overrides, client=client, profile=profile)
    spec = prep.spec
    for w in prep.warnings:
        warn(w)
    endpoint = f"http://{'127.0.0.1' if spec.port_host_ip in ('0.0.0.0', '127.0.0.1') else spec.port_host_ip}:{spec.port_host}"
    # One container per profile: running -> no-op; anything else is stale and replaced.
    for c in dk.find(client, prep.profile.name):
        policy = (c.attrs.get("HostConfig", {}).get("RestartPolicy") or {}).get("Name") or "no"
        if c.status in ("running", "restarting") and policy != "no":
            return UpResult(prep.profile.name, c.name, endpoint, "running", None, [],
                            note=f"already running (container {c.name}); nothing to do")
        # Never confirmed ready (restart policy still "no": an `up` died while starting) or
        # exited: stale. Stop with the grace period (sglang#22779: never SIGKILL first), remove.
        info(f"up: replacing stale container {c.name} ({c.status}, never confirmed ready)"
             if c.status == "running" else f"up: replacing stale container {c.name} ({c.status})")
        pub = dk.published(c)
        dk.stop(c, spec.stop_timeout_s)
        if pub:
            dk.wait_port_free(*pub)
    if prep.args.get("device_requests"):
        doctor_in_image(client, prep)
    owner = dk.port_owner(client, spec.port_host_ip, spec.port_host)
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
        warn(f"up: {CLAMP_MEMLOCK_ENV}=1: memlock clamped to {hard} B (test switch)")
    c = dk.create_and_start(client, args)
    info(f"up: started {c.name} ({c.short_id}) from {spec.image}; waiting for {endpoint}")
    pump = _LogPump(c)
    probe = Probe(endpoint, api_key)

    def alive() -> bool:
        c.reload()
        return c.status in ("created", "running")

    timeout = float(timeout_s if timeout_s is not None else prep.profile.container.ready_timeout_s)
    seen: set[str] = set()
    t0 = time.monotonic()

    def show(phase: str) -> None:
        if phase not in seen:  # every rank logs each phase; show it once
            seen.add(phase)
            (progress or (lambda ph: info(f"up: [{time.monotonic() - t0:6.1f} s] {ph}")))(phase)

    try:
        res = wait_ready(probe, timeout_s=timeout, alive=alive, new_lines=pump.take, on_phase=show)
    finally:
        probe.close()
    if not res.ready:
        time.sleep(0.2)
        pump.take()
        code = None
        if res.reason == "server exited":
            c.reload()
            code = c.attrs.get("State", {}).get("ExitCode")
        else:
            dk.stop(c, spec.stop_timeout_s)
            pump.take()
        diag = diagnose(pump.all, Facts(exit_code=code, hicache_enabled=prep.plan.hicache.enabled,
                                        platform=prep.plan.platform,
                                        timed_out=res.reason == "timed out",
                                        health_ok=res.health_ok, generate_ok=res.generate_ok))
        for ln in diag.lines():
            info(ln)
        what = ("not ready within %.0f s" % timeout) if res.reason == "timed out" else f"exited with code {code}"
        causes = ", ".join(m.id for m in diag.matches) or "no known signature"
        raise Failed(f"up: the server {what} ({causes})",
                     hint=None if res.reason == "timed out" else
                     f"the stopped container keeps its log: escha-deploy logs --profile {prep.profile.name}")
    dk.set_restart_after_ready(c, spec.restart_after_ready)
    drift = compare(planned_sizes(prep.plan), parse_sizes(pump.all))
    lines = [i.line() for i in drift.items]
    for ln in lines:
        warn(ln)
    return UpResult(prep.profile.name, c.name, endpoint, "running", round(res.seconds, 3), lines)


def doctor_in_image(client, prep: Prepared, *, timeout_s: float = 600) -> None:
    """Doctor's GPU probes inside the profile's image (its cgroup, /dev/shm, memlock and WSL2
    pinned ceiling are what count), reusing saved findings younger than a day
    (``findings.MAX_AGE``; DESIGN.md section 3). Runs ``python -m escha_deploy.doctor.probe_all``
    in a throw-away container with the launch's GPUs, ipc and ulimits; saves the answer as
    findings under the host's id. A failed all-reduce smoke test refuses (exit 3) before the
    server is created. Only reached where Docker has a GPU runtime (not testable here).
    """
    from escha_deploy.cli.output import info
    from escha_deploy.doctor.facts import ProbeFacts
    from escha_deploy.doctor.run import probe_findings
    from escha_deploy.findings import load_findings, save_findings
    from escha_deploy.host import host_id
    from escha_deploy.paths import doctor_findings_path

    from . import docker as dk

    hid = host_id()
    saved = load_findings(doctor_findings_path(), host_id=hid)
    if saved is not None and saved.is_fresh():
        info("up: reusing doctor findings younger than a day")
        return
    world = int(prep.profile.runtime.tp_size)
    target = int(prep.plan.per_rank.pinned_bytes) or 1
    args = {k: v for k, v in prep.args.items()
            if k in ("image", "device_requests", "ipc_mode", "shm_size", "ulimits", "security_opt",
                     "environment", "init")}
    args.update(entrypoint=["python3", "-m", "escha_deploy.doctor.probe_all"],
                command=["--target", str(target), "--world-size", str(world)],
                labels={dk.LABEL_MANAGED_BY: "escha-deploy-doctor"}, detach=True)
    info(f"up: running doctor's probes in {prep.spec.image}")
    c = client.containers.create(**dk.to_docker({**args, "mounts": [], "ulimits": args["ulimits"]}))
    try:
        c.start()
        code = c.wait(timeout=timeout_s)["StatusCode"]
        out = c.logs(stdout=True, stderr=False).decode().strip().splitlines()
    finally:
        c.remove(force=True)
    if code != 0 or not out:
        raise Refused(f"doctor: probes in {prep.spec.image} found no usable GPU (exit {code})",
                      hint="`escha-deploy doctor --profile NAME` shows the checks")
    data = json.loads(out[-1])
    probes = ProbeFacts.model_validate(data["probes"])
    import datetime as dt

    findings = probe_findings(probes, host_id=hid, platform=data.get("platform", prep.plan.platform),
                              created_at=dt.datetime.now(dt.timezone.utc).isoformat())
    save_findings(findings, doctor_findings_path())
    if world >= 2 and findings.nccl_smoke_ok is False:
        raise Refused(f"doctor: the {world}-GPU all-reduce smoke test failed in {prep.spec.image}",
                      hint="`escha-deploy doctor --profile NAME` prints the NCCL settings it tried")


def planned_sizes(plan: Any):
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


def _build_image(client, image: str) -> None:
    """``--build``: when ``image`` is absent, build it with ``escha-deploy build --hicache --tag
    IMAGE`` (issue 3's builder, run as a child of this same installation; its progress goes to
    stderr). Raises ``Refused`` (exit 3, nothing created) when the build fails."""
    import subprocess

    from escha_deploy.cli.output import info

    from . import docker as dk

    if dk.image_labels(client, image) is not None:
        return
    info(f"up: building {image} (escha-deploy build --hicache)")
    r = subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", "build", "--hicache",
                        "--tag", image], stdout=sys.stderr)
    if r.returncode != 0:
        raise Refused(f"--build: `escha-deploy build --hicache --tag {image}` failed (exit {r.returncode})")


# --------------------------------------------------------------------------- down/status/logs


def down(profile: str | None, *, timeout_s: int | None = None) -> list[str]:
    """Stop and remove the profile's containers (all of this tool's when ``profile`` is None):
    SIGTERM, the stop timeout, then kill; returns once their ports are free. Bind-mounted
    folders (the L3 directory) and volumes are left alone. Returns the names stopped."""
    from . import docker as dk

    client = dk.connect()
    stopped = []
    for c in dk.find(client, profile):
        pub = dk.published(c)
        grace = timeout_s if timeout_s is not None else int(
            c.labels.get(dk.LABEL_STOP_TIMEOUT) or c.attrs["Config"].get("StopTimeout") or 60)
        dk.stop(c, grace)
        if pub and not dk.wait_port_free(*pub):
            port = pub[1]
            raise Failed(f"down: port {port} still busy after stopping {c.name}")
        stopped.append(c.name)
    return stopped


def status(profile: str | None) -> list[dict[str, Any]]:
    """One row per container of this tool: state, endpoint, plan digest, uptime (s).
    Raises ``Refused`` (exit 3, as systemctl is-active) when nothing is there."""
    import datetime as dt

    from . import docker as dk

    client = dk.connect()
    rows = []
    for c in dk.find(client, profile):
        st = c.attrs.get("State", {})
        started = st.get("StartedAt", "")
        uptime = None
        if c.status == "running" and started:
            t0 = dt.datetime.fromisoformat(started[:26].rstrip("Z") + "+00:00")
            uptime = round((dt.datetime.now(dt.timezone.utc) - t0).total_seconds(), 1)
        host_ip, port = dk.published(c) or ("-", 0)
        rows.append({
            "profile": c.labels.get(dk.LABEL_PROFILE, ""),
            "container": c.name,
            "state": c.status,
            "endpoint": f"http://{host_ip}:{port}" if port else "-",
            "plan_digest": c.labels.get(dk.LABEL_PLAN_DIGEST, "")[:12],
            "image": (c.attrs.get("Config", {}) or {}).get("Image", ""),
            "uptime_s": uptime,
            "restart_policy": (c.attrs.get("HostConfig", {}).get("RestartPolicy") or {}).get("Name", ""),
        })
    if not rows:
        raise Refused(f"status: nothing running{' for profile ' + profile if profile else ''}")
    return rows


def logs(profile: str | None, *, follow: bool, tail: int | str = "all", out=None) -> None:
    """Print the container's log (redacted) to ``out`` (stdout: the log is the result here).
    Raises ``Refused`` (3) when there is no container."""
    from . import docker as dk

    out = out or sys.stdout
    client = dk.connect()
    found = dk.find(client, profile)
    if not found:
        raise Refused(f"logs: nothing running{' for profile ' + profile if profile else ''}")
    r = Redactor()
    try:
        for line in dk.log_lines(found[0], follow=follow, tail=tail):
            out.write(r(line) + "\n")
            out.flush()
    except KeyboardInterrupt:
        pass


# --------------------------------------------------------------------------- serve


def _gpu_present() -> bool:
    """A CUDA device node exists (``/dev/nvidia0``, or ``/dev/dxg`` under WSL2)."""
    return Path("/dev/nvidia0").exists() or Path("/dev/dxg").exists()


def serve(profile_ref: str, overrides: Sequence[str] = (), *, dry_run: bool = False) -> int:
    """The container entrypoint and native launcher; returns the exit status.

    Re-plans against what it sees (host facts read inside the container: cgroup limit,
    /dev/shm, the image's runtime description at /etc/escha/runtime.json), refuses (3) an
    unsafe plan or missing capabilities before anything starts, then runs SGLang's argv as a
    supervised child (``native.supervise``): 0 on success, the child's code after a forwarded
    signal, 4 on any other failure with the diagnosis printed. ``ESCHA_SKIP_GPU_PREFLIGHT=1``
    (tests only) skips the GPU check. The API key (from ``LaunchSpec.api_key_file``) reaches
    SGLang through a private ``--config`` file, never a command line; the HF token through
    the child's environment (``HF_TOKEN``).
    """
    from escha_deploy import flags
    from escha_deploy.cli.output import info, warn
    from escha_deploy.host import gather_plan_inputs
    from escha_deploy.launch_spec import build_launch_spec
    from escha_deploy.planner import plan as make_plan
    from escha_deploy.profile import load_profile
    from escha_deploy.runtime.description import read_description, require_capabilities

    from .diagnose import Facts
    from .native import supervise

    profile = load_profile(profile_ref, overrides)
    desc = read_description()
    caps = list(desc.capabilities) if desc is not None else None
    where = ("this runtime (/etc/escha/runtime.json)" if desc is not None
             else "this runtime (stock: no /etc/escha/runtime.json)")
    missing = [c for c in profile.runtime.needs if c not in (caps or [])]
    if not dry_run:
        require_capabilities(caps, profile.runtime.needs, where)
    from .docker import SERVE_MODE_ENV

    in_container = os.environ.get(SERVE_MODE_ENV) == "container"
    # inside the container the model folder is mounted at model.path
    host, model_dir = gather_plan_inputs(profile, model_path=profile.model.path if in_container else None)
    # --print always shows what the plan implies for the runtime the profile targets; the
    # missing capabilities then go to stderr with exit 3.
    plan = make_plan(profile, host, model_dir=model_dir,
                     capabilities=frozenset(profile.runtime.needs if missing else (caps or ())))
    if plan.verdict == "unsafe" and not dry_run:
        raise Refused(*[f"plan: {r}" for r in plan.reasons] or ["plan: unsafe"])
    if plan.verdict == "hicache_off":
        warn("plan: HiCache is off here (" + "; ".join(plan.reasons) + ")")
    spec = build_launch_spec(plan, profile, native=not in_container)
    api_key = read_secret(spec.api_key_file, "api key file") if spec.api_key_file else None
    hf_token = (read_secret(spec.hf_token_file, "hf token file")
                if spec.hf_token_file and Path(spec.hf_token_file).is_file() else None)
    env = dict(os.environ)
    env.update(spec.env)
    if hf_token:
        env["HF_TOKEN"] = hf_token
    argv = list(spec.argv)
    if os.environ.get("ESCHA_SGLANG_PYTHON") and argv and argv[0].startswith("python"):
        argv[0] = os.environ["ESCHA_SGLANG_PYTHON"]
    if dry_run:
        r = Redactor([api_key or "", hf_token or ""])
        print(json.dumps({"argv": [r(a) for a in redact_argv(argv)], "env": {k: r(v) for k, v in spec.env.items()},
                          "verdict": plan.verdict, "missing_capabilities": missing}, indent=2))
        require_capabilities(caps, profile.runtime.needs, where)
        return 3 if plan.verdict == "unsafe" else 0
    if not _gpu_present() and os.environ.get(SKIP_GPU_PREFLIGHT_ENV) != "1":
        raise Refused("serve: no CUDA GPU device in this environment (/dev/nvidia0, /dev/dxg)",
                      hint="start the container with GPUs (escha-deploy up does)")
    info(f"serve: {profile.name}: plan {plan.verdict}, HiCache {'on' if plan.hicache.enabled else 'off'}; "
         "starting SGLang")
    try:
        outcome = supervise(argv, env=env, secrets=[s for s in (api_key, hf_token) if s],
                            config_flag=flags.CONFIG_FLAG, config_secrets=flags.secret_config(api_key),
                            facts=Facts(hicache_enabled=plan.hicache.enabled, platform=plan.platform))
    except OSError as exc:
        raise Failed(f"serve: cannot start {argv[0] if argv else 'the server'}: {exc}") from None
    return outcome.exit_code
