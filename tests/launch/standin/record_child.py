"""STAND-IN for SGLang's interpreter (``python3 -m sglang.launch_server ...``) in the one-plan
tests: prints one line ``STANDIN-CHILD {"argv": [...], "env": {...}}`` with the arguments and
the environment `serve` started it with, then runs the stand-in HTTP server (server.py). Run as
``-c CODE`` (up's first-use check) it runs the code, as the interpreter it stands in for would."""

import json
import os
import runpy
import sys

if len(sys.argv) > 1 and sys.argv[1].endswith("sglang_preflight.py"):
    # serve's SGLang pre-flight runs its script in this interpreter first: the stand-in has no
    # SGLang, so it answers as an interpreter without one does (escha_deploy.launch.sglang_preflight)
    print(json.dumps({"ok": None, "not_run": "the stand-in interpreter has no SGLang"}))
    sys.exit(4)

if len(sys.argv) > 2 and sys.argv[1] == "-c":
    # `python3 -c CODE` in SGLang's interpreter (up's first-use check, launch/first_use_check.py,
    # runs its standard-library script so): an interpreter runs the code, as python3 -c does
    code = sys.argv[2]
    sys.argv = ["-c", *sys.argv[3:]]
    exec(compile(code, "<string>", "exec"), {"__name__": "__main__", "__builtins__": __builtins__})
    sys.exit(0)

print("STANDIN-CHILD " + json.dumps({"argv": sys.argv[1:], "env": dict(os.environ)}), flush=True)
sys.argv = ["/standin/server.py"]
runpy.run_path("/standin/server.py", run_name="__main__")
