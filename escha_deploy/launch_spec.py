"""The launch spec: everything needed to start the server, derived from a ``Plan``.

One ``LaunchSpec`` feeds ``up`` (docker-py), ``up --dry-run``, ``serve`` (native child process)
and the rendered ``compose.yaml``, so what a user previews is what runs (style-anchors rule 15).
This module is pure: no docker, no subprocess, no environment reads. ``flags.py`` is the only
module that spells SGLang flag names; ``build_launch_spec`` asks it for the argv.

Secrets never appear in ``argv``, ``env`` or ``labels``: they travel as names in
``secret_env`` (values come from an env file or a read-only mounted file at run time).
"""

from __future__ import annotations

from pydantic import BaseModel, ConfigDict, Field


class Mount(BaseModel):
    model_config = ConfigDict(frozen=True, extra="forbid")
    source: str = Field(description="host path (bind) or volume name")
    target: str = Field(description="path inside the container")
    read_only: bool = False
    kind: str = Field(default="bind", description="bind or volume")


class ContainerSpec(BaseModel):
    """Docker-side settings (field names follow docker-py's ``containers.create`` where they can)."""

    model_config = ConfigDict(frozen=True, extra="forbid")
    image: str
    name: str
    gpus: str | list[str] = Field(
        default="all", description="'all', or device ids on Linux (WSL2 supports only 'all')"
    )
    ipc_mode: str | None = "host"
    shm_size_bytes: int | None = None
    ulimits: dict[str, tuple[int, int]] = Field(
        default_factory=lambda: {"memlock": (-1, -1), "stack": (67108864, 67108864)},
        description="soft/hard; memlock -1 and stack 64 MiB as SGLang's own compose file",
    )
    port_host_ip: str = "127.0.0.1"
    port_host: int = 30000
    port_container: int = 30000
    mounts: list[Mount] = Field(default_factory=list)
    labels: dict[str, str] = Field(default_factory=dict)
    init: bool = True
    security_opt: list[str] = Field(default_factory=lambda: ["no-new-privileges"])
    cap_drop: list[str] = Field(default_factory=lambda: ["ALL"])
    cap_add: list[str] = Field(default_factory=list)
    stop_timeout_s: int = 60
    restart_after_ready: dict[str, int | str] = Field(
        default_factory=lambda: {"Name": "on-failure", "MaximumRetryCount": 3}
    )
    entrypoint: list[str] = Field(default_factory=lambda: ["escha-deploy", "serve"])
    command: list[str] = Field(default_factory=list)


class LaunchSpec(BaseModel):
    """What to run: the SGLang argv and environment, plus the container settings.

    ``argv`` is the full server command (``python -m sglang.launch_server ...``) as a list;
    ``env`` the variables to set (no secrets); ``secret_env`` the names of secret variables
    (``SGLANG_API_KEY``-style) whose values are supplied at run time and redacted in output.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")
    profile: str
    plan_digest: str = Field(description="sha256 of the plan's JSON, for the container label")
    argv: list[str]
    env: dict[str, str] = Field(default_factory=dict)
    secret_env: list[str] = Field(default_factory=list)
    container: ContainerSpec
    hicache_enabled: bool = True
