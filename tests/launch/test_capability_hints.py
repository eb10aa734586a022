"""How a runtime that lacks a capability is told to get it (``runtime.description.capability_hint``):
our series' capabilities by an image built with it (``build --hicache``) or natively by
``runtime apply``; a fork's (``int2-kv``, ``w2-weights``) only with the fork's commits imported
(``runtime import``) and built in (``build --fork-dir``) or applied (``runtime apply --fork-dir``),
as docs/runtime.md ("Bring your fork") says. Through the real CLI: native ``serve --print``, in
a container, ``up --dry-run`` on CI's HiCache image (our series, no fork) and ``compose``."""

from __future__ import annotations

import json
import os

import pytest

from .conftest import run_cli

IMPORT = "`escha-deploy runtime import DIR`"
FORK_BUILD = "`escha-deploy build --hicache --fork-dir runtime_fork`"
FORK_APPLY = "`escha-deploy runtime apply --fork-dir runtime_fork`"
#: The hint every missing capability got, which builds an image that lacks the fork's.
SERIES_ONLY = "build the image with our series: `escha-deploy build --hicache`"


def _hint(err: str) -> str:
    return next(x for x in err.splitlines() if x.startswith("hint: "))


def test_native_serve_print_names_the_fork_route_beside_the_image_route(cli, monkeypatch):
    monkeypatch.delenv("ESCHA_SERVE_MODE", raising=False)
    monkeypatch.setenv("ESCHA_RUNTIME_DESCRIPTION", "/nonexistent/runtime.json")  # a stock runtime here
    r = cli("serve", "--print", "-p", "rtx5060ti-tp2")
    assert r.code == 3
    assert "runtime lacks capability 'int2-kv'" in r.err
    hint = _hint(r.err)
    assert hint.startswith("hint: int2-kv, w2-weights are fork capabilities, which escha-deploy's patch series "
                           "does not provide (stock SGLang 0.5.19 has none)"), hint
    assert hint.index(IMPORT) < hint.index(FORK_BUILD + " for an image, or natively") < hint.index(FORK_APPLY)
    assert '"Bring your fork"' in hint


def test_native_serve_print_of_our_series_names_runtime_apply(cli, monkeypatch):
    monkeypatch.delenv("ESCHA_SERVE_MODE", raising=False)
    monkeypatch.setenv("ESCHA_RUNTIME_DESCRIPTION", "/nonexistent/runtime.json")
    r = cli("serve", "--print", "-p", "rtx5060ti-tp2-fp8")
    assert r.code == 3
    assert _hint(r.err) == ("hint: build the image with escha-deploy's patch series: `escha-deploy build --hicache` "
                            "for an image, or natively patch the installed SGLang with it: `escha-deploy runtime "
                            "apply` (docs/runtime.md)")


def test_serve_in_a_container_names_the_image_route_only(cli, monkeypatch):
    monkeypatch.setenv("ESCHA_SERVE_MODE", "container")
    monkeypatch.setenv("ESCHA_RUNTIME_DESCRIPTION", "/nonexistent/runtime.json")
    hint = _hint(cli("serve", "--print", "-p", "rtx5060ti-tp2").err)
    assert IMPORT in hint and FORK_BUILD in hint and "runtime apply" not in hint and "natively" not in hint


def test_compose_of_a_profile_that_needs_a_fork_says_so(cli):
    r = cli("compose", "-p", "rtx5060ti-tp2")
    assert r.code == 0, r.err
    assert "image: escha-sglang:0.5.19-hicache" in r.out
    lines = [x for x in r.err.splitlines() if "fork" in x]
    assert lines == ["compose: warning: rtx5060ti-tp2 needs int2-kv, w2-weights, which escha-deploy's patch series "
                     "does not provide: escha-sglang:0.5.19-hicache has them only when built with the fork's commits "
                     f"({IMPORT} into runtime_fork/, which Dockerfile.hicache copies; docs/runtime.md, \"Bring your "
                     "fork\"), else its serve refuses them"], r.err
    assert "fork" not in cli("compose", "-p", "rtx5060ti-tp2-fp8").err  # our series only: nothing to say


@pytest.mark.docker
def test_up_dry_run_on_an_image_of_our_series_names_the_fork_route(docker_client, tmp_path):
    """CI's HiCache image is built with our series and no fork: exactly the image that lacks
    int2-kv, so `escha-deploy build --hicache` alone is not the fix."""
    image = os.environ.get("ESCHA_TEST_HICACHE_IMAGE") or pytest.skip("ESCHA_TEST_HICACHE_IMAGE is not set")
    env = {**os.environ, "XDG_CACHE_HOME": str(tmp_path / "xdg")}
    r = run_cli("up", "-p", "rtx5060ti-tp2", "--set", f"container.image={image}", "--dry-run", env=env)
    assert r.returncode == 3, r.stderr
    assert f"{image}: runtime lacks capability 'int2-kv'" in r.stderr
    hint = _hint(r.stderr)
    assert SERIES_ONLY not in hint and IMPORT in hint and FORK_BUILD in hint and "natively" not in hint
    j = json.loads(run_cli("up", "-p", "rtx5060ti-tp2", "--set", f"container.image={image}", "--dry-run",
                           "--format", "json", env=env).stdout)
    assert j["missing_capabilities"] == ["int2-kv", "w2-weights"]
