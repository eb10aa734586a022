"""docker-py edge of the launcher: create/start/stop/inspect/logs, containers found by label.

``create_args(spec)`` is pure: it turns a ``ContainerSpec`` into the keyword arguments of
docker-py's ``containers.create`` as plain JSON-able data (what ``up --dry-run`` prints);
``to_docker(args)`` converts the few entries docker-py wants as objects (mounts, ulimits,
device requests). Everything else here talks to the daemon.

Settings and where they come from:

- GPUs as device requests: on Linux a count (the TP size) or device ids; under WSL2 only
  ``all`` works, so GPUs are selected with ``CUDA_VISIBLE_DEVICES`` (``container.py``).
- ``ipc_mode=host`` (or ``shm_size`` of at least 16 GB), ulimits memlock -1 and stack 64 MiB:
  SGLang's own ``docker/compose.yaml``; NCCL needs the shared memory at TP 2 (sglang#4259).
- The port is published on 127.0.0.1 unless the profile exposes it, which needs an API key.
- An init process, ``no-new-privileges``, capabilities dropped (profile switch to keep them),
  a stop timeout (SIGTERM, then kill).
- Restart policy ``no`` while starting (a crash loop of pinned allocations can bring down a
  WSL2 host); ``on-failure`` with a cap once ready (``set_restart_after_ready``).
"""

from __future__ import annotations

import contextlib
import socket
import time
from collections.abc import Iterator
from typing import Any

from escha_deploy.utils.errors import Failed, Refused
from escha_deploy.pipeline.spec import ContainerSpec

from escha_deploy.sglang.capabilities import LABEL_PREFIX

#: Labels ``build_launch_spec`` puts on every container (launch_spec.py); ``find`` uses them.
LABEL_MANAGED_BY = LABEL_PREFIX + "managed-by"
MANAGED_BY = "escha-deploy"
LABEL_PROFILE = LABEL_PREFIX + "profile"
LABEL_PLAN_DIGEST = LABEL_PREFIX + "plan-digest"
#: docker-py's ``containers.create`` has no ``stop_timeout``; the grace period travels as a
#: label that ``down`` reads (docker's own StopTimeout is set too when the API allows it).
LABEL_STOP_TIMEOUT = LABEL_PREFIX + "stop-timeout"
#: Where a non-shipped profile file is mounted (``build_launch_spec``'s command names it).
PROFILE_TARGET = "/etc/escha/profile.yaml"

#: Smallest /dev/shm accepted when ipc is not ``host`` (16 GB; NCCL at TP 2, sglang#4259).
MIN_SHM_BYTES = 16 * 10**9
LOOPBACK = ("127.0.0.1", "::1", "localhost")
#: Set in the container's environment (here and in compose.yaml): tells ``serve`` it runs in
#: the container ``up`` made (container paths for secrets and L3), not natively on a host.
SERVE_MODE_ENV = "ESCHA_SERVE_MODE"


def check_spec(spec: ContainerSpec, *, native: bool = False) -> list[str]:
    """Problems that make ``spec`` unlaunchable (one line each; empty when fine): the
    ``container settings`` check of ``up``, also run by ``compose`` and ``serve --profile``.

    Refuses: binding beyond loopback without an API key file; neither ``ipc=host`` nor a
    /dev/shm of at least 16 GB; device ids under WSL2 (only ``all`` works there).
    ``native``: the server runs on this host, not in a container (native ``serve``): only the
    first applies, as the others are settings of a container.
    """
    problems: list[str] = []
    from escha_deploy.pipeline.spec import SECRET_API_KEY_PATH

    if spec.port_host_ip not in LOOPBACK and SECRET_API_KEY_PATH not in spec.secret_files:
        problems.append(
            f"container.expose: publishing on {spec.port_host_ip}:{spec.port_host} needs "
            "container.api_key_file (refusing to serve beyond loopback without an API key)"
        )
    if native:
        return problems
    if spec.ipc_mode != "host" and (spec.shm_size_bytes or 0) < MIN_SHM_BYTES:
        problems.append(
            "container: NCCL needs shared memory: ipc_mode host or shm_size >= 16 GB "
            f"(got ipc_mode={spec.ipc_mode}, shm_size={spec.shm_size_bytes})"
        )
    if spec.platform == "wsl2" and isinstance(spec.gpus, list) and spec.gpus:
        problems.append("container.gpus: under WSL2 only 'all' works; ids go in CUDA_VISIBLE_DEVICES")
    return problems


