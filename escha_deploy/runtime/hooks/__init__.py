"""Runtime hooks: the small modules the patched SGLang files call into.

Each file here is copied byte for byte into ``sglang/srt/mem_cache/pool_host/escha_*.py`` by
its patch (tests/runtime/test_series.py checks the copies agree). They import only the
standard library at module level, so they import without SGLang, on a CPU machine and on the
GPU machine; never import escha_deploy from them.
"""
