"""Launching: docker-py ``up``/``down``/``status``/``logs``, the native ``serve`` supervisor,
failure diagnosis, readiness and the plan-vs-server drift check.

``bench_launcher()`` is the adapter the bench's ``--hicache-ab`` uses (``bench/ab.py``
``Launcher``): it starts a profile through ``lifecycle.up`` and stops it through
``lifecycle.down``. Kept import-light: docker-py is imported only when a launcher is used.
"""

from __future__ import annotations


class DockerBenchLauncher:
    """``Launcher`` for ``bench --hicache-ab``: ``start(profile, hicache=)`` runs ``up`` with
    ``hicache.enabled`` forced (nothing else changed) and returns the endpoint once ready;
    ``stop()`` runs ``down`` for that profile and returns once its container is gone.
    Errors are ``EschaError`` subclasses from ``up`` (``Refused`` 3, ``Failed`` 4)."""

    def __init__(self, overrides: tuple[str, ...] = ()) -> None:
        self.overrides = tuple(overrides)
        self._profile: str | None = None

    def start(self, profile: str, *, hicache: bool) -> str:
        from .lifecycle import up

        res = up(profile, [*self.overrides, f"hicache.enabled={'true' if hicache else 'false'}"])
        self._profile = res.profile
        return res.endpoint

    def stop(self) -> None:
        from .lifecycle import down

        if self._profile is not None:
            down(self._profile)
            self._profile = None


def bench_launcher() -> DockerBenchLauncher:
    """The launcher ``escha-deploy bench --hicache-ab`` uses (``bench.ab.load_launcher``)."""
    return DockerBenchLauncher()