def create_args(spec: ContainerSpec) -> dict[str, Any]:
    """docker-py ``containers.create`` keyword arguments for ``spec``, as plain data.

    Secret files appear as read-only mounts (host path and target, never content). The
    restart policy is ``no``: ``up`` switches it once the server is ready.
    """
    mounts = [
        {"type": m.kind, "source": m.source, "target": m.target, "read_only": m.read_only}
        for m in spec.mounts
    ]
    mounts += [
        {"type": "bind", "source": src, "target": tgt, "read_only": True}
        for tgt, src in sorted(spec.secret_files.items())
    ]
    if spec.profile_file:
        mounts.append(
            {"type": "bind", "source": spec.profile_file, "target": PROFILE_TARGET, "read_only": True}
        )
    device_requests: list[dict[str, Any]] = []
    if isinstance(spec.gpus, list):
        if spec.gpus:
            device_requests.append(
                {"driver": "nvidia", "device_ids": list(spec.gpus), "capabilities": [["gpu"]]}
            )
    else:  # "all"
        count = -1 if spec.platform == "wsl2" or not spec.gpu_count else spec.gpu_count
        device_requests.append({"driver": "nvidia", "count": count, "capabilities": [["gpu"]]})
    args: dict[str, Any] = {
        "image": spec.image,
        "name": spec.name,
        "entrypoint": list(spec.entrypoint),
        "command": list(spec.command),
        "environment": dict(sorted({**spec.environment, SERVE_MODE_ENV: "container"}.items())),
        "labels": dict(sorted({**spec.labels, LABEL_STOP_TIMEOUT: str(spec.stop_timeout_s)}.items())),
        "ports": {f"{spec.port_container}/tcp": (spec.port_host_ip, spec.port_host)},
        "mounts": mounts,
        "device_requests": device_requests,
        "ulimits": [{"name": k, "soft": s, "hard": h} for k, (s, h) in sorted(spec.ulimits.items())],
        "init": spec.init,
        "security_opt": list(spec.security_opt),
        "cap_drop": list(spec.cap_drop),
        "cap_add": list(spec.cap_add),
        "stop_signal": "SIGTERM",
        "stop_timeout": spec.stop_timeout_s,
        "restart_policy": {"Name": "no"},
        "detach": True,
    }
    if spec.ipc_mode:
        args["ipc_mode"] = spec.ipc_mode
    if spec.shm_size_bytes:
        args["shm_size"] = spec.shm_size_bytes
    return args


def to_docker(args: dict[str, Any]) -> dict[str, Any]:
    """Replace the plain mounts/ulimits/device requests in ``args`` with docker-py types."""
    from docker.types import DeviceRequest, Mount, Ulimit

    out = dict(args)
    out.pop("stop_timeout", None)  # not a containers.create argument; see LABEL_STOP_TIMEOUT
    out["mounts"] = [
        Mount(target=m["target"], source=m["source"], type=m["type"], read_only=m["read_only"])
        for m in args["mounts"]
    ]
    out["ulimits"] = [Ulimit(**u) for u in args["ulimits"]]
    out["device_requests"] = [DeviceRequest(**d) for d in args["device_requests"]]
    if not out["device_requests"]:
        del out["device_requests"]
    return out


# --------------------------------------------------------------------------- the daemon


#: Seconds one Docker API call may take once the daemon answered (docker-py's per-request
#: read timeout; its own default is 60).
API_TIMEOUT_S = 60


def connect(timeout_s: float = 10.0):
    """A docker-py client for the daemon in the environment (DOCKER_HOST or the socket).

    Raises ``Refused`` (exit 3) naming the daemon when it does not answer. No separate ping:
    ``from_env`` already asks the daemon for its API version (docker-py ``APIClient``, version
    ``auto``) and raises ``DockerException`` when it cannot, so a ping was a second round trip.
    """
    import docker
    from docker.errors import DockerException

    try:
        client = docker.from_env(timeout=int(timeout_s))
    except DockerException as exc:
        raise Refused(
            f"docker: daemon not reachable ({_one_line(exc)})",
            hint="start Docker (or set DOCKER_HOST) and retry",
        ) from None
    return client


