"""Launching a profile's server.

Modules, by meaning:

- ``prepare``: what the `up` and `serve` paths share: profile -> host facts -> plan ->
  ``LaunchSpec``, with the refusals that need no daemon (``Prepared``, ``prepare``).
- ``up``: the `up` path on this host's Docker (docker-py): preflight, create, wait, drift.
- ``serve``: the `serve` path: the container's entrypoint and the native launcher.
- ``manage``: `down`, `status`, `logs` for containers `up` started.
- ``progress``: the ``Report`` callback launch code reports progress through.
- ``docker`` (docker-py calls), ``compose`` (compose.yaml), ``native`` (the supervised child),
  ``ready``, ``drift``, ``diagnose``, ``redact``: the parts those paths use.

``bench_launcher()`` is the adapter the bench's ``--hicache-ab`` uses (``bench/ab.py``
``Launcher``): through Docker it starts a profile with ``up.up`` and stops it with
``manage.down``; natively (``NativeBenchLauncher``: no daemon reachable, or asked for) it runs
``escha-deploy serve --profile`` as a child and stops it with SIGTERM.
Kept import-light: docker-py is imported only when a launcher is used.
"""

from __future__ import annotations

from collections.abc import Callable

from .progress import Report, stderr


class DockerBenchLauncher:
    """``Launcher`` for ``bench --hicache-ab``: ``start(profile, hicache=)`` runs ``up`` with
    ``hicache.enabled`` forced (nothing else changed) and returns the endpoint once ready;
    ``stop()`` runs ``down`` for that profile and returns once its container is gone.
    ``up``'s progress goes to ``report`` (default: stderr). ``doctor_probe``: doctor's probes
    in the image, which ``up`` runs (``launch.up.DoctorProbe``; the bench passes
    ``doctor.doctor_probe.doctor_in_image``; without it, a profile that requests GPUs with no
    fresh findings saved stops at ``up``'s ``doctor probes`` check, exit 1).
    Errors are ``EschaError`` subclasses from ``up`` (``Refused`` 3, ``Failed`` 4)."""

    def __init__(self, overrides: tuple[str, ...] = (), report: Report = stderr, *,
                 doctor_probe: Callable[..., bool] | None = None) -> None:
        self.overrides = tuple(overrides)
        self.report = report
        self.doctor_probe = doctor_probe
        self._profile: str | None = None

    def start(self, profile: str, *, hicache: bool) -> str:
        from .up import up

        res = up(profile, [*self.overrides, f"hicache.enabled={'true' if hicache else 'false'}"],
                 report=self.report, doctor_probe=self.doctor_probe)
        self._profile = res.profile
        return res.endpoint

    def stop(self) -> None:
        from .manage import down

        if self._profile is not None:
            down(self._profile)
            self._profile = None


