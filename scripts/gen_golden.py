"""Golden files: what each shipped profile renders, from one fixed facts file.

For every ``profiles/*.yaml`` this writes ``tests/golden/<profile>/``:

- ``serve.json``: ``serve --print`` in container mode (``ESCHA_SERVE_MODE=container``,
  ``ESCHA_FACTS`` set): plan digest, argv and env as the server would get them;
- ``keys.json``: ``profiles show --keys --format json``: each key's value, default, unit and
  SGLang flag;
- ``compose.yaml``: ``compose --facts``;
- ``fleet-compose/``: ``fleet compose`` of a fleet with one single-node box and one 2-node
  group (``nodes: 2``), every box with the same facts file;
- ``k8s/``: ``fleet render k8s`` of that fleet.

The facts file (``tests/golden/<profile>/box.json``, written by this script too) is a Linux
box with 128 GiB and the profile's GPUs. Paths of the temporary folder and of the checkout are replaced by
``<tmp>`` and ``<checkout>``, so the files are the same on every machine.

    python scripts/gen_golden.py           # write the files
    python scripts/gen_golden.py --check   # exit 1 naming each file that differs

Regenerate after a change that is meant to change what is rendered, and review the diff in the
same commit.
"""

from __future__ import annotations

import argparse
import io
import json
import os
import sys
import tempfile
from contextlib import redirect_stderr, redirect_stdout
from pathlib import Path
from unittest import mock

ROOT = Path(__file__).resolve().parent.parent
GOLDEN = ROOT / "tests" / "golden"
GiB = 2**30


def facts_doc(profile) -> dict:
    """A Linux box with 128 GiB of RAM and the profile's GPUs (``hardware``: count, name, VRAM,
    compute capability, 12.0 when the profile names none)."""
    from escha_deploy.facts.factsfile import FactsFile, GpuRecord, HostSection

    hw = profile.hardware
    return FactsFile(
        created_at="2026-01-01T00:00:00+00:00", escha_version="0.0.0",
        host=HostSection(platform="linux", mem_total_bytes=128 * GiB),
        gpus=[GpuRecord(index=i, name=f"NVIDIA {hw.gpu_name}", memory_total_bytes=hw.gpu_vram,
                        compute_capability=hw.compute_capability or "12.0") for i in range(hw.gpu_count)],
    ).model_dump(mode="json")


def runtime_doc(profile) -> dict:
    """The runtime description (``/etc/escha/runtime.json``) of an image built with this
    checkout's patch series and what the profile needs (``runtime.needs``: a fork's commits)."""
    from escha_deploy.sglang.capabilities import SERIES_CAPABILITIES
    from escha_deploy.sglang.releases import official_image, series_release
    from escha_deploy.runtime.description import RuntimeDescription

    return RuntimeDescription(
        sglang_version=series_release(), base=f"image:{official_image(series_release())}", base_inventory_digest="0" * 64,
        base_inventory_committed=True, python="3.11.2", sglang_dir="/usr/lib/python3/dist-packages/sglang",
        capabilities=list(dict.fromkeys([*SERIES_CAPABILITIES, *profile.runtime.needs])), inventory_digest="0" * 64, escha_version="0.0.0",
    ).model_dump(mode="json")


def _cli(*args: str, env: dict[str, str] | None = None, cwd: Path | None = None) -> str:
    """``escha-deploy ARGS`` in this process; its stdout. Raises naming stderr on a non-zero exit."""
    from escha_deploy.cli.main import main

    out, err = io.StringIO(), io.StringIO()
    old = os.getcwd()
    code = 0
    with mock.patch.dict(os.environ, env or {}), redirect_stdout(out), redirect_stderr(err):
        try:
            if cwd:
                os.chdir(cwd)
            main(list(args))
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        finally:
            os.chdir(old)
    if code != 0:
        raise RuntimeError(f"escha-deploy {' '.join(args)}: exit {code}\n{err.getvalue()}")
    return out.getvalue()


def _l3_mounted(path: str, **kw):
    """STAND-IN for ``folders.read_l3_dir`` in container mode: the container's L3 mount
    (``flags.CONTAINER_L3_DIR``) does not exist on the machine that renders the golden files
    (read as fine, with no reading: the plan weighs no room)."""
    from escha_deploy.pipeline import argv as flags
    from escha_deploy.facts.folders import read_l3_dir

    return ([], None) if path == flags.CONTAINER_L3_DIR else read_l3_dir(path, **kw)


def _environment_fits(launch, capabilities, **kw):
    """STAND-IN for ``launch.check.check_here`` (``serve``'s comparison of the environment it
    runs in with what the plan assumed: memory, GPUs, model folder): the golden files are what
    is rendered for the facts file, on any machine."""
    from escha_deploy.launch.check import Checked

    return Checked()


