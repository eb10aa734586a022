"""Where a fact came from: one type for every value the plan reads about the machine and the
runtime. Pure: no I/O.

``Provenance`` names the kind of source and the place (a file, a file's key, a flag, a
command); ``FactSource`` is one fact the plan used, its value as text and where it came from
(``up --dry-run`` shows them, the launch spec carries them; never digested).
"""

from __future__ import annotations

from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, StrictStr

#: The kinds of source a fact can have:
#:
#: - ``proc``: a /proc file of this machine (``/proc/meminfo``, ``/proc/version``);
#: - ``cgroup``: this process's cgroup files (``memory.max``, ``memory.limit_in_bytes``);
#: - ``nvml``: NVML's answers on this machine (nvidia-ml-py);
#: - ``facts_file``: a facts file or a saved doctor report (``--facts``, a fleet box's ``facts``),
#:   ``where`` naming the file and key;
#: - ``findings``: doctor's saved findings for this host;
#: - ``measurement``: measured by escha-deploy on this box (``bench``'s last prefill, a probe);
#: - ``runtime_description``: an image's or host's ``/etc/escha/runtime.json``;
#: - ``image_labels``: an image's OCI labels (``io.escha.*``);
#: - ``command_line``: a flag (``--host-ram``, ``--wsl2``, ``--sglang-version``);
#: - ``fleet_file``: a fleet file's line describing a box (its ``host_ram``);
#: - ``profile``: a profile key (``runtime.sglang_version``, ``model.architecture``);
#: - ``default``: escha-deploy's or the profile's default;
#: - ``unmeasured``: not known; ``where`` says what measures it.
ProvenanceKind = Literal["proc", "cgroup", "nvml", "facts_file", "findings", "measurement", "runtime_description",
                         "image_labels", "command_line", "fleet_file", "profile", "default", "unmeasured"]


class Provenance(BaseModel):
    """Where one value came from: ``kind`` (``ProvenanceKind``) and ``where``, the place in
    words (``/proc/meminfo``, ``box.json host.mem_total_bytes``, ``--sglang-version``,
    ``the image escha-sglang:0.5.19-hicache``; empty when the kind says it all)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True, strict=True)
    kind: ProvenanceKind
    where: StrictStr = ""

    def __str__(self) -> str:
        return self.where or self.kind.replace("_", " ")


class FactSource(BaseModel):
    """Where one fact the plan used came from: ``measured now (/proc/meminfo)``, ``facts file
    PATH``, ``saved doctor findings (2.5 h old)``, ``profile``, ``default``, or ``unmeasured``
    with the command that measures it. ``kind``: the kind of source (``ProvenanceKind``), when
    the gatherer names it (left out of the JSON when not). Shown by ``up --dry-run``; never
    digested."""

    model_config = ConfigDict(frozen=True, extra="forbid", strict=True)
    fact: str
    value: str
    source: str
    kind: ProvenanceKind | None = Field(default=None, exclude_if=lambda v: v is None)
