"""STAND-IN for the patched SGLang image in launch tests: a tiny HTTP server (stdlib only).

It plays `escha-deploy serve` + SGLang 0.5.19 where no GPU exists: prints startup lines in
SGLang 0.5.19's real formats (each cited below), then answers GET /health, POST /generate and POST /v1/chat/completions (a fixed answer).
Behaviour comes from /etc/standin/config.json, baked into the image by the tests:
  mode: ok | crash (the host-memory check's ValueError, exit 1) | no_generate (/health 200,
        /generate 503: sglang#22779's symptom) | server_key (requests must carry
        `Authorization: Bearer <server_key>`, else 401 as SGLang's API-key middleware answers:
        sglang/srt/utils/auth.py; /health is exempt there too) | log_key (as ok, but logs the
        mounted API key bare and in the spellings a config dump, an environment, a header and
        a URL use: what `logs` must mask)
  startup_s: seconds before the HTTP port opens; port; sizes: the figures to log.
"""

import json
import signal
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

CFG = json.load(open("/etc/standin/config.json"))
SIZES = CFG.get("sizes", {})


def log(msg, tp=None):
    # sglang/srt/utils/common.py configure_logger: "[%(asctime)s{prefix}] %(message)s", prefix " TP<n>"
    prefix = f" TP{tp}" if tp is not None else ""
    print(f"[{time.strftime('%Y-%m-%d %H:%M:%S')}{prefix}] {msg}", flush=True)


def on_term(signum, frame):
    log("Received sigterm; shutting down")  # stand-in wording
    sys.exit(0)


signal.signal(signal.SIGTERM, on_term)
port = int(CFG.get("port", 30123))
# sglang/srt/entrypoints/engine.py: logger.info(f"server_args={server_args.resolved_dict()}")
log("server_args=" + repr({"model_path": "/models/standin", "host": "0.0.0.0", "port": port,
                           "tp_size": 2, "api_key": None, "admin_api_key": None}))
for tp in (0, 1):
    # sglang/srt/model_executor/model_runner.py load_model
    log("Load weight begin. avail mem=11.20 GB", tp)
for tp in (0, 1):
    log("Load weight end. elapsed=0.01 s, type=StandIn, avail mem=5.30 GB, mem usage=5.90 GB.", tp)
for tp in (0, 1):
    # sglang/srt/mem_cache/memory_pool.py (KV and Mamba device pools)
    log(f"KV Cache is allocated. dtype: torch.float8_e4m3fn, #tokens: {SIZES.get('kv_tokens', 0)}, "
        "K size: 0.82 GB, V size: 0.82 GB", tp)
    log(f"Mamba Cache is allocated. max_mamba_cache_size: {SIZES.get('device_mamba_slots', 16)}, "
        "conv_state size: 0.06GB, ssm_state size: 1.21GB ", tp)
if CFG.get("mode") == "crash":
    for tp in (0, 1):
        log("Scheduler hit an exception: Traceback (most recent call last):", tp)
        print('  File "/usr/lib/python3/dist-packages/sglang/srt/mem_cache/pool_host/base.py", line 178, in __init__', flush=True)
        # sglang/srt/mem_cache/pool_host/base.py HostKVCache.__init__
        print("ValueError: Not enough host memory available. Requesting 2.58 GB but only have 1.12 GB free. "
              "Please reduce the size of the hierarchical cache.", flush=True)
    sys.exit(1)
for tp in (0, 1):
    # sglang/srt/mem_cache/pool_host/base.py and pool_host/mamba.py
    log("Allocating kv hierarchical KV host pool: %d tokens, %.2f GB host memory."
        % (SIZES.get("host_kv_tokens", 0), SIZES.get("host_kv_bytes", 0) / 1e9), tp)
    log("Allocating %.2f GB host memory for hierarchical Mamba cache (layout=page_first)."
        % (SIZES.get("host_mamba_bytes", 0) / 1e9), tp)
for tp in (0, 1):
    # sglang/srt/model_executor/model_runner_components/cuda_graph_setup.py
    log("Capture cuda graph begin. This can take up to several minutes. avail mem=1.10 GB", tp)
# sglang/srt/managers/scheduler.py (rank 0)
log(f"max_total_num_tokens={SIZES.get('kv_tokens', 0)}, chunked_prefill_size=2048, "
    "max_prefill_tokens=16384, max_running_requests=3, context_len=131072, available_gpu_mem=0.95 GB", 0)
time.sleep(float(CFG.get("startup_s", 0)))


class Handler(BaseHTTPRequestHandler):
    def log_message(self, fmt, *args):
        pass

    def _send(self, code, body):
        data = json.dumps(body).encode()
        self.send_response(code)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def do_GET(self):
        self._send(200, {}) if self.path == "/health" else self._send(404, {"error": "not found"})

    def do_POST(self):
        n = int(self.headers.get("Content-Length") or 0)
        raw = self.rfile.read(n)
        if self.path not in ("/generate", "/v1/chat/completions"):
            return self._send(404, {"error": "not found"})
        if CFG.get("mode") == "server_key" and self.headers.get("Authorization") != "Bearer " + CFG["server_key"]:
            return self._send(401, {"error": "Unauthorized"})
        if CFG.get("mode") == "no_generate":
            return self._send(503, {"error": "stand-in: not serving"})
        if self.path == "/v1/chat/completions":  # the shape of entrypoints/openai/protocol.py ChatCompletionResponse
            try:
                body = json.loads(raw or b"{}")
            except ValueError:
                return self._send(400, {"error": "stand-in: body is not JSON"})
            return self._send(200, {"id": "standin", "object": "chat.completion", "created": int(time.time()),
                                    "model": body.get("model"),
                                    "choices": [{"index": 0, "finish_reason": "length",
                                                 "message": {"role": "assistant", "content": "stand-in: hello"}}],
                                    "usage": {"prompt_tokens": 8, "completion_tokens": 3, "total_tokens": 11,
                                              "prompt_tokens_details": None}})
        self._send(200, {"text": "!", "meta_info": {"completion_tokens": 1}})


if CFG.get("mode") == "log_key":  # a careless server: its key in the log, bare and in 5 spellings
    key = open("/run/secrets/escha_api_key").read().strip()
    log("stand-in: serving with key " + key)
    log(f"api-key: {key}")  # SGLang's --config YAML echoed (sglang/srt/utils/server_args_config_parser.py keys)
    log(f"SGLANG_API_KEY={key} api_key={key}")
    log("Authorization: Basic c3RhbmQtaW46" + key)
    log(f"connecting to http://user:{key}@127.0.0.1:9/v1?api_key={key}")
httpd = ThreadingHTTPServer(("0.0.0.0", port), Handler)
log(f"Uvicorn running on http://0.0.0.0:{port} (Press CTRL+C to quit)")  # uvicorn's line
log("The server is fired up and ready to roll!")  # sglang/srt/entrypoints/http_server.py
httpd.serve_forever()
