"""`status`'s view of a running server: pure parsers and window arithmetic (``procfs``,
``reading``, ``names``), alert rules (``alerts``), the report row (``report``, ``render``), and
the I/O at its edges (``collect``: /metrics, /proc, Docker; ``record``; ``session``: the loop
`status` runs). Above ``launch`` in the import contract (.importlinter): it reads what ``up`` and
``serve`` wrote (``launch.planview``, ``launch.serve_state``), and ``launch`` imports nothing of it.
"""
