"""The stand-in's ``/metrics`` against SGLang's own, and the view of SGLang's real exposition.

References (tests/watch/fixtures):
- ``metrics-real/sglang-0.5.19-tp1-h200.txt``: a real SGLang 0.5.19 server, TP 1, on an H200
  (its README says how it was made);
- ``metrics-reference/sglang-VERSION-tp2.txt``: TP 2, built on the CPU from each release's
  collector classes in its wheel by scripts/gen_metrics_reference.py (two scheduler processes
  and the tokenizer's sharing one ``PROMETHEUS_MULTIPROC_DIR``, exported as ``/metrics`` does).

Per metric family the stand-in exports, the reference must have it with the same type and the
same set of label names. The stand-in is tests/bench/standin_sglang.py (no GPU here).
"""

from __future__ import annotations

import os
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest

from bench.standin_sglang import StandinConfig, StandinServer, tokenize
from escha_deploy.bench.metrics import Snapshot
from escha_deploy.watch import reading
from escha_deploy.watch.collect import scrape
from escha_deploy.watch.report import server_section

from script_module import load_script

REPO = Path(__file__).resolve().parents[2]
FIX = Path(__file__).parent / "fixtures"
REAL_TP1 = FIX / "metrics-real" / "sglang-0.5.19-tp1-h200.txt"
REFERENCE = FIX / "metrics-reference"

Families = dict[str, tuple[str, frozenset[str]]]


def families(text: str) -> Families:
    """name -> (type, label names over its samples, without a histogram's ``le``)."""
    from prometheus_client.parser import text_string_to_metric_families

    out: Families = {}
    for fam in text_string_to_metric_families(text):
        labels = frozenset(k for s in fam.samples for k in s.labels) - {"le", "quantile"}
        out[fam.name] = (fam.type, labels)
    return out


def differences(standin: Families, reference: Families) -> list[str]:
    """One line per stand-in family missing from the reference or differing in type or label names."""
    out = []
    for name, (typ, labels) in sorted(standin.items()):
        if name not in reference:
            out.append(f"{name}: not in the reference")
            continue
        rtyp, rlabels = reference[name]
        if typ != rtyp:
            out.append(f"{name}: type {typ}, SGLang's {rtyp}")
        if labels != rlabels:
            out.append(f"{name}: labels {sorted(labels)}, SGLang's {sorted(rlabels)}")
    return out


def standin_text(**kw) -> str:
    """The stand-in's exposition after prompts that fill, evict, back up and load back."""
    cfg = StandinConfig(device_tokens=10, host_tokens=100, prefill_tps=1e9, load_back_tps=1e9, **kw)
    srv = StandinServer(cfg)
    for prompt in ("a b c d e f g h", "z y x w v u t s", "a b c d e f g h i"):
        hit, out = srv.serve(tokenize(prompt), 2)
        srv.observe(len(tokenize(prompt)), len(out), hit, False)
    assert srv.metrics is not None
    return srv.metrics.text().decode()


CASES = [
    (dict(), REAL_TP1),
    (dict(tp_size=2), REFERENCE / "sglang-0.5.19-tp2.txt"),
    (dict(tp_size=2, release="0.5.23"), REFERENCE / "sglang-0.5.23-tp2.txt"),
]


@pytest.mark.parametrize("kw,ref", CASES, ids=["real-0.5.19-tp1", "cpu-0.5.19-tp2", "cpu-0.5.23-tp2"])
def test_the_standin_exports_sglangs_families(kw, ref):
    mine = families(standin_text(**kw))
    theirs = families(ref.read_text(encoding="utf-8"))
    assert len(mine) >= 15, sorted(mine)  # the families status, bench and canary read
    assert differences(mine, theirs) == []


