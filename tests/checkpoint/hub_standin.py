"""A STAND-IN for the Hugging Face Hub, for tests only, on 127.0.0.1 only (no test reaches the
internet). It answers the routes and headers an unmodified ``huggingface_hub`` client reads, per
its code (huggingface_hub 2.x):

- ``GET /api/models/{repo}[/revision/{rev}]`` (``HfApi.model_info``): ``{"id", "sha",
  "siblings": [{"rfilename", "size", "blobId", "lfs": {"sha256", "size", "pointerSize"}}]}``
  (``hf_api.py: ModelInfo``/``RepoSibling``; ``lfs`` for the safetensors files only, as Git
  LFS stores them);
- ``HEAD``/``GET /{repo}/resolve/{rev}/{path}`` (``file_download.py: get_hf_file_metadata``,
  ``http_get``): ``X-Repo-Commit``, ``ETag`` (the Git blob id) or, for an LFS file,
  ``X-Linked-Etag`` (its sha256) and ``X-Linked-Size``; ``Content-Length``; a ``Range:
  bytes=N-`` request answered 206 with ``Content-Range`` (how the client resumes);
- errors as ``utils/_http.py: hf_raise_for_status`` reads them: 404 with ``X-Error-Code``
  ``RepoNotFound``, ``RevisionNotFound`` or ``EntryNotFound``.

Faults, per file name: ``corrupt`` (bytes that differ from the recorded sha256, same size) and
``interrupt_once`` (the first full GET sends half the bytes, then closes the connection).
``move(repo, files)`` gives ``main`` a new commit, as a push would.
"""

from __future__ import annotations

import hashlib
import json
import threading
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import unquote, urlparse


def git_sha1(data: bytes) -> str:
    return hashlib.sha1(f"blob {len(data)}\0".encode() + data).hexdigest()


@dataclass
class Repo:
    commits: dict[str, dict[str, bytes]] = field(default_factory=dict)  # commit -> files
    refs: dict[str, str] = field(default_factory=dict)  # branch -> commit


class HubStandin:
    """``HubStandin()`` then ``add(repo, files)``; ``start()`` returns the endpoint URL."""

    def __init__(self) -> None:
        self.repos: dict[str, Repo] = {}
        self.corrupt: set[str] = set()
        self.interrupt_once: set[str] = set()
        self.requests: list[tuple[str, str, str | None]] = []  # (method, path, Range)
        self._n = 0
        self._httpd: ThreadingHTTPServer | None = None

    def _commit_id(self) -> str:
        self._n += 1
        return hashlib.sha1(f"commit {self._n}".encode()).hexdigest()

    def add(self, repo: str, files: dict[str, bytes]) -> str:
        """A repository whose ``main`` holds ``files``; returns the commit."""
        r = self.repos.setdefault(repo, Repo())
        c = self._commit_id()
        r.commits[c] = dict(files)
        r.refs["main"] = c
        return c

    move = add  # a new commit on main

    def _resolve(self, repo: str, rev: str) -> tuple[str, dict[str, bytes]] | None:
        r = self.repos[repo]
        c = r.refs.get(rev, rev)
        return (c, r.commits[c]) if c in r.commits else None

    def start(self) -> str:
        hub = self

        class Handler(BaseHTTPRequestHandler):
            protocol_version = "HTTP/1.1"

            def log_message(self, *a) -> None:
                pass

            def _err(self, code: int, error_code: str | None) -> None:
                body = json.dumps({"error": error_code or "error"}).encode()
                self.send_response(code)
                if error_code:
                    self.send_header("X-Error-Code", error_code)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                if self.command != "HEAD":
                    self.wfile.write(body)

            def _route(self):
                path = unquote(urlparse(self.path).path)
                hub.requests.append((self.command, path, self.headers.get("Range")))
                parts = path.strip("/").split("/")
                if parts[:2] == ["api", "models"] and len(parts) >= 4:
                    repo = "/".join(parts[2:4])
                    rev = parts[5] if len(parts) >= 6 and parts[4] == "revision" else "main"
                    return self._info(repo, rev)
                if len(parts) >= 5 and parts[2] == "resolve":
                    return self._file("/".join(parts[:2]), parts[3], "/".join(parts[4:]))
                self._err(404, None)

            do_GET = do_HEAD = _route

            def _info(self, repo: str, rev: str) -> None:
                if repo not in hub.repos:
                    return self._err(404, "RepoNotFound")
                got = hub._resolve(repo, rev)
                if got is None:
                    return self._err(404, "RevisionNotFound")
                commit, files = got
                sib = []
                for name, data in sorted(files.items()):
                    s = {"rfilename": name, "size": len(data), "blobId": git_sha1(data)}
                    if name.endswith(".safetensors"):
                        s["lfs"] = {"sha256": hashlib.sha256(data).hexdigest(), "size": len(data), "pointerSize": 134}
                    sib.append(s)
                body = json.dumps({"id": repo, "modelId": repo, "sha": commit, "siblings": sib}).encode()
                self.send_response(200)
                self.send_header("Content-Type", "application/json")
                self.send_header("Content-Length", str(len(body)))
                self.end_headers()
                self.wfile.write(body)

            def _file(self, repo: str, rev: str, name: str) -> None:
                if repo not in hub.repos:
                    return self._err(404, "RepoNotFound")
                got = hub._resolve(repo, rev)
                if got is None:
                    return self._err(404, "RevisionNotFound")
                commit, files = got
                if name not in files:
                    return self._err(404, "EntryNotFound")
                data = files[name]
                lfs = name.endswith(".safetensors")
                if name in hub.corrupt:  # same size, other bytes
                    data = bytes([data[0] ^ 0xFF]) + data[1:]
                start = 0
                rng = self.headers.get("Range")
                if rng and rng.startswith("bytes="):
                    start = int(rng[6:].split("-")[0] or 0)
                self.send_response(206 if start else 200)
                self.send_header("X-Repo-Commit", commit)
                recorded = files[name]
                if lfs:
                    self.send_header("X-Linked-Etag", f'"{hashlib.sha256(recorded).hexdigest()}"')
                    self.send_header("X-Linked-Size", str(len(recorded)))
                self.send_header("ETag", f'"{git_sha1(recorded)}"')
                self.send_header("Content-Length", str(len(data) - start))
                if start:
                    self.send_header("Content-Range", f"bytes {start}-{len(data) - 1}/{len(data)}")
                self.end_headers()
                if self.command == "HEAD":
                    return
                if not start and name in hub.interrupt_once:
                    hub.interrupt_once.discard(name)
                    self.wfile.write(data[: len(data) // 2])
                    self.wfile.flush()
                    self.close_connection = True
                    import socket

                    self.connection.shutdown(socket.SHUT_RDWR)
                    return
                self.wfile.write(data[start:])

        self._httpd = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        threading.Thread(target=self._httpd.serve_forever, daemon=True).start()
        return f"http://127.0.0.1:{self._httpd.server_address[1]}"

    def stop(self) -> None:
        if self._httpd is not None:
            self._httpd.shutdown()
            self._httpd.server_close()
