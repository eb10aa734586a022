"""The bad-input corpus (cases/*.yaml, one file per area, see README.md): every case ends with
its exit code (2, 3 or 5, or 0 with the warning it names or a result that must not show a secret),
one ``error:`` line per problem with the expected fragment on one of them, no traceback, no
secret it names in any output, within 10 s and 1 GiB of address space."""

from __future__ import annotations

import ast
import functools
import os
import re
import resource
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from canned_server import CannedServer
from inproc import CLEAN_LINE, OverBudget, run_bounded

HERE = Path(__file__).resolve().parent
#: Every case of every area file, each with the file it came from (``_file``).
CASES = [{**c, "_file": f.name} for f in sorted((HERE / "cases").glob("*.yaml"))
         for c in yaml.safe_load(f.read_text())["cases"]]
FIELDS = {"id", "argv", "commands", "profile", "profile_bytes", "profile_pad", "files", "files_bytes", "fifos",
          "symlinks", "modes", "env", "stdin", "unprivileged", "exit", "fragment", "warning", "secret", "problems",
          "isolate", "server", "_file"}
#: root may read and write anything; ``unprivileged`` cases run without the capabilities that
#: let it (util-linux setpriv), as an ordinary user would.
DROP_CAPS = ("setpriv", "--inh-caps=-dac_override,-dac_read_search",
             "--bounding-set=-dac_override,-dac_read_search")

#: Every command that reads a profile, fed the same file.
PROFILE_COMMANDS: dict[str, list[str]] = {
    "plan": ["plan", "-p", "{p}", "--host-ram", "64GiB", "--linux"],
    "profiles-show": ["profiles", "show", "{p}"],
    "profiles-validate": ["profiles", "validate", "{p}"],
    "compose": ["compose", "-p", "{p}"],
    "up-dry-run": ["up", "-p", "{p}", "--dry-run"],
    "serve-print": ["serve", "-p", "{p}", "--print"],
    "doctor": ["doctor", "-p", "{p}", "--no-probes", "--format", "json"],
}
TIME_LIMIT_S = 10
MEMORY_LIMIT = 1 << 30
_REPEAT = re.compile(r"\$repeat\((\d+), (.*?)\)\$")
#: ``$byte(ff)$``: the byte 0xff of a command line that is not UTF-8, as Python hands it over
#: (PEP 383 surrogateescape: U+DCFF).
_BYTE = re.compile(r"\$byte\(([0-9a-f]{2})\)\$")


def _expand(text: str, d: Path, p: Path, server: CannedServer | None = None) -> str:
    text = _REPEAT.sub(lambda m: m.group(2) * int(m.group(1)), text)
    text = _BYTE.sub(lambda m: chr(0xDC00 + int(m.group(1), 16)), text)
    if server is not None:
        text = text.replace("{url}", server.url).replace("{port}", str(server.port))
    return (text.replace("{p}", str(p)).replace("{d}", str(d)).replace("{uid}", str(os.getuid()))
            .replace("{pid}", str(os.getpid())))


def runs() -> list:
    out = []
    for case in CASES:
        if case.get("commands") == "profile":
            for name, argv in PROFILE_COMMANDS.items():
                out.append(pytest.param(case, argv, id=f"{case['id']}/{name}"))
        else:
            out.append(pytest.param(case, case["argv"], id=case["id"]))
    return out


def test_corpus_is_large_and_well_formed():
    ids = [c["id"] for c in CASES]
    assert len(ids) == len(set(ids)) and len(ids) >= 350
    for c in CASES:
        # exit 0 only for an input that is accepted with the warning it names, or for a result on
        # stdout (problems: 0) that must not show the secret the input carries; 5 for a check
        # that an input leaves unproven (a server's answer that cannot be read)
        # that an input leaves unproven (a server's answer that cannot be read); 4 only for a
        # server's answer that breaks a request already sent (`ask`: exit 4, "started but failed")
        assert c["exit"] in (2, 3, 5) or (c["exit"] == 0 and "warning" in c) or (
            c["exit"] == 0 and "secret" in c and c.get("problems") == 0) or (c["exit"] == 4 and "server" in c), c["id"]
        assert ("argv" in c) != (c.get("commands") == "profile"), c["id"]
        assert set(c) <= FIELDS, (c["id"], set(c) - FIELDS)
        assert "fragment" in c or "warning" in c, c["id"]
    commands = {c["argv"][0] for c in CASES if "argv" in c} | {a[0] for a in PROFILE_COMMANDS.values()}
    # every command that takes input (all but `profiles list` and `runtime apply`, which
    # change the installed runtime)
    assert commands >= {"plan", "profiles", "compose", "up", "serve", "doctor", "status", "down", "logs",
                        "bench", "canary", "runtime", "build", "fleet"}, commands


