"""A planted API key, given every way a user could, never shows up in any output or artefact.

Two kinds of route:

- the documented one, ``container.api_key_file``: every printing path (``up --dry-run`` in both
  formats, ``serve --print``, ``compose`` to stdout and to a file, ``profiles show`` in both
  formats, ``plan --format json``, ``status``, ``logs``), ``docker inspect`` of a started
  STAND-IN container (config, args, env, labels, mounts, host config) and its log, and the
  host's process table (``ps`` and every ``/proc/PID/cmdline``) while a native ``serve`` runs;
- the undocumented ones, ``runtime.extra_args`` in a profile file or through ``--set``, in
  every spelling argparse accepts (``--api-key K``, ``--api-key=K``, an abbreviation) and for
  every secret flag of the catalog: refused (exit 2) by every command, naming the right route,
  never echoing the key, and nothing created on the daemon;
- the places nobody planted it: a CR, LF or NUL in the key file or ``ESCHA_API_KEY`` (refused
  naming the byte offset; one trailing LF or CRLF is the file's newline), the key typed where
  its file's path goes (``container.api_key_file=KEY``), an endpoint URL with ``?api_key=KEY``,
  and a server that logs its key (bare, as its config YAML, an environment, a header or a URL
  prints it): `logs` and `diagnose` mask it, and strip a log's terminal escapes.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from escha_deploy.utils.secretargs import SECRET_FLAGS, extra_args_problems, redact_argv
from inproc import run_main

from .conftest import STANDIN_PROFILE, run_cli, STANDIN_LABEL, STANDIN_CONTAINER
from .test_native import STANDIN_SGLANG

KEY = "sk-planted-7f3a9c1e5b2d4068"
P = str(STANDIN_PROFILE)
#: serve/compose/up of the stand-in profile without the image's capabilities (no daemon asked)
BASE_SETS = ["--set", "runtime.needs=[]", "--set", "hicache.enabled=false"]


@pytest.fixture
def key_file(tmp_path):
    f = tmp_path / "api_key"
    f.write_text(KEY + "\n")
    f.chmod(0o600)
    return f


def printing_commands(profile: str, sets: list[str], out_file: Path) -> list[list[str]]:
    """Every command that prints or writes something about a profile without starting it."""
    return [
        ["plan", "-p", profile, *sets, "--format", "json", "--host-ram", "64GiB", "--linux"],
        ["plan", "-p", profile, *sets, "--host-ram", "64GiB", "--linux"],
        ["profiles", "show", profile, *sets],
        ["profiles", "show", profile, *sets, "--format", "json"],
        ["compose", "-p", profile, *sets],
        ["compose", "-p", profile, *sets, "-o", str(out_file)],
        ["up", "-p", profile, *sets, "--dry-run"],
        ["up", "-p", profile, *sets, "--dry-run", "--format", "json"],
        ["serve", "-p", profile, *sets, "--print"],
    ]


def test_secret_flags_cover_the_catalog():
    """Every flag of SGLang 0.5.19's parser whose name says it carries a secret is listed."""
    from escha_deploy.sglang.flagcheck import catalog_path

    cat = json.loads(catalog_path().read_text())
    secretish = re.compile(r"api-key|password|passwd|secret|credential|access-key|auth-token|hf-token")
    found = {f for a in cat["actions"] for f in a.get("flags", []) if secretish.search(f)}
    assert found == set(SECRET_FLAGS), found ^ set(SECRET_FLAGS)


