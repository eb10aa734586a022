"""The environment native ``serve`` gives SGLang keeps the user's own ``no_proxy`` entries and
appends the loopback names SGLang's warmup needs (sglang#9814), instead of replacing them.
The child is a STAND-IN for SGLang (it cannot start here) that prints what it inherited."""

from __future__ import annotations

import textwrap

import pytest

from escha_deploy.pipeline.argv import NO_PROXY, merged_no_proxy

from .conftest import run_cli
from .test_native import secret_files, serve_args, serve_env  # noqa: F401 (fixtures)

PRINT_ENV = textwrap.dedent('''\
    #!/usr/bin/env python3
    # STAND-IN for `python -m sglang.launch_server`: prints the proxy bypass it inherited, exits 3.
    import os, sys
    print("child no_proxy=" + str(os.environ.get("no_proxy")), flush=True)
    print("child NO_PROXY=" + str(os.environ.get("NO_PROXY")), flush=True)
    sys.exit(3)
''')


@pytest.mark.parametrize("environ,want", [
    ({}, NO_PROXY),
    ({"no_proxy": "models.corp, 10.0.0.0/8"}, "models.corp,10.0.0.0/8," + NO_PROXY),
    ({"NO_PROXY": "l3.corp,localhost"}, "l3.corp,localhost,127.0.0.1,0.0.0.0,::1"),
    ({"no_proxy": "a.corp", "NO_PROXY": "b.corp,a.corp"}, "a.corp,b.corp," + NO_PROXY),
])
def test_merged_no_proxy_keeps_the_users_entries(environ, want):
    assert merged_no_proxy(environ) == want


def test_native_serve_child_inherits_the_users_no_proxy(tmp_path, secret_files):  # noqa: F811
    child = tmp_path / "print_env.py"
    child.write_text(PRINT_ENV)
    child.chmod(0o755)
    env = serve_env(str(child), no_proxy="models.corp,10.0.0.0/8", NO_PROXY="models.corp,10.0.0.0/8")
    r = run_cli(*serve_args(*secret_files), env=env)
    out = r.stdout + r.stderr
    assert r.returncode == 4, out  # the stand-in exits 3: a failed start
    want = "models.corp,10.0.0.0/8,localhost,127.0.0.1,0.0.0.0,::1"
    assert f"child no_proxy={want}" in out and f"child NO_PROXY={want}" in out
