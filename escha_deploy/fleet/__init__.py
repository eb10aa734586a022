"""Past one box: a fleet file names boxes, replica groups and SGLang's router (SMG).

``model``: the fleet file (YAML, pydantic, errors as ``file:line: key: message`` like profiles);
``plan``: every box planned with its own facts by the single-box planner; ``router``: SMG's
command line and its lifecycle; ``multinode``: SGLang's own multi-node flags per node;
``compose`` and ``k8s``: renderers. Nothing here schedules or balances load itself: SMG routes,
SGLang spans nodes, Kubernetes (LeaderWorkerSet) places pods.
"""