def test_a_changed_label_name_is_caught():
    """The comparison fails when one label name differs (``cache_type`` spelled ``tp_rank``,
    what the stand-in exported before it followed SGLang)."""
    text = standin_text().replace('cache_type="UnifiedRadixCache"', 'tp_rank="0"')
    diff = differences(families(text), families(REAL_TP1.read_text(encoding="utf-8")))
    assert "sglang:load_back_tokens: labels ['pool', 'tp_rank'], SGLang's ['cache_type', 'pool']" in diff
    assert len(diff) == 7  # every radix-cache family the stand-in exports


def _wheels(version: str) -> list[Path]:
    dirs = [REPO / ".cache" / "wheels"]
    if os.environ.get("ESCHA_SGLANG_WHEEL"):
        dirs.insert(0, Path(os.environ["ESCHA_SGLANG_WHEEL"]).parent)
    return [w for d in dirs for w in sorted(d.glob(f"sglang-{version}-*.whl"))]


@pytest.mark.wheel
@pytest.mark.parametrize("version", ["0.5.19", "0.5.23"])
def test_the_cpu_references_are_the_wheels(version):
    wheels = _wheels(version)
    if not wheels:
        pytest.skip(f"no sglang {version} wheel (.ci/test downloads every supported release's)")
    gen = load_script("gen_metrics_reference")
    assert gen.main(["--wheel", str(wheels[0]), "--check"]) == 0


def test_the_cpu_reference_shows_sglangs_sum_over_ranks():
    """0.5.19 at TP 2: one radix-cache series with the two ranks' counts added (each rank
    counted 960 KV tokens); the scheduler gauges of rank 0 only. 0.5.23: one series per rank."""
    s19 = Snapshot.parse(_body(REFERENCE / "sglang-0.5.19-tp2.txt"))
    lb = {k: v for k, v in s19.samples.items() if k[0] == "sglang:load_back_tokens_total"}
    assert lb == {("sglang:load_back_tokens_total", (("cache_type", "UnifiedRadixCache"), ("pool", "kv"))): 1920.0,
                  ("sglang:load_back_tokens_total", (("cache_type", "UnifiedRadixCache"), ("pool", "mamba"))): 2.0}
    assert s19.labels_of("sglang:hicache_host_used_tokens", "tp_rank") == {"0"}
    s23 = Snapshot.parse(_body(REFERENCE / "sglang-0.5.23-tp2.txt"))
    assert s23.labels_of("sglang:load_back_tokens_total", "tp_rank") == {"0", "1"}


def _body(path: Path) -> str:
    return path.read_text(encoding="utf-8")


class _Fixed(ThreadingHTTPServer):
    daemon_threads = True


@pytest.fixture
def serve_text():
    """``serve_text(text)`` -> URL of a loopback server answering ``/metrics`` with ``text``."""
    servers = []

    def start(text: str) -> str:
        body = text.encode()

        class H(BaseHTTPRequestHandler):
            def log_message(self, *a):  # quiet
                pass

            def do_GET(self):
                self.send_response(200 if self.path == "/metrics" else 404)
                self.send_header("Content-Type", "text/plain; version=0.0.4")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

        srv = _Fixed(("127.0.0.1", 0), H)
        threading.Thread(target=srv.serve_forever, daemon=True).start()
        servers.append(srv)
        return f"http://127.0.0.1:{srv.server_address[1]}"

    yield start
    for s in servers:
        s.shutdown()
        s.server_close()


#: Series of the real 0.5.19 server that no catalog (``metrics.json``, from
#: ``observability/metrics_collector.py``) defines: the HTTP middleware's, the process
#: collector's and the routing-key gauge, all made in ``utils/common.py``. Named, not read.
REAL_UNCATALOGUED = ["sglang:http_requests_active", "sglang:http_requests_total", "sglang:http_responses_total",
                     "sglang:process_cpu_seconds_total", "sglang:routing_keys_active"]


