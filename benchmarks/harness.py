"""The benchmark harness behind ``benchmarks/run``: each escha-deploy command timed against its
reference, in interleaved pairs, with hyperfine doing every timing.

Pairs (the references are fixed; docs/performance.md explains each):

- ``plan``: ``escha-deploy plan --profile rtx5060ti-tp2 --host-ram 16GiB --wsl2 --format json``
  against ``python3 -c 'import typer, pydantic, yaml, psutil, rich'`` in the same venv.
- ``wheel``: the same ``plan`` from a wheel installed into its own venv (pip compiles the
  bytecode at install, as users get it), against the import line in that venv.
- ``help``: ``escha-deploy --help`` against the import line.
- ``verify``: ``escha-deploy runtime verify`` of an applied sglang 0.5.19 tree against
  ``sha256sum -c`` over a list of the same files and hashes verify checks.
- ``up``: ``up --detach`` of the stand-in server image (tests/launch/standin/) to ready against
  ``docker run -d`` of the same image and port plus a 0.1 s poll (benchmarks/ref_up.sh); the
  containers are removed between runs, outside the timing, under the team's Docker lock.
- ``plan-before`` (with ``--before REF``): the same ``plan`` from commit REF's escha_deploy/
  and profiles/ (``git archive``, bytecode compiled, put first on ``PYTHONPATH``) against the
  import line, in the same rounds as ``plan``: a change measured before and after side by side.
- ``floors`` (no goal; what the libraries cost before escha-deploy runs a line): the import line
  plus one pydantic model built and validated, and the import line plus ``import docker``, each
  against the import line; and the import line plus the reference profile loaded and validated
  (the first step of every ``plan``, the least a ``plan`` that validates with pydantic costs).

Each round runs every pair once, the two commands back to back in alternating order (one
``hyperfine -N --runs 1`` call each), so slow spells of a shared machine hit both sides. The
summary gives min/median/max of each command and the median of the per-round ratios.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import fcntl
import json
import os
import platform
import shlex
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
import zipfile
from dataclasses import dataclass, field
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
DOC = ROOT / "docs" / "performance.md"
MARKER = "<!-- benchmarks/run adds each run below this line, newest first -->"
IMPORT_LINE = "import typer, pydantic, yaml, psutil, rich"
PLAN_ARGS = ["plan", "--profile", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2", "--format", "json"]
WHEEL_NAME = "sglang-0.5.19-cp311-cp311-manylinux_2_34_x86_64.whl"
STANDIN_PROFILE = ROOT / "tests" / "launch" / "standin" / "profile.yaml"
STANDIN_TAG = "escha-standin:bench"
STANDIN_PORT = 30123  # the stand-in profile's container.port
REF_CONTAINER = "escha-bench-ref"
DOCKER_LOCK = os.environ.get("ESCHA_DOCKER_LOCK", "/tmp/escha-docker.lock")


def log(msg: str) -> None:
    print(f"bench: {msg}", file=sys.stderr, flush=True)


@dataclass
class Pair:
    """One escha-deploy command and its reference, with the goal for their ratio."""

    key: str
    what: str
    cmd: list[str]
    ref_what: str
    ref: list[str]
    goal_ratio: float | None  # None: a floor, reported without a goal
    goal_abs_s: float | None = None
    prepare: list[str] | None = None  # run before every timed run, outside the timing
    env: dict[str, str] | None = None
    a: list[float] = field(default_factory=list)
    b: list[float] = field(default_factory=list)

    def round(self, i: int) -> None:
        first_ref = i % 2 == 1
        cmds = [self.ref, self.cmd] if first_ref else [self.cmd, self.ref]
        times = hyperfine(cmds, self.prepare, self.env)
        t_cmd, t_ref = (times[1], times[0]) if first_ref else (times[0], times[1])
        self.a.append(t_cmd)
        self.b.append(t_ref)

    def summary(self) -> dict:
        ratios = [x / y for x, y in zip(self.a, self.b)]
        med_a, ratio = statistics.median(self.a), statistics.median(ratios)
        if self.goal_ratio is None:
            met, goal = None, "none (a floor)"
        else:
            met = ratio <= self.goal_ratio and (self.goal_abs_s is None or med_a <= self.goal_abs_s)
            goal = f"<= {self.goal_ratio:g}x" + (f", <= {self.goal_abs_s:g} s" if self.goal_abs_s else "")
        return {
            "key": self.key, "what": self.what, "ref": self.ref_what, "n": len(self.a),
            "cmd_s": [min(self.a), med_a, max(self.a)],
            "ref_s": [min(self.b), statistics.median(self.b), max(self.b)],
            "ratio": ratio, "ratio_range": [min(ratios), max(ratios)],
            "goal": goal, "met": met, "times": {"cmd": self.a, "ref": self.b},
        }


#: What a timing is: ``wall`` (hyperfine's wall clock, the default) or ``cpu`` (the run's user
#: plus system CPU seconds, as hyperfine reports them: on a machine others load, a process
#: waiting for a core adds wall time, not CPU time). ``--cpu`` sets it.
MEASURE = "wall"


def hyperfine(cmds: list[list[str]], prepare: list[str] | None, env: dict | None) -> list[float]:
    """Seconds of one run of each command (``MEASURE``: wall clock, or user + system CPU),
    timed by hyperfine without a shell."""
    with tempfile.TemporaryDirectory() as d:
        out = Path(d) / "h.json"
        argv = ["hyperfine", "-N", "--runs", "1", "--style", "none", "--export-json", str(out)]
        if prepare:
            argv += ["--prepare", shlex.join(prepare)]
        argv += [shlex.join(c) for c in cmds]
        r = subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True,
                           env={**os.environ, **(env or {})})
        if r.returncode != 0:
            sys.exit(f"bench: hyperfine failed for {[shlex.join(c) for c in cmds]}:\n{r.stderr[-2000:]}")
        results = json.loads(out.read_text())["results"]
        if MEASURE == "cpu":
            return [res["user"] + res["system"] for res in results]
        return [res["times"][0] for res in results]


# --- set-up of each pair ----------------------------------------------------------------------

def python_bin() -> Path:
    return Path(sys.executable).parent


def plan_pair() -> Pair:
    b = python_bin()
    return Pair("plan", "`plan --profile rtx5060ti-tp2 --host-ram 16GiB --wsl2 --format json` (editable)",
                [str(b / "escha-deploy"), *PLAN_ARGS],
                "`python3 -c '" + IMPORT_LINE + "'`", [str(b / "python3"), "-c", IMPORT_LINE],
                goal_ratio=1.5, goal_abs_s=0.25)


def plan_before_pair(ref: str, work: Path) -> Pair:
    """``plan`` as commit ``ref`` runs it: its escha_deploy/ and profiles/ unpacked into
    ``work`` (``git archive``), bytecode compiled as the checkout's is, and put first on
    ``PYTHONPATH`` (ahead of the venv's install), against the import line in the same venv."""
    work.mkdir(parents=True)
    arch = subprocess.run(["git", "-C", str(ROOT), "archive", ref, "escha_deploy", "profiles"],
                          check=True, capture_output=True).stdout
    subprocess.run(["tar", "-x", "-C", str(work)], input=arch, check=True)
    subprocess.run([sys.executable, "-m", "compileall", "-q", str(work / "escha_deploy")], check=True)
    commit = subprocess.run(["git", "-C", str(ROOT), "rev-parse", "--short", ref], check=True,
                            capture_output=True, text=True).stdout.strip()
    b = python_bin()
    return Pair("plan-before", f"the same `plan` at commit {commit} (`--before {ref}`)",
                [str(b / "escha-deploy"), *PLAN_ARGS],
                "same import line", [str(b / "python3"), "-c", IMPORT_LINE],
                goal_ratio=1.5, goal_abs_s=0.25, env={"PYTHONPATH": str(work)})


def help_pair() -> Pair:
    b = python_bin()
    return Pair("help", "`escha-deploy --help`", [str(b / "escha-deploy"), "--help"],
                "same import line", [str(b / "python3"), "-c", IMPORT_LINE], goal_ratio=1.0)


#: The import line, then the first pydantic model of a run: pydantic's model machinery
#: (``import pydantic`` loads only the package's lazy top), its plugin lookup, one schema build.
PYDANTIC_FLOOR = IMPORT_LINE + "\nfrom pydantic import BaseModel\nclass A(BaseModel):\n    x: int\nA(x=1)"
#: The import line, then the reference profile read and validated as every `plan` does first
#: (``profile.loading.load_profile``: YAML with positions, its base merged, 17 pydantic models
#: built and validated, the release's images read for the defaults): the least a `plan` that
#: keeps pydantic for the profile can cost, before it plans anything.
PROFILE_FLOOR = IMPORT_LINE + "\nfrom escha_deploy.profile.loading import load_profile\nload_profile('rtx5060ti-tp2')"


def floor_pairs() -> list[Pair]:
    """What the libraries cost before any escha-deploy code: every `plan` validates a profile
    with pydantic models, and every `up` talks to the daemon through docker-py."""
    py, ref = str(python_bin() / "python3"), [str(python_bin() / "python3"), "-c", IMPORT_LINE]
    return [
        Pair("floor-pydantic", "floor: the import line + one pydantic model built and validated",
             [py, "-c", PYDANTIC_FLOOR], "same import line", ref, goal_ratio=None),
        Pair("floor-profile", "floor: the import line + the reference profile loaded and validated "
             "(`profile.loading.load_profile`: what every `plan` does first)",
             [py, "-c", PROFILE_FLOOR], "same import line", ref, goal_ratio=None),
        Pair("floor-docker", "floor: the import line + `import docker` (docker-py, requests, urllib3)",
             [py, "-c", IMPORT_LINE + ", docker"], "same import line", ref, goal_ratio=None),
    ]


def wheel_pair(work: Path) -> Pair:
    """Build the checkout's wheel, install it (with its dependencies, bytecode compiled by pip)
    into a venv of its own, and time `plan` from there with PYTHONPATH cleared."""
    venv = ROOT / ".cache" / "bench-wheel-venv"
    dist = work / "dist"
    log("building the wheel and installing it into .cache/bench-wheel-venv")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(ROOT)],
                   check=True)
    whl = next(dist.glob("escha_deploy-*.whl"))
    if not (venv / "bin" / "python").exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    pip = [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "--disable-pip-version-check"]
    subprocess.run([*pip, str(whl)], check=True)
    subprocess.run([*pip, "--force-reinstall", "--no-deps", str(whl)], check=True)
    env = ["env", "-u", "PYTHONPATH"]
    return Pair("wheel", "same `plan`, wheel install with compiled bytecode",
                [*env, str(venv / "bin" / "escha-deploy"), *PLAN_ARGS],
                "import line in that venv", [*env, str(venv / "bin" / "python3"), "-c", IMPORT_LINE],
                goal_ratio=1.5, goal_abs_s=0.25)


