"""STAND-IN for SGLang's interpreter (``python3 -m sglang.launch_server ...``) in the one-plan
tests: prints one line ``STANDIN-CHILD {"argv": [...], "env": {...}}`` with the arguments and
the environment `serve` started it with, then runs the stand-in HTTP server (server.py)."""

import json
import os
import runpy
import sys

if len(sys.argv) > 1 and sys.argv[1].endswith("sglang_preflight.py"):
    # serve's SGLang pre-flight runs its script in this interpreter first: the stand-in has no
    # SGLang, so it answers as an interpreter without one does (escha_deploy.launch.sglang_preflight)
    print(json.dumps({"ok": None, "not_run": "the stand-in interpreter has no SGLang"}))
    sys.exit(4)

print("STANDIN-CHILD " + json.dumps({"argv": sys.argv[1:], "env": dict(os.environ)}), flush=True)
sys.argv = ["/standin/server.py"]
runpy.run_path("/standin/server.py", run_name="__main__")