@pytest.mark.parametrize("args", [
    ["--api-key", KEY], [f"--api-key={KEY}"], ["--api-k", KEY], [f"--api={KEY}"],
    ["--admin-api-key", KEY], ["--admin-api", KEY], ["--ssl-keyfile-password", KEY],
    ["--otlp-traces-endpoint", f"http://user:{KEY}@collector:4317"],
    ["--hicache-storage-backend-extra-config", json.dumps({"nested": {"access_key": KEY}})],
    [f"--api-key {KEY}"], ["\u2013api-key", KEY], [f"\u2014api-key={KEY}"], ["\u2013-api-key", KEY],
    ["--apikey", KEY], ["--api_key", KEY], ["--API-KEY", KEY], ["--api-ky", KEY], ["--admin_api_key", KEY],
    ["--otlp-traces-endpoint", f"http://127.0.0.1:4317/v1?token={KEY}"],
    ["--otlp-traces-endpoint", f"http://{KEY}@127.0.0.1:4317"],
    ["--load-publish-endpoint", f"tcp://127.0.0.1:5557?api_key={KEY}"],
])
def test_every_spelling_is_refused_without_echoing_the_key(args):
    problems = extra_args_problems(["--enable-metrics", *args])
    assert len(problems) == 1 and problems[0].startswith(("item 1: ", "item 2: "))
    assert KEY not in problems[0]


def test_no_catalog_flag_is_within_the_edits_of_a_secret_flag():
    """A misspelling within ``MAX_EDITS`` of a secret flag counts as it; every release's real
    flags are farther, so none of them is taken for one."""
    from escha_deploy.sglang.flagcheck import catalog_path
    from escha_deploy.sglang.releases import supported_releases
    from escha_deploy.utils.secretargs import secret_flag

    for release in supported_releases():
        cat = json.loads(catalog_path(release).read_text())
        flags = {f for a in cat["actions"] for f in a.get("flags", []) if f.startswith("--")}
        assert {f for f in flags if secret_flag(f) and f not in SECRET_FLAGS} == set(), release


def test_url_flags_of_the_catalog_are_checked():
    """Every catalog flag that takes a URL or address (dest ``*_url``/``*_endpoint``/``*_address``,
    or URL in its help) refuses credentials in its value."""
    from escha_deploy.sglang.flagcheck import catalog_path

    cat = json.loads(catalog_path().read_text())
    url_flags = sorted(f for a in cat["actions"] if re.search(r"(_url|_endpoint|_address)$", a.get("dest", ""))
                       or re.search(r"\bURL\b", a.get("help") or "") for f in a["flags"] if f.startswith("--"))
    assert "--otlp-traces-endpoint" in url_flags
    for flag in url_flags:
        for value in (f"http://127.0.0.1:1/?token={KEY}", f"http://u:{KEY}@127.0.0.1:1", f"tcp://{KEY}@127.0.0.1:1"):
            problems = extra_args_problems([flag, value])
            assert len(problems) == 1 and "a URL with a password in it" in problems[0] and KEY not in problems[0]
        assert extra_args_problems([flag, "http://127.0.0.1:4317/v1?service=escha"]) == []


def test_non_secret_flags_pass():
    assert extra_args_problems(["--ssl-keyfile", "/k.pem"]) == []
    assert extra_args_problems(["--hicache-storage-backend-extra-config", '{"prefetch_threshold": 256}',
                                "--otlp-traces-endpoint", "http://collector:4317"]) == []
    assert redact_argv(["--api-key", KEY, f"--admin-api-key={KEY}", "--port", "1"]) == \
        ["--api-key", "***", "--admin-api-key=***", "--port", "1"]
    assert redact_argv([f"--api-key {KEY}", "--apikey", KEY]) == ["--api-key=***", "--apikey", "***"]