def find_sglang_wheel() -> Path:
    env = os.environ.get("ESCHA_SGLANG_WHEEL")
    for p in ([Path(env)] if env else []) + [ROOT / ".cache" / "wheels" / WHEEL_NAME]:
        if p.is_file():
            return p
    sys.exit(f"bench: the verify pair needs {WHEEL_NAME} (ESCHA_SGLANG_WHEEL or .cache/wheels/; "
             ".ci/test downloads it)")


def verify_pair(work: Path) -> tuple[Pair, int]:
    """Unpack the real sglang wheel, `runtime apply` it, and write the sha256sum list of every
    file `runtime verify` hashes: the package's files and apply's saved clean copies."""
    sys.path.insert(0, str(ROOT))
    from escha_deploy.runtime import inventory as inv

    site = work / "site-packages"
    with zipfile.ZipFile(find_sglang_wheel()) as z:
        z.extractall(site)
    pkg, state = site / "sglang", work / "state"
    cli = str(python_bin() / "escha-deploy")
    subprocess.run([cli, "runtime", "apply", "--sglang-dir", str(pkg), "--state-dir", str(state)],
                   check=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    lines = [f"{sha}  {pkg / rel}" for rel, (_, sha) in sorted(inv.scan(pkg).items())]
    lines += [f"{sha}  {state / 'base-files' / rel}"
              for rel, (_, sha) in sorted(inv.scan(state / "base-files").items())]
    listing = work / "sha256sums.txt"
    listing.write_text("\n".join(lines) + "\n")
    return Pair("verify", "`runtime verify`",
                [cli, "runtime", "verify", "--sglang-dir", str(pkg), "--state-dir", str(state)],
                "`sha256sum -c` over the same files", ["sha256sum", "-c", "--quiet", str(listing)],
                goal_ratio=1.0), len(lines)


def up_pair(work: Path) -> tuple[Pair, float | None]:
    """Build the stand-in image (planned sizes of this host baked in, as the launch tests do)
    and refresh the saved doctor findings; returns the pair and doctor's time."""
    if subprocess.run(["docker", "info"], capture_output=True).returncode != 0:
        sys.exit("bench: the up pair needs a reachable Docker daemon (or leave it out: --only)")
    sys.path.insert(0, str(ROOT))
    from tests.launch.conftest import planned_sizes_for

    base = os.environ.get("ESCHA_TEST_BASE_IMAGE", "")
    if not base or subprocess.run(["docker", "image", "inspect", base], capture_output=True).returncode:
        base = "escha-test-base:bookworm"
        subprocess.run([str(ROOT / "tests" / "launch" / "base_image.sh"), base], check=True)
    ctx = work / "standin"
    ctx.mkdir()
    for f in ("server.py", "Dockerfile"):
        shutil.copy(STANDIN_PROFILE.parent / f, ctx / f)
    (ctx / "config.json").write_text(json.dumps({"mode": "ok", "startup_s": 0.0, "port": STANDIN_PORT,
                                                 "sizes": planned_sizes_for()}))
    log(f"building the stand-in image {STANDIN_TAG} on {base}")
    subprocess.run(["docker", "build", "-q", "--build-arg", f"BASE={base}", "-t", STANDIN_TAG, str(ctx)],
                   check=True, stdout=subprocess.DEVNULL)
    cli = str(python_bin() / "escha-deploy")
    t0 = time.monotonic()
    r = subprocess.run([cli, "doctor", "--fresh"], capture_output=True, text=True)
    doctor_s = time.monotonic() - t0
    if r.returncode not in (0, 5):
        log(f"doctor exited {r.returncode}: {r.stderr.strip()[-300:]}")
    reset = work / "up_reset.sh"
    reset.write_text(f"#!/bin/sh\n{shlex.quote(cli)} down --profile {shlex.quote(str(STANDIN_PROFILE))} "
                     f">/dev/null 2>&1\ndocker rm -f {REF_CONTAINER} >/dev/null 2>&1\nexit 0\n")
    reset.chmod(0o755)
    return Pair("up", "`up --detach` to ready (stand-in image)",
                [cli, "up", "--profile", str(STANDIN_PROFILE), "--set", f"container.image={STANDIN_TAG}",
                 "--detach"],
                "`docker run -d` + 0.1 s poll of /health and /generate",
                [str(ROOT / "benchmarks" / "ref_up.sh"), STANDIN_TAG, str(STANDIN_PORT), REF_CONTAINER],
                goal_ratio=1.2, prepare=[str(reset)],
                # this sandbox's Docker cannot raise memlock; the launch tests set the same switch
                env={"ESCHA_TEST_CLAMP_MEMLOCK": "1"}), doctor_s


# --- the run ----------------------------------------------------------------------------------

def machine() -> dict:
    def first(path: str, key: str) -> str:
        with contextlib.suppress(OSError):
            for line in Path(path).read_text().splitlines():
                if line.startswith(key):
                    return line.split(":", 1)[1].strip()
        return "?"

    def out(*cmd: str) -> str:
        with contextlib.suppress(OSError):
            r = subprocess.run(cmd, capture_output=True, text=True)
            lines = (r.stdout or r.stderr).strip().splitlines()
            return (lines[0] if lines else "") if r.returncode == 0 else "?"
        return "?"

    versions = {}
    for dist in ("escha-deploy", "typer", "pydantic", "pydantic-core", "rich", "PyYAML", "psutil",
                 "docker", "httpx"):
        with contextlib.suppress(metadata.PackageNotFoundError):
            versions[dist] = metadata.version(dist)
    dirty = out("git", "-C", str(ROOT), "status", "--porcelain", "--untracked-files=no")
    return {
        "date": dt.datetime.now(dt.timezone.utc).strftime("%Y-%m-%d %H:%M UTC"),
        "host": platform.node(), "kernel": platform.release(), "cpu": first("/proc/cpuinfo", "model name"),
        "cores": os.cpu_count(), "mem": first("/proc/meminfo", "MemTotal"),
        "load_start": os.getloadavg(), "python": platform.python_version(),
        "hyperfine": out("hyperfine", "--version"), "docker": out("docker", "version", "--format",
                                                                    "{{.Server.Version}}"),
        "sha256sum": out("sha256sum", "--version"),
        "commit": out("git", "-C", str(ROOT), "rev-parse", "--short", "HEAD") + (" (+ changes)" if dirty not in ("", "?") else ""),
        "versions": versions,
        "dont_write_bytecode": os.environ.get("PYTHONDONTWRITEBYTECODE", ""),
    }


def render(m: dict, results: list[dict], extra: list[str]) -> str:
    def rng(x):
        return f"{x[1]:.3f} s ({x[0]:.3f}-{x[2]:.3f})"

    rows = ["| what | escha-deploy: median (min-max) | reference | reference: median (min-max) "
            "| paired ratio: median (min-max) | goal | met |", "|---|---|---|---|---|---|---|"]
    for r in results:
        rows.append(f"| {r['what']} | {rng(r['cmd_s'])} | {r['ref']} | {rng(r['ref_s'])} | "
                    f"{r['ratio']:.2f}x ({r['ratio_range'][0]:.2f}-{r['ratio_range'][1]:.2f}) | "
                    f"{r['goal']} | {'-' if r['met'] is None else 'yes' if r['met'] else 'no'} |")
    n = results[0]["n"] if results else 0
    load = ", ".join(f"{x:.2f}" for x in m["load_start"])
    load_end = ", ".join(f"{x:.2f}" for x in m["load_end"])
    head = [
        f"### {m['date']}, commit {m['commit']}",
        "",
        f"{n} interleaved pairs each. Machine: {m['host']}, {m['cpu']}, {m['cores']} cores, "
        f"{m['mem']} RAM, Linux {m['kernel']}; load average {load} at the start, {load_end} at "
        f"the end. Python {m['python']}; "
        + ", ".join(f"{k} {v}" for k, v in m["versions"].items())
        + f"; {m['hyperfine']}; Docker {m['docker']}; {m['sha256sum']}.",
        "",
    ]
    return "\n".join(head + rows + ([""] + extra if extra else [])) + "\n"


def write_doc(section: str) -> None:
    text = DOC.read_text() if DOC.exists() else ""
    if MARKER not in text:
        text = text.rstrip("\n") + "\n\n## Runs\n\n" + MARKER + "\n"
    head, tail = text.split(MARKER, 1)
    rest = tail.lstrip("\n")
    DOC.write_text(head + MARKER + "\n\n" + section + ("\n" + rest if rest else ""))


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(prog="benchmarks/run", description=__doc__.split("\n\n")[0])
    ap.add_argument("--rounds", type=int, default=9, help="interleaved pairs per command (at least 9)")
    ap.add_argument("--only", default="plan,wheel,help,verify,up,floors",
                    help="comma list of pairs: plan, wheel, help, verify, up, floors")
    ap.add_argument("--no-write", action="store_true", help="print only; leave docs/performance.md")
    ap.add_argument("--json", type=Path, help="also write every time to this JSON file")
    ap.add_argument("--cpu", action="store_true", help="time user + system CPU seconds instead of "
                    "the wall clock (a machine others load)")
    ap.add_argument("--before", metavar="REF", help="also time `plan` at commit REF (pair plan-before), "
                    "in the same rounds as the checkout's")
    args = ap.parse_args(argv)
    if args.rounds < 9:
        ap.error("--rounds: at least 9 pairs")
    if shutil.which("hyperfine") is None:
        sys.exit("bench: hyperfine is not installed (Debian: apt-get install hyperfine)")
    global MEASURE
    MEASURE = "cpu" if args.cpu else "wall"
    only = [k.strip() for k in args.only.split(",") if k.strip()]
    unknown = set(only) - {"plan", "wheel", "help", "verify", "up", "floors"}
    if unknown:
        ap.error(f"--only: unknown pair(s) {sorted(unknown)}")

    # An editable checkout normally has its bytecode cached after the first run; where
    # PYTHONDONTWRITEBYTECODE is set, nothing would ever be cached, so compile it once here. The
    # same for the venv's packages: pip compiles them at install, uv (which .ci/test uses) does
    # not, and without their bytecode both sides of every pair compile typer, pydantic and rich
    # from source on every run (the import line 0.46 s against 0.21 s, 2026-12-02), which hides
    # most of escha-deploy's own share of a ratio.
    import sysconfig

    subprocess.run([sys.executable, "-m", "compileall", "-q", str(ROOT / "escha_deploy")], check=True)
    site = sorted({sysconfig.get_paths()["purelib"], sysconfig.get_paths()["platlib"]})
    # not checked: a package may ship a file for a newer Python (torch's py312_intrinsics.py), which
    # pip's install skips the same way
    subprocess.run([sys.executable, "-m", "compileall", "-q", "-j", "0", *site], check=False,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    m = machine()
    extra: list[str] = []
    with tempfile.TemporaryDirectory(prefix="escha-bench-") as d:
        work = Path(d)
        pairs: list[Pair] = []
        doctor_s = None
        for key in only:
            if key == "plan":
                pairs.append(plan_pair())
                if args.before:
                    pairs.append(plan_before_pair(args.before, work / "before"))
            elif key == "help":
                pairs.append(help_pair())
            elif key == "floors":
                pairs.extend(floor_pairs())
            elif key == "wheel":
                pairs.append(wheel_pair(work / "wheel"))
            elif key == "verify":
                (work / "verify").mkdir()
                p, nfiles = verify_pair(work / "verify")
                pairs.append(p)
                extra.append(f"`runtime verify` and `sha256sum -c` check the same {nfiles:,} files.")
        lock = None
        if "up" in only:
            lock = open(DOCKER_LOCK, "a")
            log(f"waiting for the Docker lock {DOCKER_LOCK}")
            fcntl.flock(lock, fcntl.LOCK_EX)
            (work / "up").mkdir()
            p, doctor_s = up_pair(work / "up")
            pairs.append(p)
            extra.append(f"Saved doctor findings refreshed before the `up` pair (`doctor --fresh`, "
                         f"{doctor_s:.2f} s, not in the `up` times); `up` itself ran no probe: the "
                         "stand-in profile asks for no GPU.")
        try:
            for i in range(args.rounds):
                for p in pairs:
                    p.round(i)
                log(f"round {i + 1}/{args.rounds} done")
        finally:
            for p in pairs:
                if p.prepare:
                    subprocess.run(p.prepare, check=False)
            if lock is not None:
                lock.close()
    m["load_end"] = os.getloadavg()
    if args.cpu:
        extra.append("Times are CPU seconds (user + system, `--cpu`), not wall clock: the machine was "
                     "shared, and a process waiting for a core adds wall time only.")
    if m["dont_write_bytecode"]:
        extra.append("PYTHONDONTWRITEBYTECODE was set here; the harness compiled the checkout's "
                     "bytecode first, as a first run would cache it on a user's machine, and the venv's "
                     "packages' bytecode, as pip's install writes it.")
    results = [p.summary() for p in pairs]
    section = render(m, results, extra)
    print(section)
    if args.json:
        args.json.write_text(json.dumps({"machine": m, "results": results}, indent=2))
    if not args.no_write:
        write_doc(section)
        log(f"added this run to {DOC.relative_to(ROOT)}")
    return 0 if all(r["met"] is not False for r in results) else 1


if __name__ == "__main__":
    sys.exit(main())
