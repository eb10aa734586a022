"""Start SMG on this box (natively or in a container) and ask it how its workers are.

``start_router`` starts it and returns at once; ``wait_workers`` polls SMG's ``GET /workers``
until every expected worker is healthy (SMG marks a worker healthy after
``--health-success-threshold`` good ``/health`` answers; a loading SGLang answers 503), or the
deadline passes. ``router_workers`` is what ``fleet status`` shows. Native: the ``smg`` package's
Python runs ``smg_launch.py`` in its own session, logging to
``<cache>/fleet/<fleet>-router.log`` with its pid in ``...-router.pid``. Container: docker-py runs
the router image with host networking (the workers are on other boxes' addresses, or on this
box's loopback), the key file mounted read-only, and labels that name the fleet, never the key.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

from pydantic import BaseModel, Field

from ..sglang.capabilities import LABEL_PREFIX
from ..utils.errors import BadInput, Failed, Refused
from ..utils.netaddr import url as http_url
from .model import LoadedFleet
from .plan import FleetPlan
from .router import CONTAINER_KEY_PATH, launch_command, router_args


class WorkerState(BaseModel):
    """One worker as SMG's ``GET /workers`` describes it."""

    url: str
    healthy: bool
    status: str | None = Field(None, description="SMG's lifecycle status (e.g. ready)")
    model_id: str | None = None
    load: int | None = None


class RouterState(BaseModel):
    """What SMG reports: its URL, readiness and each worker."""

    url: str
    reachable: bool
    error: str | None = None
    workers: list[WorkerState] = []
    expected: list[str] = []

    @property
    def ready(self) -> bool:
        healthy = {w.url for w in self.workers if w.healthy}
        return self.reachable and all(u in healthy for u in self.expected)


def _state_dir() -> Path:
    from ..utils.paths import cache_dir

    d = cache_dir() / "fleet"
    d.mkdir(parents=True, exist_ok=True)
    return d


def router_url(loaded: LoadedFleet) -> str:
    """How this box reaches the router: 127.0.0.1 when it listens there, else its box's address."""
    r = loaded.fleet.router
    assert r is not None
    host = loaded.fleet.box(r.box).address if r.expose else "127.0.0.1"
    return http_url(host, r.port)


def read_key(loaded: LoadedFleet) -> str | None:
    r = loaded.fleet.router
    if r is None or not r.api_key_file:
        return None
    from ..utils.httpread import header_safe
    from ..launch.prepare import read_secret

    key = read_secret(str(loaded.resolve(r.api_key_file)), "router.api_key_file")
    if not header_safe(key):
        raise BadInput(f"router.api_key_file {r.api_key_file}: the key holds a character that cannot go in an "
                       "HTTP header (only printable ASCII); the key is not shown")
    return key


def router_workers(loaded: LoadedFleet, expected: list[str] | None = None,
                   timeout_s: float | None = None) -> RouterState:
    """Ask SMG ``GET /workers`` (with the API key when the fleet has one), read through the
    policy for servers we do not control (``httpread``: ``timeout_s`` seconds in all, default
    ``httpread.DEFAULT_DEADLINE_S``; a size cap; no redirect). The router's strings are kept
    printable; a worker entry of another shape is left out; an answer that is not SMG's
    ``{"workers": [...]}`` is ``error`` with ``reachable`` (it answered). Never raises."""
    from ..utils import httpread
    from ..utils.termtext import shown

    url = router_url(loaded)
    key = read_key(loaded)
    headers = {"Authorization": f"Bearer {key}"} if key else {}
    try:
        answer = httpread.get(f"{url}/workers", headers=headers,
                              policy=httpread.Policy(deadline_s=timeout_s or httpread.DEFAULT_DEADLINE_S))
        if (problem := httpread.status_problem(answer)) is not None:
            raise httpread.BadAnswer(answer.url, f"answered {problem}")
        data = answer.json()
    except httpread.ReadFailed as exc:
        return RouterState(url=url, reachable=False, error=str(exc), expected=expected or [])
    entries = data.get("workers") if isinstance(data, dict) else None
    if not isinstance(entries, list):  # not "no worker registered": an answer of another shape
        got = ("an object without a 'workers' list" if isinstance(data, dict)
               else f"JSON {type(data).__name__}" if data is not None else "JSON null")
        return RouterState(url=url, reachable=True, expected=expected or [],
                           error=f"{answer.url} answered {got}, not SMG's {{\"workers\": [...]}}")
    workers = []
    for w in entries if isinstance(entries, list) else []:
        if not isinstance(w, dict):
            continue
        text = {k: shown(w[k], 120) if isinstance(w.get(k), str) else None for k in ("url", "status", "model_id")}
        load = w.get("load")
        workers.append(WorkerState(url=text["url"] or "?", healthy=w.get("is_healthy") is True, status=text["status"],
                                   model_id=text["model_id"],
                                   load=load if isinstance(load, int) and not isinstance(load, bool) else None))
    return RouterState(url=url, reachable=True, workers=workers, expected=expected or [])


