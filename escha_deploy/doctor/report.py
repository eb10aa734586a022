"""The doctor report: checks that end ok, warn, fail or unknown, each with a one-line fix.

A ``Check`` is one row of the report. ``profile`` marks a check that decides whether a profile
can run here: with ``--profile``, ``doctor`` exits 3 when any such check fails (docs/
doctor.md), and 0 otherwise; without a profile it exits 0 once the checks ran. ``unknown`` is a
check whose probe could not run (no torch in this Python, say): never a failure; doctor exits 5
(inconclusive) when a verdict would rest on it and no check failed on its own.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, model_validator

Status = Literal["ok", "warn", "fail", "unknown"]


class Check(BaseModel):
    """One check: what was looked at, what was seen, and what to do about it.

    ``id`` is a stable dotted name (``host.memlock``, ``gpu.count``, ``probe.store``) that tests
    and ``up``'s preflight refer to. ``detail`` is one line of what was seen, with units.
    ``fix`` is one line, required when ``status`` is warn, fail or unknown.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    id: str
    status: Status
    detail: str
    fix: str | None = None
    profile: bool = Field(
        default=False, description="True when this check decides whether the profile runs here"
    )

    @model_validator(mode="after")
    def _one_line_fix(self) -> "Check":
        if self.status != "ok" and not self.fix:
            raise ValueError(f"check {self.id}: a {self.status} needs a fix")
        for name in ("detail", "fix"):
            value = getattr(self, name)
            if value is not None and "\n" in value:
                raise ValueError(f"check {self.id}: {name} must be one line")
        return self


def ok(id: str, detail: str, *, profile: bool = False) -> Check:
    """An ok check."""
    return Check(id=id, status="ok", detail=detail, profile=profile)


def warn(id: str, detail: str, fix: str, *, profile: bool = False) -> Check:
    """A warning: the box works, but something deserves attention."""
    return Check(id=id, status="warn", detail=detail, fix=fix, profile=profile)


def fail(id: str, detail: str, fix: str, *, profile: bool = False) -> Check:
    """A failure: with ``profile=True`` the profile cannot run here (exit 3)."""
    return Check(id=id, status="fail", detail=detail, fix=fix, profile=profile)


def unknown(id: str, detail: str, fix: str, *, profile: bool = False) -> Check:
    """Not known: the probe this check needs could not run here (never a failure; exit 5 when
    a verdict rests on it)."""
    return Check(id=id, status="unknown", detail=detail, fix=fix, profile=profile)


class DoctorReport(BaseModel):
    """Everything ``doctor`` saw: the checks, plus the raw facts they were made from.

    ``facts`` holds the gathered values (bytes as ``int``) under stable keys (``memory``,
    ``limits``, ``platform``, ``docker``, ``gpus``, ``probes``), for ``--format json`` readers.
    """

    model_config = ConfigDict(extra="forbid")

    created_at: str = Field(description="ISO 8601 UTC time of the run")
    host_id: str
    profile: str | None = None
    checks: list[Check] = Field(default_factory=list)
    facts: dict[str, Any] = Field(default_factory=dict)
    findings_saved: bool = Field(default=False, description="True when this run's probe answers were saved as "
                                 "findings for plan and up (never when a probe could not run)")

    @property
    def profile_satisfied(self) -> bool:
        """True when no profile check failed (vacuously true without a profile)."""
        return not any(c.profile and c.status == "fail" for c in self.checks)

    def failed_profile_checks(self) -> list[Check]:
        return [c for c in self.checks if c.profile and c.status == "fail"]

    def unknown_checks(self) -> list[Check]:
        """The checks whose probe could not run: with a profile the profile's, else every one."""
        return [c for c in self.checks if c.status == "unknown" and (c.profile or self.profile is None)]

    @property
    def exit_code(self) -> int:
        """With a profile: 3 when a profile check failed, else 5 (inconclusive) when one is
        unknown, else 0. Without one: 5 when a probe could not run, else 0 (the checks ran)."""
        if self.profile is not None and not self.profile_satisfied:
            return 3
        return 5 if self.unknown_checks() else 0

    def check(self, id: str) -> Check | None:
        """The check named ``id``, or ``None``."""
        return next((c for c in self.checks if c.id == id), None)
