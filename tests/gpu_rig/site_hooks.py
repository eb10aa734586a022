"""TEST-ONLY: what the GPU runs' test-only ``sitecustomize`` files share (``trace_site/``,
``tier_trace/``): a finder, first on ``sys.meta_path``, that hands each named module to its
wrapper once the module has loaded, and the chaining to the next ``sitecustomize`` further down
``sys.path`` (the serving closure's stub finder), which then runs as it would have. Loaded by path
from those files (they run before any package of this checkout is importable). Standard library
only."""

import importlib.abc
import importlib.machinery
import importlib.util
import os
import sys


class _Loader(importlib.abc.Loader):
    def __init__(self, inner, wrap):
        self.inner, self.wrap = inner, wrap

    def create_module(self, spec):
        return self.inner.create_module(spec)

    def exec_module(self, module):
        self.inner.exec_module(module)
        self.wrap(module)


class _Finder(importlib.abc.MetaPathFinder):
    def __init__(self, wrappers):
        self.wrappers = wrappers

    def find_spec(self, fullname, path=None, target=None):
        wrap = self.wrappers.get(fullname)
        if wrap is None:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path)
        if spec is None or spec.loader is None:
            return None
        spec.loader = _Loader(spec.loader, wrap)
        return spec


def install(wrappers, here):
    """Wrap each module named in ``wrappers`` (name -> function of the loaded module) when it
    loads, then run the ``sitecustomize`` that the folder ``here`` (the caller's) shadows."""
    sys.meta_path.insert(0, _Finder(wrappers))
    nxt = importlib.machinery.PathFinder.find_spec(
        "sitecustomize", [p for p in sys.path if os.path.abspath(p or ".") != here])
    if nxt is not None and nxt.loader is not None:
        mod = importlib.util.module_from_spec(nxt)
        nxt.loader.exec_module(mod)

