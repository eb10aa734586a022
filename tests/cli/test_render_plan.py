"""The plan's rich tables at a terminal of 80 columns: every label of the "Pinned budget" table
stays readable (it lost its whole label column when the long binding explanation sat in a
no-wrap column) and every byte figure stays on one line."""

import json
import re


def test_pinned_budget_table_keeps_its_labels_at_80_columns(cli, monkeypatch):
    args = ("plan", "-p", "rtx5060ti-tp2", "--host-ram", "128GiB", "--wsl2")
    monkeypatch.setenv("COLUMNS", "80")
    out = cli(*args).out
    lines = out.splitlines()
    start = next(i for i, ln in enumerate(lines) if ln.startswith("Pinned budget"))
    end = next(i for i, ln in enumerate(lines) if i > start and ln.startswith("└"))
    table = lines[start:end + 1]
    assert max(len(ln) for ln in table) <= 80
    labels = [ln.split("│")[1].strip() for ln in table if ln.startswith("│")]
    for label in ("- server processes (2 x 3.00 GiB)", "- OS, Docker, escha-deploy", "- page-cache floor",
                  "= pinned budget", "binding: ram", "headroom at the chosen setting"):
        assert label in labels, (label, table)
    d = json.loads(cli(*args, "-f", "json").out)
    b = d["budget"]
    for n in (b["memory_base_bytes"], b["server_processes_bytes"], b["os_reserve_bytes"],
              b["page_cache_floor_bytes"], b["pinned_budget_bytes"]):
        assert re.search(rf"│\s+{n:,} B \(", "\n".join(table)), n  # whole, on one line
