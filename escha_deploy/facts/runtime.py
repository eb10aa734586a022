"""The runtime a box runs: its SGLang release, the capabilities its patch series provides and
the server image, each with where it came from. Pure: no I/O.

A facts file carries it as its ``runtime`` section (``factsfile.FactsFile.runtime``); a saved
doctor report gives the image it found on the box's daemon. ``release_claim`` is the
``(version, where)`` pair ``releases.choose_release(image=...)`` takes, and
``capability_names`` the list ``runtime.description.require_capabilities`` takes.
"""

from __future__ import annotations

from typing import Annotated

from pydantic import BaseModel, ConfigDict, Field, StrictStr, StringConstraints, model_validator

from .provenance import Provenance

#: An SGLang release as ``major.minor.patch`` (``0.5.19``).
ReleaseVersion = Annotated[str, StringConstraints(strict=True, pattern=r"^\d{1,4}\.\d{1,4}\.\d{1,4}$")]
#: An image's content digest, ``algorithm:encoded`` as the OCI image spec writes digests
#: (opencontainers/image-spec descriptor.md, "Digests"); Docker's image id is ``sha256:`` and 64
#: hex digits.
ImageDigest = Annotated[str, StringConstraints(strict=True, max_length=256,
                                               pattern=r"^[a-z0-9]+(?:[+._-][a-z0-9]+)*:[a-zA-Z0-9=_-]+$")]
#: A capability name (``capabilities.CAPABILITIES``: ``hicache-host-reserve``, ...).
CapabilityName = Annotated[str, StringConstraints(strict=True, pattern=r"^[a-z0-9][a-z0-9._-]{0,63}$")]


class CapabilityFact(BaseModel):
    """One capability the runtime provides and where that was read."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True, strict=True)
    name: CapabilityName
    source: Provenance


class RuntimeFacts(BaseModel):
    """What runs the server on a box. ``sglang_release``: the SGLang release (``None``: not
    known), with ``sglang_release_source``; ``capabilities``: what its patch series provides
    (``None``: not known; ``[]``: a stock runtime, none); ``image_ref``/``image_id``: the server
    image and its configuration digest (``sha256:...``, the same on every box that built or
    loaded that image)."""

    model_config = ConfigDict(frozen=True, extra="forbid", defer_build=True, strict=True)
    sglang_release: ReleaseVersion | None = None
    sglang_release_source: Provenance | None = None
    capabilities: list[CapabilityFact] | None = None
    image_ref: StrictStr | None = Field(default=None, description="the server image's reference")
    image_id: ImageDigest | None = Field(default=None, description="the image's configuration digest")

    @model_validator(mode="after")
    def _release_has_a_source(self) -> RuntimeFacts:
        if self.sglang_release is not None and self.sglang_release_source is None:
            raise ValueError("sglang_release_source: missing; say where the release was read")
        names = [c.name for c in self.capabilities or ()]
        dup = sorted({n for n in names if names.count(n) > 1})
        if dup:
            raise ValueError(f"capabilities: {dup[0]} is listed twice; one record per capability")
        return self

    def release_claim(self) -> tuple[str | None, str]:
        """``(release, where)`` as ``releases.choose_release(image=...)`` takes it: the release
        (``None``: not known) and its source in words."""
        return self.sglang_release, str(self.sglang_release_source or "the runtime facts")

    def capability_names(self) -> list[str] | None:
        """The capability names (``None``: not known), as ``require_capabilities`` takes them."""
        return None if self.capabilities is None else [c.name for c in self.capabilities]
