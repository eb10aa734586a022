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


def test_device_line_names_wsl2_only_on_wsl2(cli):
    """A plain Linux host hides no VRAM: "0.00 GiB hidden by WSL2" said nothing true there."""
    linux = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "24GiB", "--linux")
    assert linux.code == 0
    device = next(ln for ln in linux.out.splitlines() if ln.startswith("device:"))
    assert "WSL2" not in device and device.endswith("SGLang default 0.662) -> fits"), device
    wsl2 = cli("plan", "-p", "rtx5060ti-tp2-fp8", "--host-ram", "24GiB", "--wsl2")
    device = next(ln for ln in wsl2.out.splitlines() if ln.startswith("device:"))
    assert re.search(r"; \d+\.\d\d GiB hidden by WSL2\) -> ", device), device


def test_runtime_check_formula_in_one_unit(cli):
    """The table's formula lines: GiB terms, a GiB result, the GB figure after it in parentheses."""
    out = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2").out
    flat = " ".join(" ".join(c.strip() for c in ln.split("│")) for ln in out.splitlines())
    flat = re.sub(r"\s+", " ", flat)
    assert "(9.00 GiB - 2.00 GiB reserve) / 2 = 3.50 GiB (3.76 GB) per rank" in flat
    assert "page-cache floor = 7.00 GiB (7.52 GB)" in flat
    assert not re.search(r"GiB[^=;]* = \d+\.\d\d GB", flat), flat