def _fleet_doc(profile: str) -> dict:
    """One box alone and a two-node group; a profile with speculative decoding spans its two
    nodes by TP (SGLang refuses pipeline parallelism with it)."""
    from escha_deploy.profile import load_profile

    boxes = [{"name": n, "address": f"127.0.0.{i}", "profile": profile, "facts": "box.json"}
             for i, n in enumerate(("solo", "n0", "n1"), start=1)]
    two: dict = {"name": "two", "nodes": 2, "boxes": ["n0", "n1"]}
    if load_profile(profile).runtime.speculative is not None:
        two["parallel"] = "tp"
    return {"name": "golden", "boxes": boxes, "groups": [{"name": "one", "boxes": ["solo"]}, two],
            "kubernetes": {"namespace": "llm"}}


def render(tmp: Path) -> dict[str, str]:
    """Every golden file's relative path -> text, rendered in ``tmp``."""
    import yaml

    from escha_deploy.profile import list_profiles, load_profile

    files: dict[str, str] = {}
    env = {"XDG_CACHE_HOME": str(tmp / "cache"), "ESCHA_FACTS": ""}
    for profile in list_profiles():
        out = tmp / profile
        out.mkdir()
        facts = out / "box.json"
        facts_text = json.dumps(facts_doc(load_profile(profile)), indent=2, sort_keys=True) + "\n"
        facts.write_text(facts_text)
        files[f"{profile}/box.json"] = facts_text
        runtime = out / "runtime.json"
        runtime.write_text(json.dumps(runtime_doc(load_profile(profile)), indent=2) + "\n")
        with mock.patch("escha_deploy.facts.folders.read_l3_dir", _l3_mounted), \
                mock.patch("escha_deploy.launch.check.check_here", _environment_fits), \
                mock.patch("escha_deploy.sglang.capabilities.RUNTIME_DESCRIPTION_PATH", str(runtime)):
            serve = _cli("serve", "--profile", profile, "--print",
                         env={**env, "ESCHA_SERVE_MODE": "container", "ESCHA_FACTS": str(facts)}, cwd=tmp)
        files[f"{profile}/serve.json"] = json.dumps(json.loads(serve), indent=2, sort_keys=True) + "\n"
        keys = _cli("profiles", "show", profile, "--keys", "--format", "json", env=env, cwd=tmp)
        files[f"{profile}/keys.json"] = json.dumps(json.loads(keys), indent=2) + "\n"
        _cli("compose", "--profile", profile, "--facts", str(facts), "-o", str(out / "compose.yaml"), env=env, cwd=tmp)
        files[f"{profile}/compose.yaml"] = (out / "compose.yaml").read_text()
        fleet = out / "fleet.yaml"
        fleet.write_text(yaml.safe_dump(_fleet_doc(profile), sort_keys=False))
        _cli("fleet", "compose", str(fleet), "--out", str(out / "fleet-compose"), env=env, cwd=tmp)
        _cli("fleet", "render", "k8s", str(fleet), "--out", str(out / "k8s"), env=env, cwd=tmp)
        for sub in ("fleet-compose", "k8s"):
            for p in sorted((out / sub).rglob("*")):
                if p.is_file():
                    files[f"{profile}/{sub}/{p.relative_to(out / sub)}"] = p.read_text()
    return {k: _normalize(v, tmp, k) for k, v in files.items()}


def _normalize(text: str, tmp: Path, rel: str) -> str:
    folder = (tmp / rel).parent
    for path, name in ((os.path.relpath(ROOT, folder), "<checkout>"), (str(ROOT), "<checkout>"),
                       (str(tmp.resolve()), "<tmp>"), (str(tmp), "<tmp>")):
        text = text.replace(path, name)
    return text


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", action="store_true", help="compare with tests/golden; exit 1 on a difference")
    args = ap.parse_args(argv)
    with tempfile.TemporaryDirectory(prefix="escha-golden-") as d:
        files = render(Path(d))
    have = {str(p.relative_to(GOLDEN)): p.read_text() for p in GOLDEN.rglob("*") if p.is_file()} if GOLDEN.is_dir() else {}
    if args.check:
        bad = sorted(k for k in set(files) | set(have) if files.get(k) != have.get(k))
        for k in bad:
            print(f"golden: tests/golden/{k}: " + ("missing" if k not in have else "not rendered any more"
                                                   if k not in files else "differs"), file=sys.stderr)
        if bad:
            print("golden: run `python scripts/gen_golden.py` and review the diff", file=sys.stderr)
        return 1 if bad else 0
    for k in set(have) - set(files):
        (GOLDEN / k).unlink()
    for k, text in files.items():
        (GOLDEN / k).parent.mkdir(parents=True, exist_ok=True)
        (GOLDEN / k).write_text(text)
    print(f"golden: {len(files)} files under tests/golden")
    return 0


if __name__ == "__main__":
    sys.exit(main())
