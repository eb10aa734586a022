"""TEST-ONLY, for the device machine (scripts/gpu_tier_variants.py): records, in the scheduler
process of a real SGLang server, what the hybrid radix tree does with the host tier, one JSON
object a line appended to ``$ESCHA_GPU_TIER_TRACE``. Replaces nothing: it wraps methods after
their modules load, calls the originals, and records what went in and came out.

Events (``t`` is ``time.time()``, ``pid`` the process):

- ``backup``: ``UnifiedRadixCache._execute_kv_backup`` (``mem_cache/unified_radix_cache.py``),
  one node's device->host copy: ``kv`` tokens of Full KV, ``mamba`` whether the node's mamba
  state went with it, ``ok`` whether host room was found (``None`` back from the cache
  controller's ``write``: ``hybrid_cache_controller.py``, the group's
  ``resolve_host_transfers`` rolls the whole write back when one pool has no room);
- ``evict_leaf``: ``UnifiedRadixCache._evict_device_leaf``, a device leaf leaving the device:
  ``backuped`` (demoted to host) or not (write-through: deleted; write-back: backed up first);
- ``drop_subtree``: ``UnifiedRadixCache._drop_subtree_no_host`` (write-back, no host room);
- ``evict_host``: ``UnifiedRadixCache.evict_host``, room asked of the host pool ``pool`` and
  what its LRU freed;
- ``mamba_state``: ``MambaComponent.commit_insert_component_data``
  (``unified_cache/components/mamba_component.py``), a mamba state attached to a node by an
  insert: ``chunked`` (a prefill chunk's insert) and ``depth`` (tokens from the root);
- ``mamba_evict``: ``MambaComponent.evict_component``: ``layer`` (device, host or both),
  whether the node held a device state and a host copy, and whether it was a leaf;
- ``match``: ``UnifiedRadixCache.match_prefix`` for a request's admission (a ``req`` and a
  key of 64 tokens or more): ``key``, ``device`` and ``host`` tokens matched.

Active only when ``ESCHA_GPU_TIER_TRACE`` is set; then the next ``sitecustomize`` further down
``sys.path`` (the serving closure's stub finder) runs as it would have.
"""

import importlib.util
import json
import os
import sys
import time

_HERE = os.path.dirname(os.path.abspath(__file__))
_TRACE = os.environ.get("ESCHA_GPU_TIER_TRACE")
_CACHE = "sglang.srt.mem_cache.unified_radix_cache"
_MAMBA = "sglang.srt.mem_cache.unified_cache.components.mamba_component"


def _write(obj):
    obj["t"] = round(time.time(), 4)
    obj["pid"] = os.getpid()
    with open(_TRACE, "a") as f:
        f.write(json.dumps(obj, default=str) + "\n")


def _safe(fn):
    """Run a recorder; a record never changes the server's behaviour."""
    try:
        fn()
    except Exception as exc:  # noqa: BLE001 - a trace must not break the server
        try:
            _write({"event": "trace_error", "error": repr(exc)})
        except Exception:  # noqa: BLE001
            pass


def _wrap_cache(module):
    cls = module.UnifiedRadixCache
    execute, evict_leaf, drop, evict_host, match = (
        cls._execute_kv_backup, cls._evict_device_leaf, cls._drop_subtree_no_host, cls.evict_host,
        cls.match_prefix)

    def _execute_kv_backup(self, node_id, device_value, comp_xfers, sidecar_xfers):
        out = execute(self, node_id, device_value, comp_xfers, sidecar_xfers)
        _safe(lambda: _write({"event": "backup", "kv": int(len(device_value)),
                              "mamba": any(getattr(ct, "name", str(ct)) == "MAMBA" for ct in comp_xfers),
                              "ok": out is not None, "write_back": bool(self.is_write_back)}))
        return out

    def _evict_device_leaf(self, node_id, tracker):
        rec = {"event": "evict_leaf", "write_back": bool(self.is_write_back)}

        def before():
            node = self.tree_core.node_by_id(node_id)
            rec["backuped"] = bool(node.backuped)
            rec["tokens"] = len(node.key) if node.key is not None else None
        _safe(before)
        out = evict_leaf(self, node_id, tracker)
        rec["deferred_backup"] = out is not None
        _safe(lambda: _write(rec))
        return out

    def _drop_subtree_no_host(self, node_id, tracker):
        out = drop(self, node_id, tracker)
        _safe(lambda: _write({"event": "drop_subtree", "dropped": bool(out)}))
        return out

    def _evict_host(self, num_tokens, *args, **kwargs):
        out = evict_host(self, num_tokens, *args, **kwargs)
        ct = args[0] if args else kwargs.get("component_type")
        _safe(lambda: _write({"event": "evict_host", "pool": getattr(ct, "name", str(ct)),
                              "asked": int(num_tokens), "freed": int(out)}))
        return out

    def _match_prefix(self, params):
        out = match(self, params)

        def rec():
            key = params.key
            n = len(key) if key is not None else 0
            if getattr(params, "req", None) is None or n < 64:
                return
            _write({"event": "match", "key": n, "device": int(len(out.device_indices)),
                    "host": int(getattr(out, "host_hit_length", 0) or 0),
                    "mamba_host": int(getattr(out, "mamba_host_hit_length", 0) or 0),
                    "branching": getattr(out, "mamba_branching_seqlen", None)})
        _safe(rec)
        return out

    cls._execute_kv_backup = _execute_kv_backup
    cls._evict_device_leaf = _evict_device_leaf
    cls._drop_subtree_no_host = _drop_subtree_no_host
    cls.evict_host = _evict_host
    cls.match_prefix = _match_prefix


def _depth(node):
    d = 0
    while node is not None and node.key is not None and node.parent is not None:
        d += len(node.key)
        node = node.parent
    return d


def _wrap_mamba(module):
    cls = module.MambaComponent
    commit, evict = cls.commit_insert_component_data, cls.evict_component

    def commit_insert_component_data(self, node, is_new_leaf, params, result, cache_actions):
        had = node.component_data[self.component_type].value is not None
        out = commit(self, node, is_new_leaf, params, result, cache_actions)
        _safe(lambda: _write({"event": "mamba_state", "chunked": bool(getattr(params, "chunked", False)),
                              "attached": bool(is_new_leaf or not had), "depth": _depth(node)}))
        return out

    def evict_component(self, node, device_frees, host_frees, target=None, **kw):
        cd = node.component_data[self.component_type]
        rec = {"event": "mamba_evict", "layer": getattr(target, "name", str(target)),
               "device": cd.value is not None, "host": cd.host_value is not None,
               "leaf": len(node.children) == 0}
        out = evict(self, node, device_frees, host_frees, target, **kw) if target is not None else \
            evict(self, node, device_frees, host_frees, **kw)
        _safe(lambda: _write(rec))
        return out

    cls.commit_insert_component_data = commit_insert_component_data
    cls.evict_component = evict_component


_WRAPPERS = {_CACHE: _wrap_cache, _MAMBA: _wrap_mamba}


if _TRACE and not getattr(sys, "_escha_tier_trace", False):
    sys._escha_tier_trace = True
    # the finder and the chaining to the next sitecustomize: tests/gpu_rig/site_hooks.py, by path
    _spec = importlib.util.spec_from_file_location("escha_gpu_site_hooks", os.path.join(_HERE, "..", "site_hooks.py"))
    _hooks = importlib.util.module_from_spec(_spec)
    _spec.loader.exec_module(_hooks)
    _hooks.install(_WRAPPERS, _HERE)
