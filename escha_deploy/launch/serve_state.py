"""Native ``serve``'s state file, so ``status`` finds a server no container names.

``<runtime_dir>/serve-<port>.json`` (``launch.native.runtime_dir``: this user's private tmpfs
folder, beside the port lock), written when ``serve`` starts SGLang and removed when it ends;
one left by a killed ``serve`` (its pid no longer runs) is removed by the next ``status``.
It holds names and paths, never a secret: the API key travels as its file's path.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from escha_deploy.profile.models import NAME_PATTERN

from .planview import PlanView

STATE_SCHEMA_VERSION = 1


class ServeState(BaseModel):
    """One native server: ``pid`` is the ``serve`` process (SGLang runs below it)."""

    model_config = ConfigDict(frozen=True, extra="ignore", allow_inf_nan=False)
    schema_version: int = STATE_SCHEMA_VERSION
    pid: int = Field(strict=True, description="the serve process (one outside 1..launch.native.PID_MAX_LIMIT "
                     "runs nowhere)")
    host: str = Field("127.0.0.1", description="the bind address (0.0.0.0, :: or empty: every interface)")
    port: int = Field(strict=True, ge=1, le=65535)
    profile: str = Field(pattern=NAME_PATTERN, description="a profile name, as a profile's own")
    plan_digest: str = Field("", pattern=r"^[0-9a-f]{0,128}$")
    api_key_file: str | None = Field(None, description="the key's file; the key itself never")
    started_at: float = Field(description="Unix time, seconds")
    plan: PlanView | None = None

    @field_validator("host")
    @classmethod
    def _one_host(cls, v: str) -> str:
        """A bare host (``netaddr.parse_host``): never a URL, a path or a port."""
        from escha_deploy.utils.netaddr import parse_host

        if v in ("", "0.0.0.0", "::"):
            return v
        return parse_host(v, peer=False).text

    @property
    def url(self) -> str:
        """Where to reach it from this host: a wildcard bind is asked on loopback."""
        from escha_deploy.utils.netaddr import url

        h = {"0.0.0.0": "127.0.0.1", "": "127.0.0.1", "::": "::1"}.get(self.host, self.host)
        return url(h, self.port)


def state_path(port: int, folder: Path | None = None) -> Path:
    from escha_deploy.launch.native import runtime_dir

    return (folder or runtime_dir()) / f"serve-{port}.json"


def write_state(state: ServeState, folder: Path | None = None) -> Path:
    """Write (replace by rename) the state file of ``state.port``, mode 0600."""
    from escha_deploy.utils.paths import replace_file

    path = state_path(state.port, folder)
    replace_file(path, (state.model_dump_json(indent=2) + "\n").encode())
    os.chmod(path, 0o600)
    return path


def remove_state(port: int, pid: int, folder: Path | None = None) -> None:
    """Remove the state file of ``port`` if ``pid`` wrote it."""
    path = state_path(port, folder)
    try:
        if json.loads(path.read_text()).get("pid") == pid:
            path.unlink()
    except (OSError, ValueError, AttributeError):
        pass


def _alive(pid: int) -> bool:
    from escha_deploy.launch.native import _pid_alive

    return _pid_alive(pid)  # False for a pid outside 1..PID_MAX_LIMIT


def find_states(profile: str | None = None, folder: Path | None = None) -> tuple[list[ServeState], list[str]]:
    """The live native servers (of ``profile``), and one line per state file removed as stale
    (its pid gone) or skipped as unreadable (named with its path)."""
    from escha_deploy.utils.errors import BadInput
    from escha_deploy.utils.jsonio import loads_json, read_regular
    from escha_deploy.launch.native import runtime_dir
    from escha_deploy.utils.termtext import shown

    d = folder or runtime_dir(make=False)
    found, notes = [], []
    if not d.is_dir():
        return found, notes
    for path in sorted(d.glob("serve-*.json")):
        try:
            if path.is_symlink():
                raise ValueError("a symbolic link")
            state = ServeState.model_validate(loads_json(read_regular(path, "a serve state file", max_bytes=1 << 20),
                                                         path, "a serve state file"))
        except ValidationError as exc:
            e = exc.errors()[0]
            where = ".".join(str(x) for x in e["loc"]) or "the file"
            notes.append(shown(f"{path}: unreadable state file ({where}: {e['msg']}); skipped", 400))
            continue
        except (BadInput, ValueError) as exc:
            notes.append(shown(f"{path}: unreadable state file ({str(exc).splitlines()[0]}); skipped", 400))
            continue
        if not _alive(state.pid):
            path.unlink(missing_ok=True)
            notes.append(f"{path}: removed (serve pid {state.pid} no longer runs)")
            continue
        if profile is None or state.profile == profile:
            found.append(state)
    return found, notes
