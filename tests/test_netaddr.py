"""The one address type (``netaddr``): what parses, what is refused with which reason, and each
joined form read back by the parser that consumes it: SGLang 0.5.19's own
``srt/utils/network.py: NetworkAddress.parse`` (from the real wheel, loaded by file), RFC 3986
as Python's ``urllib.parse`` reads a URL, and SMG 1.13's configuration check (its Rust core)."""

from __future__ import annotations

import dataclasses
import ipaddress
import json
import os
import subprocess
import sys
from pathlib import Path
from urllib.parse import urlsplit

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from escha_deploy.utils.netaddr import host_port, parse_host, url

REPO = Path(__file__).resolve().parents[1]
VENV = Path(os.environ.get("ESCHA_FLAGCAT_VENV") or REPO / ".cache" / "flagcat-venv")


@pytest.mark.parametrize("text,bare,kind", [
    ("10.0.0.1", "10.0.0.1", "ipv4"),
    ("fd00::20", "fd00::20", "ipv6"),
    ("[fd00::20]", "fd00::20", "ipv6"),
    ("FD00:0:0::20", "fd00::20", "ipv6"),
    ("::1", "::1", "ipv6"),
    ("lin-b", "lin-b", "hostname"),
    ("Lin-B.lan.", "lin-b.lan", "hostname"),
])
def test_a_host_parses_to_its_bare_canonical_text(text, bare, kind):
    h = parse_host(text)
    assert (h.text, h.kind) == (bare, kind)


@pytest.mark.parametrize("text,why", [
    ("fd00::20:20000", "write [fd00::20]:20000"),
    ("10.0.0.1:30000", "carries a port"),
    ("[fd00::20]:20000", "carries a port"),
    ("lin-b:30000", "carries a port"),
    ("http://10.0.0.1", "URL"),
    ("0.0.0.0", "unspecified"),
    ("::", "unspecified"),
    ("fe80::1%eth0", "zone id"),
    ("10.0.0.300", "not an IPv4 address"),
    ("1.2.3", "not an IPv4 address"),
    ("[lin-b]", "IPv6 address only"),
    ("-lin", "not a host name"),
    ("a b", "white space"),
    ("", "not empty"),
])
def test_what_is_not_a_host_is_refused_with_the_reason(text, why):
    with pytest.raises(ValueError, match=why.replace("[", r"\[").replace("]", r"\]")):
        parse_host(text)


def test_joined_forms_bracket_ipv6_only():
    assert host_port("fd00::20", 20000) == "[fd00::20]:20000"
    assert host_port("10.0.0.1", 20000) == "10.0.0.1:20000"
    assert url("::1", 30000) == "http://[::1]:30000" and url("lin-b", 1) == "http://lin-b:1"
    assert host_port("0.0.0.0", 1) == "0.0.0.0:1" and host_port("::", 1) == "[::]:1"  # bind addresses render
    assert parse_host("::1").is_loopback and parse_host("localhost").is_loopback
    assert not parse_host("fd00::20").is_loopback


@settings(max_examples=200, deadline=None, derandomize=True, database=None)
@given(ip=st.one_of(st.ip_addresses(v=4), st.ip_addresses(v=6)), port=st.integers(1, 65535))
def test_every_ip_round_trips_through_an_rfc3986_url(ip, port):
    if ip.is_unspecified:
        return
    u = urlsplit(url(str(ip), port))
    assert ipaddress.ip_address(u.hostname) == ip and u.port == port


_SGLANG_PARSE = """
import importlib.util, json, sys
spec = importlib.util.spec_from_file_location("sglang_network", sys.argv[1])
mod = importlib.util.module_from_spec(spec); sys.modules[spec.name] = mod; spec.loader.exec_module(mod)
out = []
for text in json.loads(sys.argv[2]):
    try:
        a = mod.NetworkAddress.parse(text); out.append([a.host, a.port])
    except ValueError as exc:
        out.append(str(exc))
print(json.dumps(out))
"""


@pytest.mark.wheel
@pytest.mark.skipif(not (VENV / "bin" / "python").exists(), reason=f"no flag-catalog venv at {VENV}")
def test_sglangs_own_parser_reads_every_dist_init_addr_we_render():
    """``--dist-init-addr`` as rendered, through SGLang 0.5.19's ``NetworkAddress.parse`` (the
    wheel's file, loaded alone: it needs only psutil and zmq); the bare IPv6 join shows the
    parser is the strict one."""
    found = list((VENV / "lib").glob("python3*/site-packages/sglang/srt/utils/network.py"))
    assert found, f"no sglang/srt/utils/network.py in {VENV}"
    hosts = ["10.0.0.1", "fd00::20", "::1", "lin-b.lan"]
    texts = [host_port(h, 20000) for h in hosts] + ["fd00::20:20000"]
    proc = subprocess.run([str(VENV / "bin" / "python"), "-c", _SGLANG_PARSE, str(found[0]), json.dumps(texts)],
                          capture_output=True, text=True, timeout=120, env={**os.environ, "PYTHONPATH": ""})
    assert proc.returncode == 0, proc.stderr[-2000:]
    got = json.loads(proc.stdout)
    assert got[:-1] == [[h, 20000] for h in hosts]
    assert "Bare IPv6 address without brackets is ambiguous" in got[-1]


def test_smg_accepts_the_worker_urls_we_render():
    """SMG 1.13 checks its configuration in its Rust core at ``start()``, worker URLs before the
    port; port 0 makes every start stop at that check, so nothing listens."""
    smg_args = pytest.importorskip("smg.launch_router")
    from smg.router import Router

    def config_error(worker: str) -> str:
        a = dataclasses.replace(smg_args.parse_router_args(["--worker-urls", worker, "--host", "127.0.0.1"]), port=0)
        with pytest.raises(ValueError) as info:
            Router.from_args(a).start()
        return str(info.value)

    assert "'worker_url'" in config_error("http://fd00::20:30000")  # the check SMG makes first
    for host in ("fd00::20", "::1", "10.0.0.1"):
        err = config_error(url(host, 30000))
        assert "'worker_url'" not in err and "'port'" in err, err


if __name__ == "__main__":  # pragma: no cover
    sys.exit(pytest.main([__file__, "-q"]))
