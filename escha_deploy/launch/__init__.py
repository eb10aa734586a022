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
``Launcher``): it starts a profile through ``up.up`` and stops it through ``manage.down``.
Kept import-light: docker-py is imported only when a launcher is used.
"""

from __future__ import annotations

from .progress import Report, stderr


class DockerBenchLauncher:
    """``Launcher`` for ``bench --hicache-ab``: ``start(profile, hicache=)`` runs ``up`` with
    ``hicache.enabled`` forced (nothing else changed) and returns the endpoint once ready;
    ``stop()`` runs ``down`` for that profile and returns once its container is gone.
    ``up``'s progress goes to ``report`` (default: stderr).
    Errors are ``EschaError`` subclasses from ``up`` (``Refused`` 3, ``Failed`` 4)."""

    def __init__(self, overrides: tuple[str, ...] = (), report: Report = stderr) -> None:
        self.overrides = tuple(overrides)
        self.report = report
        self._profile: str | None = None

    def start(self, profile: str, *, hicache: bool) -> str:
        from .up import up

        res = up(profile, [*self.overrides, f"hicache.enabled={'true' if hicache else 'false'}"],
                 report=self.report)
        self._profile = res.profile
        return res.endpoint

    def stop(self) -> None:
        from .manage import down

        if self._profile is not None:
            down(self._profile)
            self._profile = None


def bench_launcher() -> DockerBenchLauncher:
    """The launcher ``escha-deploy bench --hicache-ab`` uses (``bench.ab.load_launcher``)."""
    return DockerBenchLauncher()
