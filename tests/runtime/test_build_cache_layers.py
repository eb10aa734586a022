"""What lets image builds share layers through the classic builder's cache (read from the
Dockerfiles, no daemon): a ``RUN`` step is reused when its parent layer, its command and the
value of every build argument declared above it are the same (moby builder/dockerfile
dispatchers.go: ``dispatchRun`` puts ``buildArgs.FilterAllowed`` into the command it probes the
cache with).

- Dockerfile.hicache declares the arguments that differ from one build to the next on the same
  base (the series, the capabilities, a fork's or overlay's folder, the release) only after the
  compiler and install layers, so the image of a fork, of a stale overlay or of another series
  reuses those two layers from CI's main build instead of running apt and pip again.
- The stand-in image (tests/launch/standin/Dockerfile) starts with the same two steps as
  Dockerfile.hicache, so on the base CI builds that image on (``ESCHA_TEST_BASE_IMAGE``) its
  compiler layer comes from that build's cache.
"""

from __future__ import annotations

from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
HICACHE = REPO / "Dockerfile.hicache"
STANDIN = REPO / "tests" / "launch" / "standin" / "Dockerfile"


def steps(path: Path) -> list[str]:
    """The Dockerfile's instructions in order: comments and blank lines dropped, a line ending
    in a backslash joined with the next as the builder joins them."""
    out, cur = [], ""
    for line in path.read_text().splitlines():
        if not cur and (not line.strip() or line.lstrip().startswith("#")):
            continue
        if line.endswith("\\"):
            cur += line[:-1]
            continue
        out.append(cur + line)
        cur = ""
    return out


def after_from_to_first_run(path: Path) -> list[str]:
    s = steps(path)
    first = next(i for i, x in enumerate(s) if x.startswith("FROM "))
    run = next(i for i, x in enumerate(s) if x.startswith("RUN ") and i > first)
    return s[first + 1:run + 1]


def args_declared_before(path: Path, marker: str) -> list[str]:
    """The build arguments declared after FROM and before the first step containing ``marker``."""
    s = steps(path)
    first = next(i for i, x in enumerate(s) if x.startswith("FROM "))
    end = next(i for i, x in enumerate(s) if marker in x)
    return [x.split()[1].split("=")[0] for x in s[first + 1:end] if x.startswith("ARG ")]


def test_hicache_declares_per_build_arguments_after_the_shared_layers():
    assert args_declared_before(HICACHE, "apt-get install") == []
    # the install layer reads only what the wheelhouse and its Python fix
    assert sorted(args_declared_before(HICACHE, "install-escha.sh \"${PYTHON_VERSION}\"")) == [
        "PYTHON_VERSION", "WHEELHOUSE"]
    # and everything that varies per build is still declared before the step that applies the series
    assert {"BASE_IMAGE", "OVERLAY_DIR", "FORK_DIR", "ESCHA_SERIES", "ESCHA_CAPABILITIES", "SGLANG_VERSION"} <= set(
        args_declared_before(HICACHE, "runtime apply"))


def test_standin_starts_with_hicaches_compiler_layer():
    hicache, standin = after_from_to_first_run(HICACHE), after_from_to_first_run(STANDIN)
    assert standin == hicache
    assert [x.split()[0] for x in hicache] == ["ENV", "RUN"] and "libssl-dev" in hicache[-1]