def _one_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


#: The hint of a daemon that answers with an error.
DAEMON_ERROR_HINT = "check the daemon (`docker info`; its log: `journalctl -u docker`) and retry"


def is_daemon_error(exc: BaseException) -> bool:
    """Whether ``exc`` is what docker-py raises for the daemon's answer or its connection: its
    own family (``docker.errors.DockerException``: ``APIError`` for an HTTP error status,
    ``NotFound`` for a container removed meanwhile) or the ``requests`` errors it lets through
    (a connection that breaks mid-call, a read timeout). Tells by module, so that nothing is
    imported to ask."""
    mod = type(exc).__module__ or ""
    return mod == "docker" or mod.startswith(("docker.", "requests.", "urllib3."))


def daemon_refusal(exc: BaseException, command: str = "docker") -> Refused:
    """One line (``Refused``, exit 3) for an error of the Docker API: the status and the call
    (``APIError``: its response's method and path, the daemon's ``message``), never
    docker-py's whole URL with its query or a traceback. Text from the daemon is shown through
    ``termtext.shown`` (no control sequences)."""
    from escha_deploy.utils.termtext import shown

    response = getattr(exc, "response", None)
    status = getattr(exc, "status_code", None) or getattr(response, "status_code", None)
    if status is not None and response is not None:
        from http import HTTPStatus
        from urllib.parse import urlsplit

        try:
            phrase = " " + HTTPStatus(int(status)).phrase
        except ValueError:
            phrase = ""
        req = getattr(response, "request", None)
        call = f"{getattr(req, 'method', '') or ''} {urlsplit(str(getattr(response, 'url', '') or '')).path}".strip()
        why = getattr(exc, "explanation", None) or ""
        if isinstance(why, bytes):
            why = why.decode("utf-8", "replace")
        if status == 404:
            text = f"the daemon no longer knows {call or 'it'} (removed meanwhile?)"
        else:
            text = f"the daemon answered HTTP {status}{phrase} to {call or 'a call'}"
        if why:
            text += f" ({shown(str(why), 200)})"
    else:
        text = f"the daemon's answer broke off ({shown(_one_line(exc), 200)})"
    return Refused(f"{command}: docker: {text}", hint=DAEMON_ERROR_HINT)


@contextlib.contextmanager
def daemon_errors(command: str = "docker") -> Iterator[None]:
    """Run docker-py calls; what the daemon answers with an error (``is_daemon_error``) becomes
    ``daemon_refusal``'s one line."""
    try:
        yield
    except Exception as exc:
        if not is_daemon_error(exc):
            raise
        raise daemon_refusal(exc, command) from None


def find(client, profile: str | None = None, *, all: bool = True) -> list:
    """Containers this tool created (label ``io.escha.managed``), optionally for one profile."""
    labels = [f"{LABEL_MANAGED_BY}={MANAGED_BY}"]
    if profile:
        labels.append(f"{LABEL_PROFILE}={profile}")
    return client.containers.list(all=all, filters={"label": labels}, ignore_removed=True)  # `down` may race


def gpu_runtime(client) -> str | None:
    """The daemon's NVIDIA runtime name (``nvidia`` in ``docker info`` Runtimes, or the CDI
    device spec dirs the daemon reports), or None when Docker has no GPU runtime."""
    info = client.info()
    runtimes = info.get("Runtimes") or {}
    for name in runtimes:
        if "nvidia" in name:
            return name
    for spec_dir in info.get("CDISpecDirs") or []:
        from pathlib import Path

        if any(Path(spec_dir).glob("nvidia*")):
            return "cdi"
    return None


def bind_free(host_ip: str, port: int) -> bool:
    """True when a TCP socket can bind ``host_ip:port`` now (SO_REUSEADDR, so TIME_WAIT
    leftovers of a stopped server do not count as taken)."""
    fam = socket.AF_INET6 if ":" in host_ip else socket.AF_INET
    with socket.socket(fam, socket.SOCK_STREAM) as s:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            s.bind((host_ip, port))
            return True
        except OSError:
            return False


