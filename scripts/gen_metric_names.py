#!/usr/bin/env python3
"""Catalog the ``sglang:`` metric names of an SGLang release into its data folder
(``escha_deploy/catalog/releases/VERSION/metrics.json``), read from the wheel's
``sglang/srt/observability/metrics_collector.py`` with ``ast`` (nothing is imported).

Per metric: its type (the ``prometheus_client`` class it is made with), the collector class
that makes it (``SchedulerMetricsCollector`` and ``RadixCacheMetricsCollector`` series carry
``tp_rank``; ``TokenizerMetricsCollector`` ones do not) and the labels it adds to the
collector's common ones (``list(labels.keys()) + ["cache_source"]`` -> ``["cache_source"]``).

    python scripts/gen_metric_names.py --wheel sglang-0.5.19-...whl          # write
    python scripts/gen_metric_names.py --wheel sglang-0.5.19-...whl --check  # exit 1 if stale
"""

from __future__ import annotations

import argparse
import ast
import json
import os
import sys
import zipfile
from pathlib import Path

SOURCE = "sglang/srt/observability/metrics_collector.py"
REPO = Path(__file__).resolve().parent.parent


def extract(text: str) -> dict[str, dict]:
    """``name -> {"type", "collector", "extra_labels"}`` for every ``name="sglang:..."`` call."""
    out: dict[str, dict] = {}
    tree = ast.parse(text)
    for cls in (n for n in ast.walk(tree) if isinstance(n, ast.ClassDef)):
        for node in ast.walk(cls):
            if not isinstance(node, ast.Call):
                continue
            kws = {kw.arg: kw.value for kw in node.keywords}
            name = kws.get("name")
            if not (isinstance(name, ast.Constant) and str(name.value).startswith("sglang:")):
                continue
            labels = kws.get("labelnames")
            extra = ([c.value for c in ast.walk(labels) if isinstance(c, ast.Constant) and isinstance(c.value, str)]
                     if labels is not None else [])
            out.setdefault(name.value, {"type": ast.unparse(node.func), "collector": cls.name,
                                        "extra_labels": extra})
    return dict(sorted(out.items()))


def wheel_version(wheel: Path) -> str:
    return wheel.name.split("-")[1]


def catalog(wheel: Path) -> dict:
    with zipfile.ZipFile(wheel) as z:
        text = z.read(SOURCE).decode()
    return {"release": wheel_version(wheel), "source": SOURCE.removeprefix("sglang/"),
            "generated_by": "scripts/gen_metric_names.py", "metrics": extract(text)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--wheel", type=Path, default=os.environ.get("ESCHA_SGLANG_WHEEL"),
                    help="the release's wheel (default: $ESCHA_SGLANG_WHEEL)")
    ap.add_argument("--check", action="store_true", help="exit 1 if the committed file differs")
    ap.add_argument("--tree", type=Path, help="an installed sglang package folder instead of a wheel (an SGLang "
                    "built from a commit: `escha-deploy runtime lock`); needs --out and --version")
    ap.add_argument("--version", help="--tree: its SGLang version")
    ap.add_argument("--out", type=Path, help="--tree: where to write the catalog")
    a = ap.parse_args(argv)
    if a.tree is not None:
        if a.out is None or a.version is None:
            ap.error("--tree needs --out FILE and --version VERSION")
        text = (a.tree / SOURCE.removeprefix("sglang/")).read_text(encoding="utf-8")
        data = {"release": a.version, "source": SOURCE.removeprefix("sglang/"),
                "generated_by": "scripts/gen_metric_names.py", "metrics": extract(text)}
        a.out.write_text(json.dumps(data, indent=1) + "\n", encoding="utf-8")
        return 0
    if a.wheel is None or not Path(a.wheel).is_file():
        print("gen_metric_names: --wheel (or $ESCHA_SGLANG_WHEEL) must name the release's wheel", file=sys.stderr)
        return 2
    data = catalog(Path(a.wheel))
    out = REPO / "escha_deploy" / "catalog" / "releases" / data["release"] / "metrics.json"
    text = json.dumps(data, indent=1) + "\n"
    if a.check:
        if not out.is_file() or out.read_text() != text:
            print(f"{out}: stale; run scripts/gen_metric_names.py --wheel {a.wheel}", file=sys.stderr)
            return 1
        return 0
    out.write_text(text)
    print(f"wrote {out} ({len(data['metrics'])} metrics)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
