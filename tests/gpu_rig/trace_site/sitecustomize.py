"""TEST-ONLY, for the device machine (tests/runtime/test_real_server_shape_gpu.py): records, in
every process of a real SGLang server, the KV host pools it builds and the series' geometry
check on them, one JSON object a line appended to ``$ESCHA_GPU_GEOMETRY_TRACE``. Replaces nothing:
it wraps two functions after their modules load and calls the originals.

- ``sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler.build_kv_host_pool`` (stock and
  patched trees): ``{"event": "build_kv_host_pool", "pool", "size", "geometry", "problems"}``, the
  geometry read by escha-deploy's hook (``escha_deploy/runtime/hooks/transfer_geometry.py:
  geometry_of``, loaded from this checkout by path) and what its check would say of it;
- ``sglang.srt.mem_cache.pool_host.escha_transfer_geometry.check_host_pool`` (patched tree only,
  patch 0003): ``{"event": "check_host_pool", "label", "error"}``.

Active only when ``ESCHA_GPU_GEOMETRY_TRACE`` is set; then the next ``sitecustomize`` further
down ``sys.path`` (the serving closure's stub finder) runs as it would have.
"""

import importlib.util
import json
import os
import sys

_HERE = os.path.dirname(os.path.abspath(__file__))
_TRACE = os.environ.get("ESCHA_GPU_GEOMETRY_TRACE")
_HOOK = os.path.join(_HERE, "..", "..", "..", "escha_deploy", "runtime", "hooks", "transfer_geometry.py")
_ASSEMBLER = "sglang.srt.mem_cache.hybrid_cache.hybrid_pool_assembler"
_CHECK = "sglang.srt.mem_cache.pool_host.escha_transfer_geometry"


def _write(obj):
    obj["pid"] = os.getpid()
    with open(_TRACE, "a") as f:
        f.write(json.dumps(obj, default=str) + "\n")


def _hook():
    name = "escha_trace_transfer_geometry"
    if name not in sys.modules:
        spec = importlib.util.spec_from_file_location(name, _HOOK)
        mod = importlib.util.module_from_spec(spec)
        sys.modules[name] = mod  # dataclasses look their module up there
        spec.loader.exec_module(mod)
    return sys.modules[name]


def _wrap_assembler(module):
    original = module.build_kv_host_pool

    def build_kv_host_pool(*args, **kwargs):
        pool = original(*args, **kwargs)
        rec = {"event": "build_kv_host_pool", "pool": type(pool).__name__, "size": getattr(pool, "size", None)}
        try:
            geos = _hook().geometry_of(pool, kwargs.get("kv_pool", getattr(pool, "device_pool", None)))
            rec["geometry"] = [vars(g) if hasattr(g, "__dict__") else repr(g) for g in geos or []]
            rec["problems"] = [p for g in geos or [] for p in g.problems()]
        except Exception as exc:  # a record, never a change to the server's behaviour
            rec["trace_error"] = repr(exc)
        _write(rec)
        return pool

    module.build_kv_host_pool = build_kv_host_pool


def _wrap_check(module):
    original = module.check_host_pool

    def check_host_pool(host_pool, device_pool, pool_label="kv"):
        try:
            original(host_pool, device_pool, pool_label)
        except Exception as exc:
            _write({"event": "check_host_pool", "label": pool_label, "error": str(exc)})
            raise
        _write({"event": "check_host_pool", "label": pool_label, "error": None})

    module.check_host_pool = check_host_pool


_WRAPPERS = {_ASSEMBLER: _wrap_assembler, _CHECK: _wrap_check}


if _TRACE and not getattr(sys, "_escha_geometry_trace", False):
    sys._escha_geometry_trace = True
    # the finder and the chaining to the next sitecustomize: tests/gpu_rig/site_hooks.py, by path
    _spec = importlib.util.spec_from_file_location("escha_gpu_site_hooks", os.path.join(_HERE, "..", "site_hooks.py"))
    _hooks = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_hooks)
    _hooks.install(_WRAPPERS, _HERE)
