"""HiCache on/off benchmark client and the host-tier restore canary.

Talks HTTP to any SGLang 0.5.19 server (OpenAI-compatible ``/v1/completions`` plus SGLang's
``/server_info``, ``/model_info``, ``/v1/tokenize`` and ``/metrics``); never imports SGLang.

Modules, by role:

- ``prompts``: deterministic prompts from a seed, sized with the server's tokenizer.
- ``metrics``: Prometheus text from ``/metrics`` into counter snapshots and deltas.
- ``client``: the one HTTP edge (httpx through ``escha_deploy.utils.httpread``: a total deadline per
  request, size caps, NaN kept out; a bounded request count).
- ``models``: pydantic results shared by the table, JSON and the chart.
- ``workload``: the measurements (cold prefill, decode at batch 1, N concurrent prefixes).
- ``canary``: ask, evict the prefix from the device pool, ask again, compare.
- ``ab``: ``--hicache-ab`` through a launcher interface (``ab.Launcher``).
- ``render``: the rich table and the PNG chart (matplotlib, the optional ``chart`` extra).
"""