def smg_python() -> str:
    """The Python interpreter that has ``smg``: this one if it imports, else the one named by
    the ``smg`` script's ``#!`` line. ``Refused`` when neither exists."""
    import importlib.util

    if importlib.util.find_spec("smg") is not None:
        return sys.executable
    exe = shutil.which("smg")
    if exe:
        first = Path(exe).read_bytes()[:200].split(b"\n", 1)[0]
        if first.startswith(b"#!"):
            return first[2:].decode().strip().split()[0]
    raise Refused("the smg router is not installed here: `pip install smg==1.13.0` "
                  "(or set router.run: container and build its image)")


def _pid_file(loaded: LoadedFleet) -> Path:
    return _state_dir() / f"{loaded.fleet.name}-router.pid"


def log_file(loaded: LoadedFleet) -> Path:
    return _state_dir() / f"{loaded.fleet.name}-router.log"


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except (ProcessLookupError, PermissionError):
        return False
    try:  # a zombie child of this process counts as gone
        done, _ = os.waitpid(pid, os.WNOHANG)
        return done == 0
    except ChildProcessError:
        return True


def native_pid(loaded: LoadedFleet) -> int | None:
    """The pid of this fleet's native router, when it runs. A pid file whose number is not a
    process this tool could have started (outside 2..``PID_MAX_LIMIT``: 0, -1 and 1 would make
    ``stop_router``'s ``killpg`` signal a whole process group or init's) counts as none."""
    from ..launch.native import PID_MAX_LIMIT

    try:
        text = _pid_file(loaded).read_text(errors="replace").strip()
        pid = int(text) if text.isascii() and text.isdigit() and len(text) <= 10 else 0
    except OSError:
        return None
    return pid if 1 < pid <= PID_MAX_LIMIT and _alive(pid) else None


def container_name(loaded: LoadedFleet) -> str:
    return f"escha-{loaded.fleet.name}-router"


def _container_settings(loaded: LoadedFleet, args: list[str], key_file: str | None) -> dict:
    """The docker-py ``containers.create`` keyword arguments of the router container (what
    ``start_router`` runs and ``describe_router`` prints): host networking, the key file mounted
    read-only, labels that name the fleet, never the key."""
    r = loaded.fleet.router
    return dict(
        image=r.image,
        command=launch_command(args, CONTAINER_KEY_PATH if key_file else None, launcher="/usr/local/bin/smg_launch.py"),
        name=container_name(loaded), network_mode="host",
        volumes={key_file: {"bind": CONTAINER_KEY_PATH, "mode": "ro"}} if key_file else {},
        labels={f"{LABEL_PREFIX}fleet": loaded.fleet.name, f"{LABEL_PREFIX}role": "router",
                f"{LABEL_PREFIX}managed-by": "escha-deploy"},
        cap_drop=["ALL"], security_opt=["no-new-privileges"], read_only=True, tmpfs={"/tmp": ""},
        stop_signal="SIGTERM")


def describe_router(loaded: LoadedFleet, fp: FleetPlan, *, urls: list[str]) -> dict:
    """What ``start_router`` would run, started nothing and asked no daemon (``fleet up --router
    --dry-run``): ``{"run", "workers", "command"}`` and, for ``run: container``, ``"container"``
    (the ``containers.create`` settings). The command names the key file, never the key."""
    r = loaded.fleet.router
    args = router_args(loaded, fp, urls=urls)
    key_file = str(loaded.resolve(r.api_key_file)) if r.api_key_file else None
    from .router import overload_thresholds

    why = overload_thresholds(loaded, fp)[2]
    if r.run == "native":
        return {"run": "native", "workers": urls, "overload": why,
                "command": launch_command(args, key_file, python="python3")}
    settings = _container_settings(loaded, args, key_file)
    return {"run": "container", "workers": urls, "overload": why, "command": settings.pop("command"),
            "container": settings}


def _docker_line(exc: BaseException) -> str:
    return " ".join(str(exc).split())[:300]