class NativeBenchLauncher:
    """``Launcher`` for ``bench --hicache-ab`` without Docker: ``start(profile, hicache=)`` runs
    ``escha-deploy serve --profile PROFILE --set hicache.enabled=... --set container.port=N``
    (the native path: the same plan, SGLang's pre-flight, a supervised server) on a free
    loopback port, its output in ``log_dir/serve-hicache-{on,off}.log``, and returns
    ``http://127.0.0.1:N`` once ``/health`` answers 200; ``stop()`` sends SIGTERM and waits for
    ``serve`` to exit (it stops SGLang's whole tree first; SIGKILL after ``stop_timeout_s``).

    Errors: ``Failed`` (exit 4) when ``serve`` exits before ready or is not ready within
    ``ready_timeout_s`` seconds (the log's last lines and its path are in the message),
    ``Refused`` (exit 3) when ``serve`` refused the profile (its exit 2 or 3)."""

    def __init__(self, overrides: tuple[str, ...] = (), report: Report = stderr, *,
                 ready_timeout_s: float = 900.0, stop_timeout_s: float = 120.0,
                 log_dir: str | None = None, command: list[str] | None = None) -> None:
        import sys

        #: what runs ``serve --profile ...`` (a test gives the stand-in server's script)
        self.command = list(command) if command else [sys.executable, "-m", "escha_deploy"]
        self.overrides = tuple(overrides)
        self.report = report
        self.ready_timeout_s = ready_timeout_s
        self.stop_timeout_s = stop_timeout_s
        self.log_dir = log_dir
        self._proc = None
        self.logs: list[str] = []

    def start(self, profile: str, *, hicache: bool) -> str:
        import os
        import socket
        import subprocess
        import tempfile
        import time

        import httpx

        from escha_deploy.utils.errors import Failed, Refused

        with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        log_dir = self.log_dir or tempfile.mkdtemp(prefix="escha-bench-")
        log = os.path.join(log_dir, f"serve-hicache-{'on' if hicache else 'off'}.log")
        self.logs.append(log)
        sets = [*self.overrides, f"hicache.enabled={'true' if hicache else 'false'}", f"container.port={port}"]
        argv = [*self.command, "serve", "--profile", profile]
        for item in sets:
            argv += ["--set", item]
        self.report("info", f"serve --profile {profile} (HiCache {'on' if hicache else 'off'}), log {log}")
        with open(log, "wb") as out:
            self._proc = proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT,
                                                 stdin=subprocess.DEVNULL)
        url = f"http://127.0.0.1:{port}"
        deadline = time.monotonic() + self.ready_timeout_s
        while True:
            code = proc.poll()
            if code is not None:
                self._proc = None
                tail = _tail(log)
                if code in (2, 3):
                    raise Refused(f"serve --profile {profile} refused it (exit {code}): {tail}",
                                  hint=f"the whole log: {log}")
                raise Failed(f"serve --profile {profile} exited {code} before ready: {tail}",
                             hint=f"the whole log: {log}")
            if time.monotonic() > deadline:
                self.stop()
                raise Failed(f"serve --profile {profile}: not ready in {self.ready_timeout_s:.0f} s: {_tail(log)}",
                             hint=f"the whole log: {log}")
            try:
                if httpx.get(url + "/health", timeout=3, trust_env=False).status_code == 200:
                    return url
            except httpx.HTTPError:
                pass
            time.sleep(1)

    def stop(self) -> None:
        import signal
        import subprocess

        proc, self._proc = self._proc, None
        if proc is None or proc.poll() is not None:
            return
        proc.send_signal(signal.SIGTERM)
        try:
            proc.wait(timeout=self.stop_timeout_s)
        except subprocess.TimeoutExpired:
            self.report("warning", f"serve did not exit {self.stop_timeout_s:.0f} s after SIGTERM: SIGKILL")
            proc.kill()
            proc.wait()


def _tail(path: str, lines: int = 3) -> str:
    try:
        with open(path, "rb") as f:
            text = f.read()[-8192:].decode("utf-8", "replace")
    except OSError:
        return "(no log)"
    return " | ".join(x.strip() for x in text.strip().splitlines()[-lines:]) or "(empty log)"


def docker_reachable(timeout_s: float = 5.0) -> bool:
    """Whether a Docker daemon answers (``docker.connect``), without raising."""
    from escha_deploy.utils.errors import Refused

    try:
        from .docker import connect

        connect(timeout_s).close()
    except (Refused, ImportError):
        return False
    return True


def bench_launcher(kind: str = "auto", *, doctor_probe: Callable[..., bool] | None = None,
                   ) -> DockerBenchLauncher | NativeBenchLauncher:
    """The launcher ``escha-deploy bench --hicache-ab`` uses (``bench.ab.load_launcher``):
    ``docker`` (``up``/``down``, with ``doctor_probe``: doctor's probes in the image), ``native``
    (``serve --profile`` as a child), or ``auto``: Docker when a daemon answers, else native.
    Raises ``ValueError`` for another ``kind``."""
    if kind == "auto":
        kind = "docker" if docker_reachable() else "native"
    if kind == "docker":
        return DockerBenchLauncher(doctor_probe=doctor_probe)
    if kind == "native":
        return NativeBenchLauncher()
    raise ValueError(f"launcher {kind!r}: docker, native or auto")
