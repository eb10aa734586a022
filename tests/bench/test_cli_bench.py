"""``escha-deploy bench`` as a user runs it: table and JSON on stdout, progress and errors on
stderr, the chart, and the exit codes (0 measured, 2 bad input, 3 unreachable, 4 failed)."""

from __future__ import annotations

import json
import socket
import sys

import pytest

SMALL = ["--prefixes", "3", "--prefix-tokens", "1000", "--prefill-tokens", "2000",
         "--decode-tokens", "20", "--answer-tokens", "4"]
POOLS = dict(device_tokens=1500, host_tokens=20_000)


@pytest.mark.parametrize("on_first", [False, True])
def test_compare_table_has_off_and_on_side_by_side(cli, standin, on_first):
    off, on = standin(hicache=False, **POOLS), standin(hicache=True, **POOLS)
    first, second = (on, off) if on_first else (off, on)
    res = cli("bench", "-e", first.url, "--compare", second.url, *SMALL, "--box", "stand-in")
    assert res.code == 0, res.err
    header = next(line for line in res.out.splitlines() if "off" in line and "on" in line)
    assert header.index("off") < header.index(" on")
    for row in ("cold prefill", "decode, bs1", "3 x 1K distinct prefixes, concurrent, first pass",
                "second pass", "cached share", "host-tier tokens", "box: stand-in"):
        assert row in res.out
    assert "(usage)" in res.out
    assert "bench: second pass" in res.err  # progress on stderr, not stdout
    assert "bench:" not in res.out


def test_json_is_the_report_model(cli, standin):
    res = cli("bench", "-e", standin(**POOLS).url, *SMALL, "--format", "json")
    assert res.code == 0, res.err
    data = json.loads(res.out)
    assert data["schema_version"] == 1 and data["mode"] == "single"
    run = data["runs"][0]
    assert run["facts"]["hicache"] is True and run["token_counts"] == "server tokenizer"
    assert run["second_pass"]["cached"]["source"] == "usage.prompt_tokens_details.cached_tokens"


def test_chart_is_a_png(cli, standin, tmp_path):
    pytest.importorskip("matplotlib")  # .ci/test installs the chart extra, so this runs in CI
    out = tmp_path / "bench.png"
    res = cli("bench", "-e", standin(**POOLS).url, *SMALL, "--chart", str(out))
    assert res.code == 0, res.err
    assert out.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"


def test_chart_without_matplotlib_says_how_to_install(cli, standin, tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # import now raises ImportError
    srv = standin(**POOLS)
    res = cli("bench", "-e", srv.url, *SMALL, "--chart", str(tmp_path / "b.png"))
    assert res.code == 2
    assert "pip install '.[chart]' from the escha-deploy checkout" in res.err
    assert srv.state.paths == []  # refused before any request


@pytest.mark.parametrize(
    "args, needle",
    [
        ([], "--endpoint: required"),
        (["--hicache-ab"], "--hicache-ab needs --profile"),
        (["-e", "http://127.0.0.1:1", "--hicache-ab", "--profile", "p"], "drop --endpoint"),
        (["-e", "127.0.0.1:30000"], "expected http://HOST:PORT"),
        (["-e", "http://127.0.0.1:1", "--prefix-tokens", "lots"], "--prefix-tokens"),
        (["-e", "http://127.0.0.1:1", "--chart", "out.svg"], "expected a .png path"),
        (["-e", "http://127.0.0.1:1", "--prefix-tokens", "5"],
         "--prefix-tokens: input should be greater than or equal to 16"),
    ],
)
def test_bad_input_exits_2(cli, args, needle):
    res = cli("bench", *args)
    assert res.code == 2
    assert needle in res.err


def test_unreachable_endpoint_exits_3():
    with socket.socket() as s:  # a port nothing listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    from escha_deploy.cli.main import main

    with pytest.raises(SystemExit) as exc:
        main(["bench", "-e", f"http://127.0.0.1:{port}"])
    assert exc.value.code == 3


def test_server_not_ready_exits_3(cli, standin):
    res = cli("bench", "-e", standin(ready=False).url, *SMALL)
    assert res.code == 3 and "not ready" in res.err


def test_failed_request_exits_4(cli, standin):
    res = cli("bench", "-e", standin(max_req_input_len=500).url, *SMALL)
    assert res.code == 4
    assert "/v1/completions answered 400" in res.err


def test_canary_bad_input_exits_2(cli):
    res = cli("canary", "-e", "http://127.0.0.1:1", "--prompt-tokens", "10")
    assert res.code == 2 and "--prompt-tokens" in res.err


@pytest.mark.parametrize("rel, reason", [
    ("no/such/b.png", "No such file or directory"),
    ("file/b.png", "Not a directory"),
    ("dir.png", "Is a directory"),
])
def test_a_chart_that_cannot_be_written_is_refused_before_the_run(cli, standin, tmp_path, rel, reason):
    """Before this check the chart was written after the whole run, and a missing folder lost it
    with a traceback; now: one line naming --chart and the path, exit 2, no request sent."""
    (tmp_path / "file").write_text("keep\n")
    (tmp_path / "dir.png").mkdir()
    srv = standin(**POOLS)
    chart = tmp_path / rel
    res = cli("bench", "-e", srv.url, *SMALL, "--chart", str(chart))
    assert res.code == 2 and "Traceback" not in res.err
    assert res.err.splitlines() == [f"error: --chart {chart}: cannot write: {reason}"]
    assert srv.state.paths == []  # refused before any request
    assert sorted(p.name for p in tmp_path.iterdir() if p.name != "xdg-cache") == ["dir.png", "file"]


def test_a_warm_cache_pass_is_marked_in_the_table_and_the_chart(cli, standin, tmp_path, monkeypatch):
    """The same --seed twice on one STAND-IN server: the second run's cold prefill and first pass
    hit the cache. The warning was on stderr only; the table's cells, its caption and the
    chart's bars now say WARM CACHE too. A first run on a fresh server is not marked."""
    mpl = pytest.importorskip("matplotlib")
    mpl.use("Agg")
    import matplotlib.pyplot as plt

    srv = standin(device_tokens=50_000, host_tokens=50_000)
    first = cli("bench", "-e", srv.url, *SMALL)
    assert first.code == 0 and "WARM CACHE" not in first.out, first.out
    figures = []
    real_close = plt.close
    monkeypatch.setattr(plt, "close", lambda fig=None: figures.append(fig))
    res = cli("bench", "-e", srv.url, *SMALL, "--chart", str(tmp_path / "b.png"))
    monkeypatch.setattr(plt, "close", real_close)
    assert res.code == 0, res.err
    assert "already held" in res.err  # the warning stays
    prefill = next(line for line in res.out.splitlines() if "cold prefill" in line)
    assert "WARM CACHE" in prefill and "tokens cached" in prefill, res.out
    assert "the server already held these prompts" in " ".join(res.out.split())
    (fig,) = figures
    texts = [t.get_text() for ax in fig.axes for t in ax.texts]
    assert any("WARM CACHE" in t for t in texts), texts
    assert any(p.get_hatch() == "//" for p in fig.axes[0].patches)
    real_close(fig)
