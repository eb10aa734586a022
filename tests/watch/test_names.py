"""The metric names ``status`` reads and the stand-in server exports, against SGLang 0.5.19.

The release's catalog (``catalog/releases/0.5.19/metrics.json``) is regenerated from the real
wheel's ``srt/observability/metrics_collector.py`` here and must equal the committed file; every
name ``watch.names`` reads and every series the stand-in (tests/bench/standin_sglang.py) exports
must be in it (their types and label names: test_standin_exposition.py). Marked ``wheel``: needs the wheel file.
"""

from __future__ import annotations

import importlib.util
import json
import sys
from pathlib import Path

import pytest

from escha_deploy.sglang.releases import release_file, supported_releases
from escha_deploy.watch import names

from bench.standin_sglang import StandinConfig, StandinServer, tokenize
from bench.test_standin_shapes import _wheel

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def gen():
    spec = importlib.util.spec_from_file_location("gen_metric_names", REPO / "scripts" / "gen_metric_names.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules["gen_metric_names"] = module
    spec.loader.exec_module(module)
    return module


def _release_wheel(version: str) -> Path:
    """The release's wheel ($ESCHA_SGLANG_WHEEL for the default one, else .cache/wheels), or skip."""
    from escha_deploy.sglang.releases import default_release

    found = [w for w in ([_wheel()] if version == default_release() else []) if w is not None]
    found += sorted((REPO / ".cache" / "wheels").glob(f"sglang-{version}-*.whl"))
    if not found:
        pytest.skip(f"no sglang {version} wheel (.ci/test downloads every supported release's)")
    return Path(found[0])


@pytest.mark.wheel
@pytest.mark.parametrize("version", supported_releases())
def test_committed_catalog_is_the_wheels(gen, version):
    fresh = gen.catalog(_release_wheel(version))
    assert fresh["release"] == version
    committed = json.loads(release_file(version, "metrics.json").read_text())
    assert committed == fresh, f"stale: run scripts/gen_metric_names.py --wheel <sglang {version} wheel>"


@pytest.mark.parametrize("version", supported_releases())
def test_every_name_status_reads_is_in_the_release(version):
    assert names.missing_in_release(version) == []
    cat = names.release_metrics(version)
    for metric, label in names.LABELS.items():
        assert label in cat[metric]["extra_labels"], (metric, label)


def test_a_name_the_release_lacks_is_reported(monkeypatch):
    monkeypatch.setattr(names, "ALL", (*names.ALL, "sglang:no_such_metric_total"))
    assert names.missing_in_release() == ["sglang:no_such_metric_total"]


def _standin_families(cfg: StandinConfig) -> dict[str, set[str]]:
    """The stand-in's families after prompts that fill, evict and reuse: name -> label names
    (empty for a labelled family with no series yet)."""
    from prometheus_client.parser import text_string_to_metric_families

    srv = StandinServer(cfg)
    for prompt in ("a b c d e f g h", "z y x w v u t s", "a b c d e f g h i"):
        hit, out = srv.serve(tokenize(prompt), 2)
        srv.observe(len(tokenize(prompt)), len(out), hit, False)
    out: dict[str, set[str]] = {}
    for fam in text_string_to_metric_families(srv.metrics.text().decode()):
        if fam.name.endswith("_created"):
            continue  # prometheus_client's creation-time series, not a name of SGLang's
        labels = {k for s in fam.samples for k in s.labels} - {"le"}
        # prometheus_client drops a counter's _total from the family name; the wheel names carry it
        name = fam.name + "_total" if fam.type == "counter" else fam.name
        out[name] = labels
    return out


SMALL = dict(device_tokens=10, host_tokens=100, prefill_tps=1e9, load_back_tps=1e9)


@pytest.mark.parametrize("cfg", [StandinConfig(**SMALL), StandinConfig(**SMALL, hybrid=False, tp_size=2),
                                 StandinConfig(**SMALL, drop_without_backup=True), StandinConfig(**SMALL, hicache=False)],
                         ids=["hybrid", "tp2", "drops", "no-hicache"])
def test_standin_exports_only_release_names(cfg):
    """Names only: each family's type and label names are compared with SGLang's own
    expositions in test_standin_exposition.py."""
    cat = names.release_metrics()
    fams = _standin_families(cfg)
    assert fams, "the stand-in exported nothing"
    for name in fams:
        assert name in cat, f"the stand-in exports {name}, which SGLang 0.5.19 does not define"


def test_later_names_belong_to_their_release_only():
    """A name read when exported (``names.LATER``) is in its first release's catalog and is
    not asked of an earlier one."""
    for name in names.LATER:
        since = names.first_release(name)
        assert since == "0.5.23" and name in names.release_metrics(since), name
        assert name not in names.release_metrics("0.5.19"), name
        for v in supported_releases():
            assert name not in names.missing_in_release(v)