def test_extra_args_route_is_refused_by_every_command(tmp_path):
    prof = tmp_path / "leaky.yaml"
    prof.write_text(f"extends: {P}\nruntime:\n  extra_args: [--enable-metrics, --api-key, {KEY}]\n")
    routes = {
        "profile file": (str(prof), []),
        "--set": (P, ["--set", f"runtime.extra_args=[--api-key={KEY}]"]),
        "--set admin": (P, ["--set", f"runtime.extra_args=[--admin-api-key, {KEY}]"]),
    }
    tried = 0
    for route, (profile, sets) in routes.items():
        for cmd in printing_commands(profile, sets + BASE_SETS, tmp_path / "c.yaml"):
            r = run_main(*cmd, env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
            tried += 1
            assert r.code == 2, (route, cmd, r.text)
            assert KEY not in r.text, (route, cmd)
            assert "runtime.extra_args: item" in r.err and "api-key" in r.err
            if "admin" not in route:
                assert "container.api_key_file" in r.err
        assert not (tmp_path / "c.yaml").exists()
    v = run_main("profiles", "validate", str(prof))
    assert v.code == 2 and KEY not in v.text and f"{prof}:3: runtime.extra_args: item 1: --api-key" in v.err
    assert tried == 27


def test_documented_route_prints_no_key(tmp_path, key_file):
    sets = ["--set", f"container.api_key_file={key_file}", *BASE_SETS]
    out_file = tmp_path / "compose.yaml"
    env = {"XDG_CACHE_HOME": str(tmp_path / "xdg"), "ESCHA_SERVE_MODE": ""}
    for cmd in printing_commands(P, sets, out_file):
        r = run_main(*cmd, env=env)
        if "--dry-run" in cmd and r.code == 3:
            # up's preflight reads this host's daemon: the stand-in image may be absent, or no
            # daemon answer; the key file itself must not be what is refused
            errors = [ln for ln in r.err.splitlines() if ln.startswith("error: ")]
            assert errors and all(e.startswith(("error: container.image: escha-standin:test is not present",
                                                "error: docker: daemon not reachable")) for e in errors), r.text
            assert "# server argv" in r.out or r.out.lstrip().startswith("{"), r.text  # it still printed the run
        else:
            assert r.code == 0, (cmd, r.text)
        assert KEY not in r.text, cmd
    compose = out_file.read_text()
    assert KEY not in compose and str(key_file) in compose  # the file's path, mounted as a secret


@pytest.mark.docker
def test_started_container_shows_no_key(docker_client, standin_image, tmp_path, key_file, no_leaks):
    """docker inspect (everything the daemon keeps), the LaunchSpec file the container runs
    with, the log, status and logs output."""
    image = standin_image("escha-standin:ok")
    leaky = run_cli("up", "--profile", P, "--set", f"container.image={image}", "--detach",
                    "--set", f"runtime.extra_args=[--api-key, {KEY}]")
    assert leaky.returncode == 2 and KEY not in leaky.stdout + leaky.stderr
    assert not docker_client.containers.list(all=True, filters={"label": STANDIN_LABEL})
    r = run_cli("up", "--profile", P, "--set", f"container.image={image}", "--detach",
                "--set", f"container.api_key_file={key_file}")
    try:
        assert r.returncode == 0, r.stderr
        c = docker_client.containers.get(STANDIN_CONTAINER)
        inspect = json.dumps(c.attrs)
        assert KEY not in inspect and KEY not in json.dumps(c.image.attrs)
        assert str(key_file) in inspect  # mounted by path, read-only
        # the LaunchSpec document up wrote and the container runs with serve --spec
        from escha_deploy.pipeline.spec import SPEC_TARGET

        spec_src = next(m["Source"] for m in c.attrs["Mounts"] if m["Destination"] == SPEC_TARGET)
        spec_text = Path(spec_src).read_text()
        spec_doc = json.loads(spec_text)
        assert spec_doc["api_key_file"] == "/run/secrets/escha_api_key"  # a path, read at serve time
        assert KEY not in spec_text
        log = c.logs().decode(errors="replace")
        shown = [r.stdout + r.stderr, log]
        for cmd in (["status", "--profile", P, "--format", "json"], ["logs", "--profile", P]):
            s = run_cli(*cmd)
            assert s.returncode == 0, s.stderr
            shown.append(s.stdout + s.stderr)
        assert all(KEY not in s for s in shown)
    finally:
        assert run_cli("down", "--profile", P).returncode == 0


def _process_table() -> str:
    """``ps`` as a user sees it, plus every process's full command line from /proc."""
    ps = subprocess.run(["ps", "-eo", "pid,args", "--cols", "100000"], capture_output=True, text=True).stdout
    lines = [ps]
    for d in Path("/proc").iterdir():
        if d.name.isdigit():
            try:
                lines.append((d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace"))
            except OSError:
                pass
    return "\n".join(lines)


def test_native_serve_keeps_the_key_off_every_command_line(tmp_path, key_file):
    """While a native ``serve`` runs (its child a STAND-IN for ``sglang.launch_server`` that
    reads the key from ``--config`` as SGLang does), no process's command line holds the key;
    the private config file is 0600 while it exists and gone after."""
    fake = tmp_path / "standin_sglang.py"
    fake.write_text(STANDIN_SGLANG)
    fake.chmod(0o755)
    env = dict(os.environ, ESCHA_SGLANG_PYTHON=str(fake), ESCHA_SKIP_GPU_PREFLIGHT="1",
               STANDIN_MODE="serve", XDG_CACHE_HOME=str(tmp_path / "xdg"))
    env.pop("ESCHA_SERVE_MODE", None)
    cmd = [sys.executable, "-m", "escha_deploy.cli.main", "serve", "--profile", P, *BASE_SETS,
           "--set", f"container.api_key_file={key_file}"]
    p = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen: list[str] = []
    try:
        assert p.stdout is not None
        deadline = time.monotonic() + 60
        for line in p.stdout:
            seen.append(line)
            if line.strip() == "ready" or time.monotonic() > deadline:
                break
        assert seen and seen[-1].strip() == "ready", "".join(seen)
        table = _process_table()
        assert "standin_sglang.py" in table and "--config" in table  # the child is running
        assert KEY not in table
        cfg = Path(next(ln for ln in seen if ln.startswith("config-file=")).split("=", 1)[1].strip())
        assert cfg.exists() and (cfg.stat().st_mode & 0o777) == 0o600
        assert "'api_key': '***'" in "".join(seen)  # the child got it; the output masks it
    finally:
        p.send_signal(signal.SIGTERM)
        rest = p.communicate(timeout=30)[0]
    assert KEY not in "".join(seen) + rest
    assert not cfg.exists()


def test_bench_and_canary_refuse_a_key_on_their_command_line(tmp_path, key_file):
    """`bench`/`canary --api-key KEY` would put the key in every `ps`; refused, not echoed.
    The file and the environment routes reach the request (here: an unreachable server)."""
    for verb in ("bench", "canary"):
        for args in (["--api-key", KEY], [f"--api-key={KEY}"]):
            r = run_main(verb, "-e", "http://127.0.0.1:9", *args, env={"ESCHA_API_KEY": ""})
            assert r.code == 2 and KEY not in r.text and "--api-key-file" in r.err, r.text
        for args, env in (([f"--api-key-file={key_file}"], {"ESCHA_API_KEY": ""}), ([], {"ESCHA_API_KEY": KEY})):
            r = run_main(verb, "-e", "http://127.0.0.1:9", *args, env=env)
            assert r.code == 3 and "cannot connect" in r.err and KEY not in r.text, r.text


def test_fleet_outputs_and_router_config_show_no_key(tmp_path, key_file):
    """The fleet's router key and the boxes' keys: `fleet plan`, the compose file per box and
    the Kubernetes manifests (the router's configuration) carry paths and Secret references,
    never the key; a box whose `set:` plants it in extra_args is refused. The running router's
    docker inspect, logs and ps are checked by tests/fleet/test_smg_container.py."""
    import yaml

    router_key = tmp_path / "router.key"
    router_key.write_text(KEY + "\n")
    box_set = ["container.expose=true", f"container.api_key_file={key_file}"]
    doc = {"name": "lab",
           "boxes": [{"name": f"r{i}", "address": f"10.0.0.{i}", "profile": "rtx5060ti-tp2-fp8", "host_ram": "64GiB",
                      "platform": "linux", "set": box_set} for i in (1, 2)],
           "groups": [{"name": "chat", "boxes": ["r1", "r2"]}],
           "router": {"box": "r2", "api_key_file": "router.key", "expose": True}}
    fleet = tmp_path / "fleet.yaml"
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    outs = []
    for cmd in (["fleet", "plan", str(fleet)], ["fleet", "plan", str(fleet), "--format", "json"],
                ["fleet", "compose", str(fleet), "--out", str(tmp_path / "compose")],
                ["fleet", "render", "k8s", str(fleet), "--out", str(tmp_path / "k8s")]):
        r = run_main(*cmd, env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
        assert r.code == 0, (cmd, r.text)
        outs.append(r.text)
    written = sorted(p for d in ("compose", "k8s") for p in (tmp_path / d).rglob("*") if p.is_file())
    assert len(written) >= 3, written
    assert all(KEY not in s for s in outs)
    assert all(KEY not in p.read_text() for p in written), [p for p in written if KEY in p.read_text()]
    doc["boxes"][0]["set"] = [f"runtime.extra_args=[--api-key, {KEY}]"]
    fleet.write_text(yaml.safe_dump(doc, sort_keys=False))
    r = run_main("fleet", "plan", str(fleet), env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
    assert r.code == 2 and KEY not in r.text and "container.api_key_file" in r.err, r.text


def test_diagnose_masks_a_key_in_any_log(tmp_path):
    """`diagnose FILE` reads logs from anywhere (a server started by hand logs its key in
    server_args=); the evidence it prints is masked."""
    log = tmp_path / "server.log"
    log.write_text(f"[2026-11-29 16:20:00] server_args={{'api_key': '{KEY}', 'tp_size': 2}}\n"
                   "ValueError: Not enough host memory available. Requesting 2.58 GB but only have 1.12 GB free. "
                   f"Please reduce the size of the hierarchical cache. --api-key {KEY}\n")
    for fmt in ("table", "json"):
        r = run_main("diagnose", str(log), "--format", fmt)
        assert r.code == 0 and "host-memory-check" in r.out and KEY not in r.text, r.text


# --------------------------------------------------------------------------- unplanted routes

@pytest.mark.parametrize("content,offset,name", [
    (KEY + "\r", len(KEY), "CR"), (KEY + "\n\n", len(KEY), "LF"), (KEY[:4] + "\x00" + KEY[4:] + "\n", 4, "NUL"),
    ("\ufeff" + KEY + "\r\r\n", 3 + len(KEY), "CR"), ("  " + KEY + "\x1b\n", 2 + len(KEY), "control byte 0x1b"),
])
def test_control_bytes_in_the_key_file_are_refused_by_offset(tmp_path, content, offset, name):
    f = tmp_path / "api_key"
    f.write_bytes(content.encode())
    for cmd in (["canary", "-e", "http://127.0.0.1:9", "--api-key-file", str(f)],
                ["serve", "-p", P, *BASE_SETS, "--set", f"container.api_key_file={f}", "--print"]):
        r = run_main(*cmd, env={"ESCHA_API_KEY": "", "XDG_CACHE_HOME": str(tmp_path / "xdg")})
        assert r.code == 2, (cmd, r.text)
        assert f"{f}: the key holds a character that cannot go in an HTTP header (byte {offset}: a {name})" in r.err, r.err
        assert KEY not in r.text and KEY[4:] not in r.text


@pytest.mark.parametrize("content", [KEY, KEY + "\n", KEY + "\r\n", "\ufeff" + KEY + "\r\n", f"  {KEY} \n"])
def test_one_trailing_newline_is_the_files_not_the_keys(tmp_path, content):
    from escha_deploy.launch.prepare import read_secret

    f = tmp_path / "api_key"
    f.write_bytes(content.encode())
    assert read_secret(str(f), "container.api_key_file") == KEY


@pytest.mark.parametrize("value,offset,name", [(KEY + "\r", len(KEY), "CR"), (KEY + "\n", len(KEY), "LF"),
                                               ("a\x7f" + KEY, 1, "control byte 0x7f")])
def test_control_bytes_in_the_environment_key_are_refused(value, offset, name):
    for verb in ("bench", "canary"):
        r = run_main(verb, "-e", "http://127.0.0.1:9", env={"ESCHA_API_KEY": value})
        assert r.code == 2 and f"ESCHA_API_KEY: the key holds a character that cannot go in an HTTP header (byte {offset}: a {name})" in r.err, r.text
        assert KEY not in r.text and "LocalProtocolError" not in r.text


@pytest.mark.docker  # `up --dry-run` asks the daemon for the image (exit 3 without one)
def test_the_key_typed_where_its_path_goes_is_never_printed(tmp_path):
    """``container.api_key_file=KEY``: neither an existing file nor an absolute path; refused by
    every command that would print or write the path (plan, dry run, compose, serve --print,
    profiles show)."""
    sets = ["--set", f"container.api_key_file={KEY}", *BASE_SETS]
    out_file = tmp_path / "c.yaml"
    for cmd in [*printing_commands(P, sets, out_file), ["profiles", "show", P, *sets, "--keys"]]:
        r = run_main(*cmd, env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
        assert r.code == 2, (cmd, r.text)
        assert "container.api_key_file: the path given (27 characters" in r.err, (cmd, r.err)
        assert KEY not in r.text and KEY[3:] not in r.text, cmd
    assert not out_file.exists()


@pytest.mark.parametrize("url", [f"http://127.0.0.1:9/?api_key={KEY}", f"http://127.0.0.1:9?token={KEY}",
                                 f"http://127.0.0.1:9/#{KEY}", f"http://{KEY}@127.0.0.1:9", f"http://127.0.0.1:9/ ?k={KEY}"])
def test_endpoint_urls_carrying_a_key_are_refused_unprinted(url):
    for verb in ("bench", "canary"):
        r = run_main(verb, "-e", url, env={"ESCHA_API_KEY": ""})
        assert r.code == 2, r.text
        assert KEY not in r.text and KEY[4:] not in r.text, r.text


def test_diagnose_masks_every_spelling_and_strips_terminal_escapes(tmp_path):
    """A log from anywhere: the key as SGLang's config YAML prints it, ``api_key=``, an
    environment dump, ``Authorization: Basic``, a URL's userinfo and query; an OSC escape (it
    retitles a terminal, or worse) in an evidence line never reaches the output."""
    osc = "\x1b]0;owned\x07\x1b]8;;http://evil/\x07"
    log = tmp_path / "server.log"
    log.write_text("\n".join([
        f"[2026-11-29 16:20:00] api-key: {KEY}", f"SGLANG_API_KEY={KEY}", f"kwargs api_key={KEY}, tp=2",
        f"Authorization: Basic {KEY}", f"GET http://user:{KEY}@127.0.0.1:9/v1?api_key={KEY}&x=1",
        "ValueError: Not enough host memory available. Requesting 2.58 GB but only have 1.12 GB free. "
        f"Please reduce the size of the hierarchical cache.{osc} api_key={KEY}", ""]))
    for fmt in ("table", "json"):
        r = run_main("diagnose", str(log), "--format", fmt)
        assert r.code == 0 and "host-memory-check" in r.out, r.text
        assert KEY not in r.text and "\x1b" not in r.text and "\x07" not in r.text, r.text
    from escha_deploy.utils.redact import Redactor, printable

    red = Redactor()
    assert [red(ln) for ln in log.read_text().splitlines()[:5]] == [
        "[2026-11-29 16:20:00] api-key: ***", "SGLANG_API_KEY=***", "kwargs api_key=***, tp=2",
        "Authorization: Basic ***", "GET http://***@127.0.0.1:9/v1?api_key=***&x=1"]
    # 0x9B is the one-byte CSI: "d" after it is its final byte (VPA, ECMA-48 8.3.158), dropped with it
    assert printable(f"a{osc}b\x1b[31mc\x9bd\te") == "abc" + "\te"


@pytest.mark.docker
def test_logs_masks_a_key_the_server_logged_bare(docker_client, standin_image, tmp_path, key_file, no_leaks):
    """The server logs the mounted key bare (no pattern can know it): `logs` reads the
    container's key file and masks the value itself, as native `serve` does; `logs
    --diagnose` too. The raw docker log holds it (the test's proof that it was logged)."""
    image = standin_image("escha-standin:logkey", mode="log_key")
    name = f"logkey-{os.getpid()}"
    sets = ["--set", f"name={name}", "--set", f"container.image={image}", "--set", f"container.api_key_file={key_file}"]
    r = run_cli("up", "--profile", P, *sets, "--detach")
    try:
        assert r.returncode == 0, r.stderr
        assert KEY not in r.stdout + r.stderr
        c = docker_client.containers.get(f"escha-{name}")
        assert KEY in c.logs().decode()  # the stand-in really logged it
        for cmd in (["logs", "--profile", name], ["logs", "--profile", name, "--diagnose"]):
            s = run_cli(*cmd)
            assert s.returncode in (0, 5), s.stderr
            assert KEY not in s.stdout + s.stderr, cmd
        assert "stand-in: serving with key ***" in run_cli("logs", "--profile", name).stdout
    finally:
        assert run_cli("down", "--profile", name).returncode == 0


@pytest.mark.parametrize("url", [f"http://127.0.0.1:4317/{KEY}", f"http://127.0.0.1:4317/#{KEY}",
                                 f"http://127.0.0.1:4317/v1/traces#k={KEY}", f"grpc://127.0.0.1:4317/v1/{KEY}/traces",
                                 "http://127.0.0.1:4317/a8F3kQ9zL2mN7pR4tV6wX1yB"])
def test_a_url_flag_with_a_key_in_its_path_or_fragment_is_refused_unprinted(tmp_path, url):
    """``--otlp-traces-endpoint`` with the key as a path segment or the fragment: known by its
    shape (an issuer's prefix, or a generated run), since no name says it is one; every printing
    command (``profiles show`` too) refuses it, naming the item, never the key."""
    sets = ["--set", f'runtime.extra_args=[--otlp-traces-endpoint, "{url}"]', *BASE_SETS]
    secret = url.rsplit("/", 1)[-1].split("=")[-1].lstrip("#") if KEY not in url else KEY
    for cmd in printing_commands(P, sets, tmp_path / "c.yaml"):
        r = run_main(*cmd, env={"XDG_CACHE_HOME": str(tmp_path / "xdg")})
        assert r.code == 2, (cmd, r.text)
        assert "runtime.extra_args: item 1: a URL with a password in it (a key-shaped part" in r.err, (cmd, r.err)
        assert secret not in r.text and secret[4:] not in r.text, cmd
    assert not (tmp_path / "c.yaml").exists()
    assert extra_args_problems(["--otlp-traces-endpoint", "http://127.0.0.1:4317/v1/traces#top"]) == []


def test_diagnose_masks_keys_by_their_shape_in_every_evidence_line(tmp_path):
    """The key where no name says it is one: ``token=KEY``, a line that is only the key, a
    cookie's value; on the evidence line itself and on the lines around it."""
    log = tmp_path / "server.log"
    log.write_text("\n".join([
        KEY, f"GET /v1/models token={KEY}", f"Cookie: session={KEY}",
        "ValueError: Not enough host memory available. Requesting 2.58 GB but only have 1.12 GB free. "
        f"Please reduce the size of the hierarchical cache. token={KEY} Cookie: session={KEY}",
        KEY, f"Set-Cookie: sid={KEY}; Path=/", ""]))
    for fmt in ("table", "json"):
        r = run_main("diagnose", str(log), "--format", fmt)
        assert r.code == 0 and "host-memory-check" in r.out, r.text
        assert KEY not in r.text and KEY[3:] not in r.text, r.text
