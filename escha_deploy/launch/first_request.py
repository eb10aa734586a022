"""The first request to a ready server: what to send (curl and the OpenAI client, printed by
`up` once it is ready and by `up --dry-run`), and `ask`, which sends one and prints the answer
with where its cached prompt tokens came from.

The request is SGLang's OpenAI-compatible chat route, ``POST /v1/chat/completions``
(``sglang/srt/entrypoints/http_server.py``: ``openai_v1_chat_completions``). The model name is
the server's served name: ``model.served_model_name``, else ``model.path``, as SGLang defaults
it (``server_args.py``: ``ServerArgs.__post_init__`` sets ``served_model_name = model_path``).
The API key (``container.api_key_file``) is never printed: the commands read it from its file
(``$(cat FILE)``, ``open(FILE)``), so a printed command holds no secret. ``ask`` asks for
``return_cached_tokens_details``, which SGLang answers in ``sglext.cached_tokens_details``
(``{"device": D, "host": H}``, ``output_streamer.py: get_cached_tokens_details``) when
something was cached; ``usage.prompt_tokens_details.cached_tokens`` is the total
(``usage_processor.py: _details_if_cached``, with ``--enable-cache-report``).
"""

from __future__ import annotations

import json
import shlex
from dataclasses import dataclass

from escha_deploy.utils.errors import BadInput, Failed, Refused

#: The prompt the printed first request sends.
FIRST_PROMPT = "Say hello in five words."
#: Tokens the first request asks for at most.
FIRST_MAX_TOKENS = 64
#: Seconds `ask` waits for the answer (a first request after start may compile kernels).
ASK_TIMEOUT_S = 300.0


def served_model_name(model_path: str, served: str | None) -> str:
    """The name the server answers to: ``served`` (``--served-model-name``), else the model
    path, as SGLang 0.5.19 defaults it."""
    return served or model_path


def chat_body(model: str, prompt: str, max_tokens: int, *, cache_details: bool = False) -> dict:
    """The JSON body of one chat completion (``ChatCompletionRequest`` fields of
    ``entrypoints/openai/protocol.py``; ``return_cached_tokens_details`` is SGLang's own)."""
    body: dict = {"model": model, "messages": [{"role": "user", "content": prompt}], "max_tokens": max_tokens}
    if cache_details:
        body["return_cached_tokens_details"] = True
    return body


@dataclass(frozen=True)
class FirstRequest:
    """The first request, as a shell command (``curl``) and as Python (``openai``): neither holds
    the key, both read it from ``key_file`` when there is one."""

    endpoint: str
    model: str
    key_file: str | None
    curl: str
    python: str

    def lines(self) -> list[str]:
        """What `up` prints: a heading, the curl command, the Python lines."""
        return ["first request (curl):", f"  {self.curl}", "or with the OpenAI client (pip install openai):",
                *(f"  {ln}" for ln in self.python.splitlines())]


def first_request(endpoint: str, model: str, key_file: str | None, prompt: str = FIRST_PROMPT,
                  max_tokens: int = FIRST_MAX_TOKENS) -> FirstRequest:
    """The first request to ``endpoint`` (``http://HOST:PORT``) for ``model``, the key read from
    ``key_file`` (a host path; None: the server takes no key). Pure."""
    body = json.dumps(chat_body(model, prompt, max_tokens), separators=(",", ":"))
    parts = ["curl", "-sS", "--fail-with-body", f"{endpoint}/v1/chat/completions",
             "-H", "Content-Type: application/json"]
    cmd = shlex.join(parts)
    if key_file:
        # the key stays in its file: the shell reads it when the command runs
        cmd += f' -H "Authorization: Bearer $(cat {shlex.quote(key_file)})"'
    cmd += f" -d {shlex.quote(body)}"
    key = f"open({key_file!r}).read().strip()" if key_file else '"EMPTY"'  # the client wants some key
    py = "\n".join([
        "from openai import OpenAI",
        f"client = OpenAI(base_url={endpoint + '/v1'!r}, api_key={key})",
        f"r = client.chat.completions.create(model={model!r}, max_tokens={max_tokens},",
        f"                                   messages=[{{'role': 'user', 'content': {prompt!r}}}])",
        "print(r.choices[0].message.content)",
    ])
    return FirstRequest(endpoint, model, key_file, cmd, py)


@dataclass(frozen=True)
class Answer:
    """What `ask` got back: the text, the prompt's tokens, and the cached ones: ``cached_tokens``
    the total (usage), ``device_tokens``/``host_tokens`` where they came from (sglext); None
    where the server did not say (no cache report, or nothing cached)."""

    text: str
    prompt_tokens: int | None
    completion_tokens: int | None
    cached_tokens: int | None
    device_tokens: int | None
    host_tokens: int | None

    def cache_line(self) -> str:
        """One line: how many prompt tokens came from the cache, and from which tier."""
        if self.cached_tokens is None and self.device_tokens is None and self.host_tokens is None:
            return (f"cached tokens: none reported of {self.prompt_tokens} prompt tokens (nothing cached yet, or "
                    "the server runs without --enable-cache-report)")
        total = self.cached_tokens if self.cached_tokens is not None else (self.device_tokens or 0) + (self.host_tokens or 0)
        where = ("sources not reported" if self.device_tokens is None and self.host_tokens is None
                 else f"device {self.device_tokens or 0}, host {self.host_tokens or 0}")
        return f"cached tokens: {total} of {self.prompt_tokens} prompt tokens ({where})"


