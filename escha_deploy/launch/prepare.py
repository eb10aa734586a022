"""What `up`, `up --dry-run` and `serve` share: from a profile reference to a checked plan and
its ``LaunchSpec``, before anything touches the daemon's state.

``prepare`` is gather, plan, build: load the profile, read the host (and, with a docker client,
the image's capabilities), plan, build the launch spec, and refuse (exit 3, nothing created)
an unsafe plan, missing capabilities or an unlaunchable container spec.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from escha_deploy.errors import BadInput, Refused
from escha_deploy.secretargs import redact_argv

from .redact import Redactor

if TYPE_CHECKING:
    from escha_deploy.launch_spec import ContainerSpec, LaunchSpec
    from escha_deploy.planner.result import Plan
    from escha_deploy.profile import Profile

    from .drift import PlannedSizes


def profile_file(ref: str) -> str | None:
    """The host path to mount when ``ref`` names a file rather than a shipped profile."""
    p = Path(ref)
    if p.suffix in (".yaml", ".yml") or os.sep in ref:
        return str(p.resolve()) if p.is_file() else None
    return None


#: A key or token file holds one line; 64 KiB is far more than any key.
MAX_SECRET_FILE = 64 * 1024


def read_secret(path: str, what: str) -> str:
    """The first line of a secret file, stripped. Raises ``BadInput`` naming the file (never
    the value): not a regular file (``/dev/zero`` would be read forever), larger than
    ``MAX_SECRET_FILE`` bytes, not UTF-8, or empty."""
    p = Path(path)
    try:
        if not p.is_file():
            raise OSError
        with open(p, "rb") as fh:
            raw = fh.read(MAX_SECRET_FILE + 1)
        if len(raw) > MAX_SECRET_FILE:
            raise BadInput(f"{what}: {path} is larger than {MAX_SECRET_FILE} bytes; it should hold one key")
        value = raw.decode("utf-8").strip().splitlines()[0].strip()
    except (OSError, IndexError, UnicodeDecodeError):
        raise BadInput(f"{what}: cannot read a value from {path}") from None
    if not value:
        raise BadInput(f"{what}: {path} is empty")
    return value


def image_capabilities(client, image: str, labels: dict[str, str] | None = None) -> list[str] | None:
    """Capabilities an image declares: its ``io.escha.runtime.capabilities`` label, else the
    runtime description file read from the image; None for a stock image. ``labels``: the
    image's labels when the caller already read them (saves an inspect)."""
    from escha_deploy.capabilities import RUNTIME_DESCRIPTION_PATH
    from escha_deploy.runtime.description import RuntimeDescription, capabilities_from_labels

    from . import docker as dk

    if labels is None:
        labels = dk.image_labels(client, image) or {}
    caps = capabilities_from_labels(labels)
    if caps is not None:
        return caps
    raw = dk.read_file_from_image(client, image, RUNTIME_DESCRIPTION_PATH)
    if raw is None:
        return None
    try:
        return list(RuntimeDescription.model_validate(json.loads(raw)).capabilities)
    except ValueError:
        raise BadInput(f"{image}:{RUNTIME_DESCRIPTION_PATH}: not a runtime description") from None


@dataclass
class Prepared:
    """Everything `up` decided before touching the daemon's state.

    ``args``: docker-py ``containers.create`` keyword arguments (``docker.create_args``);
    ``argv``: the SGLang server command line, as ``launch.argv``; ``warnings``: one line each
    (a plan that turned HiCache off, ...), for the caller to report.
    """

    profile: Profile
    plan: Plan
    launch: LaunchSpec
    spec: ContainerSpec
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
            profile: Profile | None = None) -> Prepared:
    """Load, gather, plan and build the spec; refuse (``Refused``, exit 3) on an unsafe plan,
    missing capabilities or an unlaunchable spec. With ``client``, also reads the image's
    capabilities (``need_image``: a missing image is refused)."""
    from escha_deploy.host import gather_plan_inputs
    from escha_deploy.launch_spec import build_launch_spec
    from escha_deploy.planner import plan as make_plan
    from escha_deploy.profile import load_profile
    from escha_deploy.runtime.description import require_capabilities

    from . import docker as dk

    profile = profile or load_profile(profile_ref, overrides)
    host, model_dir = gather_plan_inputs(profile)
    caps: list[str] | None = None
    warnings: list[str] = []
    if client is not None:
        labels = dk.image_labels(client, profile.container.image)
        if labels is None:
            if need_image:
                raise Refused(
                    f"container.image: {profile.container.image} is not present",
                    hint="build it (`escha-deploy up --build`, or `escha-deploy build`)",
                )
        else:
            caps = image_capabilities(client, profile.container.image, labels)
            require_capabilities(caps, profile.runtime.needs, profile.container.image)
    plan = make_plan(profile, host, model_dir=model_dir, capabilities=None if caps is None else frozenset(caps))
    if plan.verdict == "unsafe":
        raise Refused(*[f"plan: {r}" for r in plan.reasons] or ["plan: unsafe"],
                      hint="`escha-deploy plan --profile NAME` shows the budget")
    if plan.verdict == "hicache_off":
        warnings.append("plan: HiCache is off for this host (" + "; ".join(plan.reasons) + ")")
    launch = build_launch_spec(plan, profile, overrides=list(overrides),
                               profile_file=profile_file(profile_ref))
    spec = launch.container
    problems = dk.check_spec(spec)
    if client is not None:  # a real launch: the model folder must exist to be mounted
        for m in spec.mounts:
            if m.target == profile.model.path and not Path(m.source).is_dir():
                problems.append(f"model.host_dir / container.model_dir: {m.source} is not a folder on this host")
    if problems:
        raise Refused(*problems)
    return Prepared(profile, plan, launch, spec, dk.create_args(spec), list(launch.argv), warnings)


def planned_sizes(plan: Plan) -> PlannedSizes:
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