def port_owner(client, host_ip: str, port: int) -> str | None:
    """Who holds ``host_ip:port``: None when a bind test succeeds, else a description naming a
    container publishing it or, failing that, the owning process (psutil)."""
    if bind_free(host_ip, port):
        return None
    for c in client.containers.list(ignore_removed=True):
        for binds in (c.attrs.get("HostConfig", {}).get("PortBindings") or {}).values():
            for b in binds or []:
                if str(b.get("HostPort")) == str(port):
                    return f"container {c.name} ({c.short_id})"
    return listening_process(port) or "an unknown process"


def listening_process(port: int) -> str | None:
    """``process PID (name)`` listening on TCP ``port`` (psutil ``net_connections``), or None
    when none is visible (another user's process without privileges, another network
    namespace). Best effort: the port is taken either way."""
    try:
        import psutil

        for conn in psutil.net_connections(kind="inet"):
            if conn.status == psutil.CONN_LISTEN and conn.laddr and conn.laddr.port == port:
                if conn.pid:
                    p = psutil.Process(conn.pid)
                    return f"process {conn.pid} ({p.name()})"
    except Exception:  # noqa: BLE001 - best effort naming; the port is taken either way
        pass
    return None


def create_and_start(client, args: dict[str, Any]):
    """Create and start the container from ``create_args`` output; returns the container.

    On a start failure the created container is removed, so a failed ``up`` leaves nothing.
    """
    from docker.errors import APIError, ImageNotFound

    try:
        container = client.containers.create(**to_docker(args))
    except ImageNotFound:
        raise Refused(f"image {args['image']}: not found", hint="build it: `escha-deploy up --build`") from None
    except APIError as exc:
        if exc.status_code == 409:  # the name is taken: the daemon arbitrates between two `up`s
            raise Refused(f"up: another `up` is starting this profile: the daemon already has a "
                          f"container named {args['name']} (409 Conflict)",
                          hint="wait for it, or stop it: escha-deploy down --profile "
                          + args.get("labels", {}).get(LABEL_PROFILE, "NAME")) from None
        raise Refused(f"docker create: {_one_line(exc)}") from None
    try:
        container.start()
    except APIError as exc:
        with contextlib.suppress(Exception):
            container.remove(force=True)
        raise Failed(f"docker start: {_one_line(exc)}") from None
    return container


def set_restart_after_ready(container, policy: dict[str, int | str]) -> None:
    """Switch the restart policy once ready (``on-failure`` with a cap, from the spec)."""
    container.update(restart_policy=dict(policy))


def stop(container, timeout_s: int) -> None:
    """SIGTERM, ``timeout_s`` of grace, then SIGKILL (``docker stop -t``); then remove the
    container. Volumes and bind-mounted folders (the L3 directory) are never touched."""
    from docker.errors import APIError, NotFound

    try:
        container.stop(timeout=timeout_s)
    except NotFound:
        return
    try:
        container.remove(v=False)
    except NotFound:
        pass
    except APIError as exc:  # 409: another command (`down`, a second `up`) is removing it
        if exc.status_code != 409:
            raise
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                container.reload()
            except NotFound:
                return
            time.sleep(0.1)


def published(container) -> tuple[str, int] | None:
    """The (host ip, host port) a container publishes, from its HostConfig (None if none)."""
    for binds in (container.attrs.get("HostConfig", {}).get("PortBindings") or {}).values():
        for b in binds or []:
            if b.get("HostPort"):
                return (b.get("HostIp") or "0.0.0.0", int(b["HostPort"]))
    return None


def wait_port_free(host_ip: str, port: int, timeout_s: float = 30.0) -> bool:
    """Poll a bind test until ``host_ip:port`` is free; False when still taken at the end."""
    deadline = time.monotonic() + timeout_s
    while True:
        if bind_free(host_ip, port):
            return True
        if time.monotonic() > deadline:
            return False
        time.sleep(0.1)