def _limit_subprocess() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_LIMIT, MEMORY_LIMIT))


def expand(text: str, d: Path, p: Path) -> str:
    return _expand(text, d, p)


def run_case(case: dict, argv: list[str], tmp_path: Path) -> tuple[int, str, str, float]:
    if "server" not in case:
        return _run_case(case, argv, tmp_path, None)
    with CannedServer(case["server"], lambda text: expand(text, tmp_path, tmp_path / "profile.yaml")) as server:
        return _run_case(case, argv, tmp_path, server)


def _run_case(case: dict, argv: list[str], tmp_path: Path, server: CannedServer | None) -> tuple[int, str, str, float]:
    d = tmp_path
    expand = functools.partial(_expand, server=server)
    p = d / "profile.yaml"
    for name, text in (case.get("files") or {}).items():
        name = expand(name, d, p)
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_text(expand(text, d, p))
    for name, literal in (case.get("files_bytes") or {}).items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).write_bytes(ast.literal_eval(literal))
    for name in case.get("fifos") or ():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        os.mkfifo(d / name)
    for name, target in (case.get("symlinks") or {}).items():
        (d / name).parent.mkdir(parents=True, exist_ok=True)
        (d / name).symlink_to(expand(target, d, p))
    if "profile_bytes" in case:
        p.write_bytes(ast.literal_eval(case["profile_bytes"]))
    elif "profile" in case:
        text = expand(case["profile"], d, p)
        if case.get("profile_pad"):
            text += "# " + "x" * case["profile_pad"] + "\n"
        p.write_text(text)
    for name, mode in (case.get("modes") or {}).items():
        os.chmod(d / expand(name, d, p), mode)
    args = [expand(a, d, p) for a in argv]
    env = {"XDG_CACHE_HOME": str(d / "xdg"), "COLUMNS": "200", "ESCHA_SERVE_MODE": "",
           "ESCHA_API_KEY": "", "NO_COLOR": "1"}
    env.update({k: expand(str(v), d, p) for k, v in (case.get("env") or {}).items()})
    t0 = time.monotonic()
    if case.get("isolate") or case.get("unprivileged") or "stdin" in case:
        prefix = DROP_CAPS if case.get("unprivileged") and os.geteuid() == 0 else ()
        try:
            r = subprocess.run([*prefix, sys.executable, "-m", "escha_deploy.cli.main", *args], capture_output=True,
                               text=True, timeout=TIME_LIMIT_S, preexec_fn=_limit_subprocess,
                               env={**os.environ, **env}, cwd=d, input=case.get("stdin"))
        except subprocess.TimeoutExpired:
            pytest.fail(f"killed after {TIME_LIMIT_S} s")
        return r.returncode, r.stdout, r.stderr, time.monotonic() - t0
    # in-process: a wall-clock alarm, and at most 1 GiB more address space than this process has
    try:
        r, took = run_bounded(*args, env=env, cwd=str(d), time_s=TIME_LIMIT_S, memory=MEMORY_LIMIT)
    except OverBudget as exc:
        pytest.fail(str(exc))
    return r.code, r.out, r.err, took


@pytest.mark.parametrize("case, argv", runs())
def test_bad_input_ends_cleanly(case, argv, tmp_path):
    try:
        code, out, err, took = run_case(case, argv, tmp_path)
    finally:
        for name in case.get("modes") or {}:
            os.chmod(tmp_path / name, 0o755)  # so that tmp_path can be removed
    shown = f"exit {code}\nstdout: {out[-500:]}\nstderr: {err[-1500:]}"
    assert "Traceback" not in out + err, shown
    assert code == case["exit"], shown
    assert took <= TIME_LIMIT_S, f"{took:.1f} s"
    lines = [ln for ln in err.splitlines() if ln.strip()]
    bad = [ln for ln in lines if not CLEAN_LINE.match(ln)]
    assert not bad, shown
    errors = [ln for ln in lines if ln.startswith("error: ")]
    if "secret" in case:
        assert case["secret"] not in out + err, shown
    if "warning" in case:
        warnings = [ln for ln in (out + err).splitlines() if "warning" in ln]
        assert any(case["warning"] in ln for ln in warnings), shown
    if "fragment" not in case:
        assert not errors, shown
        return
    assert len(errors) == case.get("problems", 1), shown
    where = errors if errors else (out + err).splitlines()
    assert any(case["fragment"] in ln for ln in where), shown
    assert len(err) < 20_000, "a message is not a dump"
