"""STAND-IN for SGLang's interpreter (``python3 -m sglang.launch_server ...``) in the one-plan
tests: prints one line ``STANDIN-CHILD {"argv": [...], "env": {...}}`` with the arguments and
the environment `serve` started it with, then runs the stand-in HTTP server (server.py)."""

import json
import os
import runpy
import sys

print("STANDIN-CHILD " + json.dumps({"argv": sys.argv[1:], "env": dict(os.environ)}), flush=True)
sys.argv = ["/standin/server.py"]
runpy.run_path("/standin/server.py", run_name="__main__")