def test_the_real_exposition_read_through_the_bounded_reader(serve_text):
    """SGLang 0.5.19's radix-cache counters (no ``tp_rank``) are "all ranks", not rank 0: rank
    0 holds the scheduler's gauges only, and its load-back figures are not given."""
    r = scrape(serve_text(_body(REAL_TP1)))
    assert set(r.ranks) == {"0", reading.ALL_RANKS}
    assert r.ranks["0"].host_used_tokens == 3949 and r.ranks["0"].host_total_tokens == 4097
    every = r.ranks[reading.ALL_RANKS]
    assert every.load_back_tokens == {"kv": 1912, "mamba": 4} and every.evicted_tokens == 6981
    assert every.backup_tokens == {"kv": 5858, "mamba": 25}
    assert r.cached_tokens == {"device": 1920, "host": 1920}
    assert r.unknown_series == REAL_UNCATALOGUED
    view = server_section(reading.server_window(r, None, None), None)
    assert view["ranks"]["0"]["load_back_tokens"] is None and view["ranks"]["0"]["load_back_gb_per_s"] is None
    assert view["ranks"]["all"]["load_back_gb_per_s"] == pytest.approx(5.177344e6 / 0.0011592000126838683 / 1e9)
    assert view["total"]["load_back_gb_per_s_slowest_rank"] is None  # no per-rank rate exported


def test_a_series_no_release_defines_is_named_not_a_crash(serve_text):
    extra = ("# HELP sglang:later_release_thing_total A series of a later release.\n"
             "# TYPE sglang:later_release_thing_total counter\n"
             'sglang:later_release_thing_total{cache_type="UnifiedRadixCache"} 3.0\n'
             "# HELP sglang:later_seconds A later histogram.\n# TYPE sglang:later_seconds histogram\n"
             'sglang:later_seconds_bucket{le="+Inf"} 1.0\nsglang:later_seconds_count 1.0\n'
             "sglang:later_seconds_sum 0.5\n")
    r = scrape(serve_text(_body(REAL_TP1) + extra))
    assert r.unknown_series == sorted([*REAL_UNCATALOGUED, "sglang:later_release_thing_total", "sglang:later_seconds"])
    assert r.ranks[reading.ALL_RANKS].load_back_tokens == {"kv": 1912, "mamba": 4}  # the rest is read


def _view(**kw) -> dict:
    srv = StandinServer(StandinConfig(device_tokens=10, host_tokens=100, prefill_tps=1e9, load_back_tps=1e9, **kw))
    for prompt in ("a b c d e f g h", "z y x w v u t s", "a b c d e f g h i"):
        hit, out = srv.serve(tokenize(prompt), 2)
        srv.observe(len(tokenize(prompt)), len(out), hit, False)
    r = reading.server_reading(Snapshot.parse(srv.metrics.text().decode()))
    return server_section(reading.server_window(r, None, None), None)


def test_tp2_on_0519_shows_no_figure_sglang_did_not_export_per_rank():
    v = _view(tp_size=2)
    assert set(v["ranks"]) == {"0", "all"}
    for k in ("load_back_tokens", "load_back_bytes", "load_back_gb_per_s", "backup_tokens", "evicted_tokens"):
        assert v["ranks"]["0"][k] is None, k
    assert v["ranks"]["all"]["load_back_tokens"]["kv"] == 2 * 8  # both ranks' 8 tokens, SGLang's sum
    assert v["ranks"]["all"]["host_used_tokens"] is None and v["ranks"]["0"]["host_used_tokens"] > 0
    assert v["total"]["load_back_gb_per_s_slowest_rank"] is None


def test_tp2_on_0523_shows_each_ranks_figures():
    v = _view(tp_size=2, release="0.5.23", metrics_all_schedulers=True)
    assert set(v["ranks"]) == {"0", "1"}
    assert all(v["ranks"][r]["load_back_tokens"]["kv"] == 8 and v["ranks"][r]["load_back_gb_per_s"] for r in "01")
    assert v["total"]["load_back_gb_per_s_slowest_rank"] is not None
