"""``--hicache-ab``: start a profile with HiCache off, then on, and run the same workload on both.

The bench does not start servers itself; it asks a launcher through ``Launcher``, the small
interface below, so the docker code stays in ``escha_deploy.launch`` (the
core never imports docker). ``load_launcher`` finds the launcher's implementation at
``escha_deploy.launch.bench_launcher`` (a callable returning a ``Launcher``); until that exists,
``--hicache-ab`` refuses with exit 3 and says so. ``--launcher`` picks Docker (``up``/``down``)
or the native path (``serve --profile`` as a child); ``auto`` takes Docker when a daemon answers.

What the launcher must do in ``start(profile, hicache=...)``: start the profile with
``hicache.enabled`` forced to ``hicache`` (nothing else changed, so the two runs differ only in
HiCache), with the flags the bench reads turned on (``--enable-cache-report`` and
``--enable-metrics``; ``up`` turns them on for every profile), wait until ready (``/health``
200), and return the base URL (``http://127.0.0.1:PORT``). ``stop()`` stops what ``start``
started and returns when it is gone. Errors are ``EschaError`` subclasses (``Refused`` for an
unsafe plan, ``Failed`` for a crash or ready timeout), which the bench lets through.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Protocol, runtime_checkable

from escha_deploy.utils.errors import Refused

from .models import BenchReport, ServerRun, WorkloadSpec
from .workload import bench_endpoint

Step = Callable[[str], None]


@runtime_checkable
class Launcher(Protocol):
    """What ``--hicache-ab`` needs from the launcher (see the module docstring)."""

    def start(self, profile: str, *, hicache: bool) -> str:
        """Start ``profile`` with HiCache on or off, wait until ready, return the base URL."""
        ...

    def stop(self) -> None:
        """Stop the server that ``start`` started; return once it is gone."""
        ...


def load_launcher(kind: str = "auto") -> Launcher:
    """The launcher's ``bench_launcher(kind)`` (``docker``, ``native`` or ``auto``: Docker when
    a daemon answers, else ``serve --profile`` natively); ``Refused`` (exit 3) until it is wired."""
    try:
        mod = importlib.import_module("escha_deploy.launch")
    except ImportError:
        mod = None
    factory = getattr(mod, "bench_launcher", None) if mod is not None else None
    if factory is None:
        raise Refused(
            "--hicache-ab: this build has no launcher for the bench "
            "(escha_deploy.launch.bench_launcher is missing)",
            hint="start the two servers yourself and use --endpoint URL_OFF --compare URL_ON",
        )
    from escha_deploy.doctor.doctor_probe import doctor_in_image

    launcher = factory(kind, doctor_probe=doctor_in_image)
    if not isinstance(launcher, Launcher):
        raise TypeError(f"escha_deploy.launch.bench_launcher() returned {launcher!r}, "
                        "which lacks start(profile, hicache=) / stop()")
    return launcher


async def run_ab(
    launcher: Launcher, profile: str, spec: WorkloadSpec, step: Step = lambda _: None,
    **client_kw,
) -> BenchReport:
    """HiCache off, then on: start, run the workload, stop; the report has both runs.

    The server is stopped after each run, also when the run fails (the error propagates).
    """
    runs: list[ServerRun] = []
    for hicache in (False, True):
        state = "on" if hicache else "off"
        step(f"starting {profile} with HiCache {state}")
        url = launcher.start(profile, hicache=hicache)
        try:
            runs.append(await bench_endpoint(url, spec, step, **client_kw))
        finally:
            step(f"stopping {profile} (HiCache {state})")
            launcher.stop()
    return BenchReport(workload=spec, runs=runs, mode="hicache-ab")
