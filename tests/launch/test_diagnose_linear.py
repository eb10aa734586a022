"""`diagnose` is linear in the log whatever its lines hold: each pattern sees at most a bounded
window of a line, a 2 MB single-line log costs under three times a 1 MB one, and a large log,
random bytes and a file that grows while read end with a bounded answer.

Sizes are parameters for the CI budget: ``ESCHA_TEST_DIAGNOSE_LOG_MB`` (default 200) is the size
of the large log. No test asserts a wall-clock bound; the ratio test compares CPU times of the
same code on two sizes (the best of several runs, so another process on the machine moves both).
"""

from __future__ import annotations

import os
import random
import re
import resource
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from escha_deploy.launch import diagnose as dg
from escha_deploy.launch.diagnose import (SCAN_HEAD, SCAN_TAIL, SHOW_CHARS, SIGNATURES, diagnose, needles,
                                          scan_windows)
from escha_deploy.utils.redact import Redactor

LOG_MB = int(os.environ.get("ESCHA_TEST_DIAGNOSE_LOG_MB", "200"))
MEMORY_LIMIT = 1 << 30
PATTERNS = sorted({s.pattern for s in SIGNATURES if s.pattern})

#: Lines built to make a backtracking pattern slow: no blank at all (every ``(\S+) `` start
#: position scans to the end), and the watchdog row's literal after long runs of non-blanks.
BAIT = {
    "no-blank": lambda n: "x" * n,
    "watchdog-bait": lambda n: ("a" * 997 + " watchdog timeout (self.watchdog_timeout=") * (n // 1037),
    "model-file-bait": lambda n: ("m" * 990 + " does not appear to have a file named ") * (n // 1027),
    "shm-bait": lambda n: "/dev/shm/nccl-" + "y" * n,
    "server-args-bait": lambda n: "server_args=" * (n // 12),
}


def _cli_pipeline(text: str):
    """What `escha-deploy diagnose` does with a log's text: split, redact each line, diagnose."""
    redact = Redactor()
    return diagnose([redact(line) for line in text.splitlines()])


class _Recording:
    """A compiled pattern that records the length of every string it is asked to search."""

    def __init__(self, rx: re.Pattern[str], seen: list[int]) -> None:
        self._rx, self._seen = rx, seen

    def search(self, s: str, *args):
        self._seen.append(len(s))
        return self._rx.search(s, *args)


def test_each_pattern_sees_at_most_one_bounded_window(monkeypatch):
    seen: list[int] = []
    monkeypatch.setattr(dg, "_COMPILED", {p: (_Recording(re.compile(p), seen), needles(p)) for p in PATTERNS})
    long_lines = [make(1_000_000) for make in BAIT.values()]
    tail_cause = "z" * 500_000 + " torch.OutOfMemoryError: CUDA out of memory. Tried to allocate 2.00 GiB"
    middle_cause = "z" * 500_000 + " Capture cuda graph failed: x " + "z" * 500_000
    d = diagnose([*long_lines, tail_cause, middle_cause])
    assert seen and max(seen) <= SCAN_HEAD + SCAN_TAIL
    windows = sum(len(w) for ln in [*long_lines, tail_cause, middle_cause] for w in scan_windows(ln))
    assert sum(seen) <= len(PATTERNS) * windows  # no window is searched twice by one pattern
    ids = {m.id for m in d.matches}
    assert "cuda-out-of-memory" in ids  # the end of a long line is seen
    assert "cuda-graph-capture" not in ids  # its middle is not: the bound, stated
    assert "sglang-watchdog-timeout" in ids  # the bait matches, cheaply
    assert "model-file-missing" not in ids  # its bait lacks the rest of the message
    for m in d.matches:  # what is kept to print is cut too
        assert all(len(x) <= SHOW_CHARS + 40 for x in [m.line or "", *m.evidence]), m.id
    assert all(len(x) <= SHOW_CHARS + 40 for x in d.tail)
    assert d.tail[0].endswith(f" ... ({1_000_000 - SHOW_CHARS:,} more characters)")


@pytest.mark.parametrize("n", [0, 1, SCAN_HEAD + SCAN_TAIL, SCAN_HEAD + SCAN_TAIL + 1, 10**6])
def test_scan_windows_bound_every_line(n):
    line = "".join(chr(33 + i % 90) for i in range(n))
    ws = scan_windows(line)
    assert sum(map(len, ws)) == min(n, SCAN_HEAD + SCAN_TAIL)
    assert ws[0] == line[:SCAN_HEAD + SCAN_TAIL] if len(ws) == 1 else ws == (line[:SCAN_HEAD], line[-SCAN_TAIL:])


def _best_cpu(fn, arg, runs: int = 5) -> float:
    best = float("inf")
    for _ in range(runs):
        t0 = time.process_time()
        fn(arg)
        best = min(best, time.process_time() - t0)
    return best


@pytest.mark.parametrize("kind", sorted(BAIT))
def test_a_2mb_line_costs_under_three_times_a_1mb_line(kind):
    """Linear, not quadratic: doubling a single-line log at most doubles the work (3 leaves room
    for noise; a quadratic matcher gives 4). CPU time, best of five runs each."""
    one, two = BAIT[kind](1_000_000), BAIT[kind](2_000_000)
    _cli_pipeline(one)  # warm: compiled patterns, imports
    t1, t2 = _best_cpu(_cli_pipeline, one), _best_cpu(_cli_pipeline, two)
    assert t2 < 3 * max(t1, 1e-3), (kind, t1, t2)


@settings(max_examples=25, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_windowed_search_finds_what_the_pattern_finds(data):
    """For lines within the window (any row, rows added later included), the literal prefilter
    and the one-pass search agree with a plain search of the pattern; the literal is in every
    match."""
    pattern = data.draw(st.sampled_from(PATTERNS))
    line = data.draw(st.from_regex(pattern).filter(lambda s: len(s) <= SCAN_HEAD))
    rx = re.compile(pattern)
    m = rx.search(line)
    assert m is not None
    lits = needles(pattern)
    assert lits is None or any(lit in line for lit in lits), (pattern, line, lits)
    noise = data.draw(st.lists(st.text(max_size=60), max_size=4))
    lines = [*noise, line]
    want = next(i for i, ln in enumerate(lines) if any(rx.search(w) for w in scan_windows(ln)))
    hit = dg._Windows(lines).first(pattern)
    assert hit is not None and hit[0] == want, (pattern, lines)


def _limit() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def _diagnose_cli(path: Path, timeout: float = 120) -> subprocess.CompletedProcess:
    """The real entry point in a subprocess under a 1 GiB address-space limit (the corpus's)."""
    return subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", "diagnose", str(path)],
                          capture_output=True, text=True, timeout=timeout, preexec_fn=_limit,
                          env={**os.environ, "COLUMNS": "200", "NO_COLOR": "1"})


def _bounded_answer(r: subprocess.CompletedProcess) -> None:
    assert "Traceback" not in r.stdout + r.stderr, r.stderr[-2000:]
    assert len(r.stdout) < 20_000 and len(r.stderr) < 2_000
    assert all(len(ln) <= SHOW_CHARS + 60 for ln in r.stdout.splitlines())


def test_a_large_log_reads_its_end_and_names_the_cause(tmp_path):
    """A LOG_MB log of SGLang-style lines, with 1 MB lines without a blank in it and an OOM near
    its end: only the last 64 MiB are read (the cause is in the last lines), under 1 GiB."""
    from escha_deploy.cli.diagnose import MAX_LOG_BYTES

    log = tmp_path / "server.log"
    block = "".join(f"[2026-12-01 10:00:{i % 60:02d} TP{i % 2}] Decode batch. #running-req: {i}, "
                    f"#token: {i * 7}, token usage: 0.{i % 100:02d}, gen throughput (token/s): 41.{i}\n"
                    for i in range(2000))
    early = "[2026-12-01 09:00:00 TP0] Capture cuda graph failed: an early fault that is cut off\n"
    with open(log, "w") as fh:
        fh.write(early)
        written = len(early)
        while written < LOG_MB * 2**20 - 4 * 2**20:
            fh.write(block)
            written += len(block)
            if written % (16 * 2**20) < len(block):
                fh.write("q" * 2**20 + "\n")
        fh.write("[2026-12-01 10:59:00 TP1] torch.OutOfMemoryError: CUDA out of memory. Tried to allocate "
                 "2.00 GiB. GPU 1 has a total capacity of 15.48 GiB\n")
        fh.write(block)
    r = _diagnose_cli(log)
    _bounded_answer(r)
    assert r.returncode == 0 and "[cuda-out-of-memory]" in r.stdout, r.stdout[-2000:]
    assert ("[cuda-graph-capture]" in r.stdout) == (log.stat().st_size <= MAX_LOG_BYTES)


def test_random_bytes_end_with_a_bounded_answer(tmp_path):
    log = tmp_path / "random.bin"
    log.write_bytes(random.Random(28).randbytes(4 * 2**20))
    r = _diagnose_cli(log)
    _bounded_answer(r)
    assert r.returncode in (0, 5)


def test_a_file_that_grows_after_it_is_opened_is_read_to_the_end_it_had(tmp_path):
    """A server still writing its log: diagnose reads the file to the size it had when the read
    began and does not follow what is appended, so a writer faster than the reader cannot keep
    it reading. Here every read of the file appends a line to it (up to 1000)."""
    from escha_deploy.cli.diagnose import read_end

    log = tmp_path / "growing.log"
    log.write_text("first\n" * 300_000)  # 1.8 MB: two 1 MiB reads

    class Racing:
        """The log's reader, with a writer that appends a line on each read."""

        def __init__(self, fh, writer):
            self.fh, self.writer, self.reads = fh, writer, 0

        def fileno(self):
            return self.fh.fileno()

        def seek(self, *a):
            return self.fh.seek(*a)

        def read(self, n=-1):
            if self.reads < 1000:
                self.reads += 1
                self.writer.write("appended while reading\n")
                self.writer.flush()
            return self.fh.read(n)

    with open(log, "rb") as fh, open(log, "a") as writer:
        assert read_end(Racing(fh, writer)) == "first\n" * 300_000
    with open(log, "rb") as fh:
        assert read_end(fh, limit=23) == "appended while reading\n"  # the end of a long file


def test_a_file_that_grows_while_read_ends_with_a_bounded_answer(tmp_path):
    """The real entry point on a log that another thread keeps appending to while it runs."""
    log = tmp_path / "growing.log"
    line = "[2026-12-01 10:00:00 TP0] Decode batch. #running-req: 1, #token: 9\n" * 1000
    log.write_text(line * 50)
    stop = threading.Event()
    cap = 256 * 2**20

    def grow():
        with open(log, "a") as fh:
            while not stop.is_set() and fh.tell() < cap:
                fh.write(line)
                fh.flush()
                time.sleep(0.001)

    t = threading.Thread(target=grow, daemon=True)
    t.start()
    try:
        r = _diagnose_cli(log)
    finally:
        stop.set()
        t.join()
    _bounded_answer(r)
    assert r.returncode == 5, r.stdout[-500:]
