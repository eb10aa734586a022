"""The names the bench reads from a server, checked against the real SGLang 0.5.19 wheel.

Metric names and labels (``observability/metrics_collector.py``), ``/server_info`` keys
(``ServerArgs`` fields in ``server_args.py`` plus ``Scheduler.get_init_info`` in
``managers/scheduler.py``), request fields (``CompletionRequest`` in
``entrypoints/openai/protocol.py``) and hybrid model types (``configs/hybrid_arch.py``). Read as
source with ``ast``, so nothing heavy is imported. A rename upstream fails here, not silently
on a user's server.
"""

from __future__ import annotations

import ast
import zipfile

import pytest

from escha_deploy.bench import metrics as m

from .test_standin_shapes import WHEEL, _wheel

pytestmark = pytest.mark.wheel


@pytest.fixture(scope="module")
def src():
    wheel = _wheel()
    if wheel is None:
        pytest.skip(f"the real {WHEEL} is not here (.ci/test downloads it)")
    with zipfile.ZipFile(wheel) as z:
        yield lambda path: z.read(f"sglang/srt/{path}").decode()


def _metric_calls(text: str) -> dict[str, ast.Call]:
    """name= of every Counter/Gauge/Histogram(...) call -> the call."""
    out = {}
    for node in ast.walk(ast.parse(text)):
        if isinstance(node, ast.Call):
            for kw in node.keywords:
                if kw.arg == "name" and isinstance(kw.value, ast.Constant):
                    out[kw.value.value] = node
    return out


def test_metric_names_exist(src):
    calls = _metric_calls(src("observability/metrics_collector.py"))
    for name in (m.CACHED_TOKENS, m.PROMPT_TOKENS, m.LOAD_BACK_TOKENS, m.BACKUP_TOKENS,
                 m.EVICTED_TOKENS, m.HOST_TOTAL_TOKENS, m.HOST_USED_TOKENS, m.MAMBA_USAGE):
        assert name in calls, name


def test_labels_the_bench_filters_on(src):
    text = src("observability/metrics_collector.py")
    calls = _metric_calls(text)
    assert "'cache_source'" in ast.unparse(calls[m.CACHED_TOKENS])
    assert "'pool'" in ast.unparse(calls[m.LOAD_BACK_TOKENS])
    for source in ('"device"', '"host"'):
        assert f"report_cache_source({source}" in text
    assert '"tp_rank": tp_rank' in text


def test_server_info_keys_exist(src):
    tree = ast.parse(src("server_args.py"))
    cls = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "ServerArgs")
    fields = {n.target.id for n in cls.body
              if isinstance(n, ast.AnnAssign) and isinstance(n.target, ast.Name)}
    for key in ("enable_hierarchical_cache", "enable_cache_report", "enable_metrics",
                "enable_deterministic_inference", "hicache_ratio", "hicache_write_policy",
                "max_mamba_cache_size"):
        assert key in fields, key
    sched = src("managers/scheduler.py")
    assert '"max_total_num_tokens": self.max_total_num_tokens' in sched
    assert '"max_req_input_len": self.max_req_input_len' in sched


def test_request_fields_exist(src):
    tree = ast.parse(src("entrypoints/openai/protocol.py"))
    cls = next(n for n in tree.body
               if isinstance(n, ast.ClassDef) and n.name == "CompletionRequest")
    fields = {n.target.id for n in cls.body if isinstance(n, ast.AnnAssign)}
    for key in ("prompt", "max_tokens", "temperature", "seed", "stream", "stream_options",
                "ignore_eos", "return_cached_tokens_details", "return_token_ids"):
        assert key in fields, key


def test_hybrid_model_types_cover_the_reference_families(src):
    from escha_deploy.bench.client import HYBRID_MODEL_TYPES

    text = src("configs/hybrid_arch.py")
    for cfg in ("Qwen3NextConfig", "Qwen3_5Config", "NemotronHConfig", "FalconH1Config"):
        assert cfg in text
    assert {"qwen3_next", "qwen3_5", "nemotron_h", "falcon_h1"} <= HYBRID_MODEL_TYPES
