"""Two first-day slips answered with the fix: an SGLang flag typed where a profile key sets it
(`up --hicache-ratio 2`), and `ask -e HOST:PORT` without a scheme (bad input, as bench and
canary say it, never "nothing answers")."""

from __future__ import annotations

import socket

import pytest

from tests.inproc import run_main


@pytest.mark.parametrize(("argv", "hint"), [
    (("up", "--hicache-ratio", "2"),
     "hint: --hicache-ratio is SGLang's flag of the profile key hicache.hicache_ratio: pass "
     "`--set hicache.hicache_ratio=2`"),
    (("plan", "--hicache-ratio=1.5"),
     "hint: --hicache-ratio is SGLang's flag of the profile key hicache.hicache_ratio: pass "
     "`--set hicache.hicache_ratio=1.5`"),
    (("serve", "--mem-fraction-static", "0.8"),
     "hint: --mem-fraction-static is SGLang's flag of the profile key runtime.mem_fraction_static: pass "
     "`--set runtime.mem_fraction_static=0.8`"),
    (("up", "--no-such-thing"), "hint: see `escha-deploy up --help`"),
    (("up", "--api-key", "x"), "hint: see `escha-deploy up --help`"),  # a secret's flag: never echoed back
])
def test_an_sglang_flag_points_at_its_profile_key(argv, hint):
    r = run_main(*argv)
    assert r.code == 2 and r.out == ""
    lines = r.err.splitlines()
    assert len(lines) == 2 and lines[0].startswith(f"error: No such option: {argv[1].split('=')[0]}")
    assert lines[1] == hint


def test_ask_takes_a_url_and_names_the_one_it_meant():
    with socket.socket() as s:  # a port that answers: the refusal comes before any request
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        port = s.getsockname()[1]
        r = run_main("ask", "-e", f"localhost:{port}", "hi")
    assert r.code == 2 and r.out == ""
    assert r.err.splitlines() == [f"error: --endpoint: expected http://HOST:PORT, got 'localhost:{port}'",
                                  f"hint: with its scheme: `--endpoint http://localhost:{port}`"]


@pytest.mark.parametrize("verb", ["bench", "canary"])
def test_a_closed_port_says_cannot_connect_once(verb):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # closed on leaving: nothing listens there
    r = run_main(verb, "-e", f"http://127.0.0.1:{port}")
    assert r.code == 3
    error = next(ln for ln in r.err.splitlines() if ln.startswith("error: "))
    assert error.startswith(f"error: http://127.0.0.1:{port}: cannot connect (") and error.count("cannot connect") == 1