def log_lines(container, *, follow: bool, tail: int | str = "all", since: float | None = None) -> Iterator[str]:
    """The container's output (stdout and stderr) as text lines."""
    kwargs: dict[str, Any] = {"stream": True, "follow": follow, "tail": tail}
    if since is not None:
        kwargs["since"] = since
    buf = b""
    for chunk in container.logs(**kwargs):
        buf += chunk
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode("utf-8", "replace").rstrip("\r")
    if buf:
        yield buf.decode("utf-8", "replace")


def image_labels(client, image: str) -> dict[str, str] | None:
    """The image's labels, or None when the image is not present."""
    from docker.errors import ImageNotFound

    try:
        return dict(client.images.get(image).labels or {})
    except ImageNotFound:
        return None


def read_file_from_image(client, image: str, path: str) -> bytes | None:
    """Read one file from an image without starting it (create, get_archive, remove)."""
    import io
    import tarfile

    from docker.errors import APIError, NotFound

    c = client.containers.create(image, entrypoint=["/nonexistent"], labels={LABEL_MANAGED_BY: "escha-deploy-probe"})
    try:
        stream, _ = c.get_archive(path)
        data = b"".join(stream)
        with tarfile.open(fileobj=io.BytesIO(data)) as tar:
            member = tar.next()
            f = tar.extractfile(member) if member else None
            return f.read() if f else None
    except (NotFound, APIError):
        return None
    finally:
        with contextlib.suppress(Exception):
            c.remove(force=True)


#: What a daemon that cannot raise RLIMIT_MEMLOCK needs instead of ``--ulimit memlock=-1``:
#: runc sets the container's rlimits with the daemon's privileges, so a daemon without
#: CAP_SYS_RESOURCE (rootless Docker, an unprivileged LXC container, some nested setups) fails
#: with "error setting rlimit type 8: operation not permitted" (onyx-dot-app/onyx PR #9277,
#: containerd/nerdctl#1937). Pinned HiCache pools need memlock unlimited.
MEMLOCK_DAEMON_FIX = ("run rootful Docker, or give the daemon CAP_SYS_RESOURCE (systemd: LimitMEMLOCK=infinity "
                      "in docker.service, then `systemctl daemon-reload && systemctl restart docker`); "
                      "--ulimit memlock=-1 cannot help while the daemon itself may not raise the limit")

#: The rlimit error runc reports (RLIMIT_MEMLOCK is resource 8 on Linux).
MEMLOCK_RLIMIT_ERROR = "error setting rlimit type 8"


def memlock_probe(client, image: str, timeout_s: float = 60.0) -> str | None:
    """Whether this daemon can start a container with ``--ulimit memlock=-1`` (what ``up``
    and compose ask for): a one-second ``true`` container of ``image`` (present here; never
    pulled), no network, removed afterwards. Returns None when it started, else the daemon's
    error, first line (``error setting rlimit type 8: operation not permitted`` on a daemon
    without CAP_SYS_RESOURCE). Raises docker-py's errors for anything else (image missing,
    daemon gone) to the caller."""
    import os
    import uuid

    from docker.errors import APIError
    from docker.types import Ulimit

    name = f"escha-memlock-probe-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    c = client.containers.create(image, entrypoint=["true"], command=[], name=name, network_disabled=True,
                                 labels={LABEL_PREFIX + "probe": "memlock"},
                                 ulimits=[Ulimit(name="memlock", soft=-1, hard=-1)])
    try:
        c.start()
        c.wait(timeout=timeout_s)
        return None
    except APIError as exc:
        text = str(getattr(exc, "explanation", None) or exc)
        if MEMLOCK_RLIMIT_ERROR not in text and "memlock" not in text and "rlimit" not in text:
            raise
        i = text.find("error setting rlimits")
        return " ".join(text[i if i >= 0 else 0:].split())[:300]
    finally:
        with contextlib.suppress(Exception):
            c.remove(force=True)


def memlock_refusal_line(image: str, error: str) -> str:
    """The one line ``up`` refuses with and ``doctor`` reports when ``memlock_probe`` failed."""
    return (f"docker: this daemon cannot raise memlock (rootless Docker or an unprivileged LXC container): a "
            f"container of {image} with --ulimit memlock=-1 fails: {error}")