def _int(v) -> int | None:
    return v if isinstance(v, int) and not isinstance(v, bool) else None


def parse_answer(data: dict) -> Answer:
    """An ``Answer`` from a chat completion's JSON. Raises ``Failed`` (4) when it has no choice."""
    choices = data.get("choices") if isinstance(data, dict) else None
    if not isinstance(choices, list) or not choices or not isinstance(choices[0], dict):
        raise Failed("ask: the server's answer has no choices")
    msg = choices[0].get("message") or {}
    usage = data.get("usage") or {}
    details = usage.get("prompt_tokens_details") or {}
    ext = ((data.get("sglext") or {}).get("cached_tokens_details") or {}) if isinstance(data.get("sglext"), dict) else {}
    return Answer(text=str(msg.get("content") or ""), prompt_tokens=_int(usage.get("prompt_tokens")),
                  completion_tokens=_int(usage.get("completion_tokens")),
                  cached_tokens=_int(details.get("cached_tokens")) if isinstance(details, dict) else None,
                  device_tokens=_int(ext.get("device")) if isinstance(ext, dict) else None,
                  host_tokens=_int(ext.get("host")) if isinstance(ext, dict) else None)


def ask(endpoint: str, prompt: str, *, model: str | None = None, api_key: str | None = None,
        max_tokens: int = FIRST_MAX_TOKENS, timeout_s: float = ASK_TIMEOUT_S) -> Answer:
    """Send ``prompt`` to ``endpoint`` as one chat completion and return the answer.

    ``model``: the served name (default: the first of the server's ``/v1/models``). Raises
    ``Refused`` (3) when nothing answers at ``endpoint`` or it refuses the key (401),
    ``Failed`` (4) for any other HTTP error or a malformed answer; the key never appears in a
    message."""
    import httpx

    from escha_deploy.utils.redact import Redactor

    mask = Redactor([api_key] if api_key else [])
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    try:
        with httpx.Client(base_url=endpoint, headers=headers, timeout=httpx.Timeout(timeout_s, connect=5.0),
                          trust_env=False) as http:
            if model is None:
                r = http.get("/v1/models")
                if r.status_code == 401:
                    raise Refused(f"ask: {endpoint} refused the API key (HTTP 401)",
                                  hint="pass --api-key-file with the server's key file")
                ids = [m.get("id") for m in (r.json().get("data") or [])] if r.status_code == 200 else []
                model = next((i for i in ids if isinstance(i, str)), None)
                if model is None:
                    raise Failed(f"ask: {endpoint}/v1/models names no model (HTTP {r.status_code})")
            r = http.post("/v1/chat/completions", json=chat_body(model, prompt, max_tokens, cache_details=True))
    except httpx.TransportError as exc:
        raise Refused(f"ask: nothing answers at {endpoint} ({mask(type(exc).__name__ + ': ' + str(exc))})",
                      hint="`escha-deploy status` lists the running servers") from None
    except ValueError as exc:  # a body that is not JSON
        raise Failed(f"ask: {endpoint} answered something that is not JSON ({mask(str(exc))})") from None
    if r.status_code == 401:
        raise Refused(f"ask: {endpoint} refused the API key (HTTP 401)",
                      hint="pass --api-key-file with the server's key file")
    if r.status_code != 200:
        raise Failed(f"ask: {endpoint}/v1/chat/completions answered HTTP {r.status_code}: "
                     f"{mask(' '.join(r.text.split()))[:300]}")
    try:
        return parse_answer(r.json())
    except ValueError:
        raise Failed(f"ask: {endpoint} answered something that is not JSON") from None


def check_prompt(prompt: str) -> str:
    """The prompt, or ``BadInput`` (2) when it is empty."""
    if not prompt.strip():
        raise BadInput("ask: PROMPT is empty")
    return prompt


def endpoint_of(port_host_ip: str, port_host: int) -> str:
    """The URL this host reaches a server published on ``port_host_ip``:``port_host`` at (a
    wildcard or loopback bind is asked on 127.0.0.1; an IPv6 address bracketed), as `up` waits on it."""
    from escha_deploy.utils.netaddr import url

    return url("127.0.0.1" if port_host_ip in ("0.0.0.0", "127.0.0.1", "") else port_host_ip, port_host)


def for_profile(profile, endpoint: str) -> FirstRequest:
    """The first request to ``profile``'s server at ``endpoint``: its served model name and its
    ``container.api_key_file`` (a host path), never the key."""
    m = profile.model
    return first_request(endpoint, served_model_name(m.path, m.served_model_name), profile.container.api_key_file)