def start_router(loaded: LoadedFleet, fp: FleetPlan, *, urls: list[str] | None = None) -> str:
    """Start SMG for ``loaded`` on this box; return what runs (a pid or a container name).
    ``Refused`` (exit 3) when it already runs or cannot start here (no daemon, the router image
    is not on this box: it is never pulled, no registry holds it), ``Failed`` (exit 4) when the
    daemon made the container but could not start it."""
    r = loaded.fleet.router
    args = router_args(loaded, fp, urls=urls)
    key_file = str(loaded.resolve(r.api_key_file)) if r.api_key_file else None
    if r.run == "native":
        if native_pid(loaded) is not None:
            raise Refused(f"the router of fleet {loaded.fleet.name} already runs (pid {native_pid(loaded)})")
        cmd = launch_command(args, key_file, python=smg_python())
        log = open(log_file(loaded), "wb")  # one start per log: status and errors read this run
        env = {k: v for k, v in os.environ.items() if k not in ("http_proxy", "HTTP_PROXY", "https_proxy", "HTTPS_PROXY")}
        proc = subprocess.Popen(cmd, stdin=subprocess.DEVNULL, stdout=log, stderr=subprocess.STDOUT,
                                start_new_session=True, env=env)
        log.close()
        _pid_file(loaded).write_text(str(proc.pid))
        return f"pid {proc.pid}"
    from docker.errors import DockerException, ImageNotFound, NotFound
    from requests.exceptions import RequestException

    from ..launch.docker import connect

    daemon_errors = (DockerException, RequestException)  # RequestException: it stopped answering mid-way
    client = connect()
    name = container_name(loaded)
    settings = _container_settings(loaded, args, key_file)
    build_hint = "build it with `escha-deploy fleet build-router --base-image IMAGE`"
    try:
        try:
            client.containers.get(name)
            raise Refused(f"container {name} exists; remove it first (docker rm -f {name})")
        except NotFound:
            pass
        client.images.get(r.image)  # docker-py's containers.run would pull a missing image
        container = client.containers.create(**settings)
    except ImageNotFound:
        raise Refused(f"router image {r.image} is not on this box: {build_hint}") from None
    except daemon_errors as exc:
        raise Refused(f"docker: cannot create the router container {name}: {_docker_line(exc)}") from None
    try:
        container.start()
    except daemon_errors as exc:
        raise Failed(f"docker: the router container {name} did not start: {_docker_line(exc)}",
                     hint=f"docker rm -f {name}") from None
    return f"container {name}"


def router_alive(loaded: LoadedFleet) -> tuple[bool, str]:
    """Whether this box's router process/container runs, and a log tail when it does not."""
    r = loaded.fleet.router
    if r.run == "native":
        if native_pid(loaded) is not None:
            return True, ""
        try:
            tail = log_file(loaded).read_text(errors="replace").strip().splitlines()[-3:]
        except OSError:
            tail = []
        return False, " | ".join(tail)
    from docker.errors import DockerException, NotFound

    from ..launch.docker import connect

    try:
        c = connect().containers.get(container_name(loaded))
        if c.status in ("created", "running"):
            return True, ""
        return False, " | ".join(c.logs(tail=3).decode(errors="replace").strip().splitlines())
    except NotFound:
        return False, "container is gone"
    except DockerException as exc:
        return False, f"docker: {_docker_line(exc)}"
    except Refused as exc:  # the daemon stopped answering
        return False, exc.message


def wait_workers(loaded: LoadedFleet, expected: list[str], timeout_s: float, poll_s: float = 1.0) -> RouterState:
    """Poll SMG until every URL in ``expected`` is healthy. ``Failed`` (exit 4) when the router
    dies or the deadline passes, naming the workers that are not ready."""
    deadline = time.monotonic() + timeout_s
    state = router_workers(loaded, expected)
    while not state.ready:
        alive, why = router_alive(loaded)
        if not alive:
            raise Failed(f"the router exited: {why or 'no log'}", hint=f"see {log_file(loaded)}")
        if time.monotonic() > deadline:
            healthy = {w.url for w in state.workers if w.healthy}
            missing = [u for u in expected if u not in healthy]
            raise Failed(f"router not ready after {timeout_s:.0f} s: workers not healthy: {', '.join(missing)}",
                         hint="`escha-deploy fleet status FILE` shows what SMG sees")
        time.sleep(poll_s)
        state = router_workers(loaded, expected)
    return state


def stop_router(loaded: LoadedFleet, grace_s: float = 15.0) -> bool:
    """SIGTERM this fleet's router (native pid or container), wait ``grace_s``; True when one ran."""
    import signal

    r = loaded.fleet.router
    if r.run == "native":
        pid = native_pid(loaded)
        if pid is None:
            return False
        os.killpg(pid, signal.SIGTERM)
        end = time.monotonic() + grace_s
        while _alive(pid) and time.monotonic() < end:
            time.sleep(0.2)
        if _alive(pid):
            os.killpg(pid, signal.SIGKILL)
        _pid_file(loaded).unlink(missing_ok=True)
        return True
    from docker.errors import DockerException, NotFound

    from ..launch.docker import connect

    try:
        c = connect().containers.get(container_name(loaded))
        c.stop(timeout=int(grace_s))
        c.remove()
    except NotFound:
        return False
    except DockerException as exc:
        raise Failed(f"docker: cannot stop the router container {container_name(loaded)}: {_docker_line(exc)}") from None
    return True
