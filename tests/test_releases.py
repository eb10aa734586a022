"""The per-release data (``escha_deploy/catalog/releases/``) and its one loader.

The tests marked ``wheel`` compare a release's hand-written facts with that release's wheel
(``.cache/wheels/sglang-VERSION-*.whl``; for the default release ``$ESCHA_SGLANG_WHEEL``).
"""

from __future__ import annotations

import ast
import json
import os
import re
import zipfile
from pathlib import Path

import pytest

from escha_deploy.sglang import releases
from escha_deploy.utils.errors import BadInput
from escha_deploy.sglang.flagcheck import load_catalog
from tests.script_module import load_script

REPO = Path(__file__).resolve().parent.parent
PACKAGE = REPO / "escha_deploy"


def _wheel(version: str) -> Path:
    """The release's wheel file, or skip (CI downloads every supported release's)."""
    if version == releases.default_release() and os.environ.get("ESCHA_SGLANG_WHEEL"):
        found = [Path(os.environ["ESCHA_SGLANG_WHEEL"])]
    else:
        found = sorted((REPO / ".cache" / "wheels").glob(f"sglang-{version}-*.whl"))
    if not found or not found[0].is_file():
        pytest.skip(f"no sglang {version} wheel under .cache/wheels")
    return found[0]


def test_index_names_the_default_among_the_supported():
    assert releases.default_release() in releases.supported_releases()
    assert "0.5.19" in releases.supported_releases()
    folders = {p.name for p in releases.releases_dir().iterdir() if p.is_dir()}
    assert folders == set(releases.supported_releases())


@pytest.mark.parametrize("version", releases.supported_releases())
def test_each_release_folder_holds_its_data(version):
    folder = releases.release_dir(version)
    release = releases.load_release(version)
    assert release.version == version
    assert release.image.endswith(f":v{version}")
    names = ["facts.yaml", "flags.json", "parser-requirements.txt", "late-checks.yaml", "late-checks.md",
             "startup-trace.json"]
    if version != releases.supported_releases()[0]:
        names.append("flags-diff.json")
    for name in names:
        assert (folder / name).is_file(), name
    assert load_catalog(version).version == version
    assert json.loads((folder / "flags.json").read_text())["version"] == version
    tiers = release.memory_defaults.tiers
    assert tiers[-1].below_mib is None and all(t.below_mib for t in tiers[:-1])
    assert [t.below_mib for t in tiers[:-1]] == sorted(t.below_mib for t in tiers[:-1])


def test_an_unsupported_release_is_bad_input_naming_the_supported_ones():
    with pytest.raises(BadInput) as e:
        releases.load_release("0.4.0")
    assert "SGLang 0.4.0 is not a supported release" in str(e.value)
    assert "0.5.19" in str(e.value)


def test_memory_tier_lookup():
    md = releases.load_release("0.5.19").memory_defaults
    assert (md.tier(12 * 1024).chunked_prefill, md.tier(12 * 1024).decode_max_bs) == (2048, 8)
    assert md.tier(20 * 1024).decode_max_bs == 24  # the bound is exclusive (gpu_mem < 20 * 1024)
    assert md.tier(200 * 1024).chunked_prefill == 16384


#: String constants that name a release as a fact of that release's code: a citation (where a bug
#: was reported, since which release a class exists, which releases a stand-in fits), true
#: whatever the releases supported, not a value that follows the data. ``(file, phrase)``: the
#: phrase, which holds the release string, is the only place of that file's constants where one
#: may stand; each must still be found (``test_no_module_spells_a_release_string``).
CITATIONS = (
    # sglang#39830's state when it was checked
    ("escha_deploy/bench/canary.py", "no upstream fix as of 0.5.19"),
    # the choices /server_info reported by that release's server
    ("escha_deploy/bench/models.py", "lru, lfu, slru, priority (0.5.19)"),
    # MambaRadixCache's messages come from releases before the unified radix tree (0.5.19)
    ("escha_deploy/launch/diagnose.py", "That class (MambaRadixCache) is what builds before 0.5.19 used; "
                                        "0.5.19 and 0.5.23 build the unified radix tree"),
    ("escha_deploy/launch/diagnose.py", "run SGLang 0.5.19 or later"),
    ("escha_deploy/launch/diagnose.py", "the cache classes builds before 0.5.19 used"),
    ("escha_deploy/launch/diagnose.py", "assert cd.lock_ref == 0), 0.5.19 and 0.5.23"),
    # the two KVCacheConfigurator shapes the pre-flight's stand-in code is written for
    ("escha_deploy/launch/sglang_preflight.py", "(SGLang 0.5.19's or 0.5.23's)"),
    # the host guard kinds and the releases that have each (facts.yaml: host_guard.kind)
    ("escha_deploy/planner/result.py", "per-pool-available (0.5.19, 0.5.20), cgroup-bounded-cache-charged (0.5.21) "
                                       "or cgroup-bounded (0.5.23)"),
    # what stock SGLang lacks or was reported doing, with the release it was read in
    ("escha_deploy/planner/validate.py", "stock SGLang 0.5.19 has no int2 KV pool"),
    ("escha_deploy/planner/validate.py", "illegal-memory-access reports on stock 0.5.19 (sglang#16771, #30055)"),
    ("escha_deploy/watch/alerts.py", "(SGLang 0.5.19 pool_host/mamba.py: MambaPoolHost)"),
    # the seed's figures are that release's exact bytes (DESIGN's seed table)
    ("escha_deploy/planner/constraints.py", "where these are SGLang 0.5.19's exact bytes"),
    ("escha_deploy/watch/alerts.py", "(SGLang 0.5.19 hiradix_cache.py, reason host_pressure)"),
    # the metrics a release added
    ("escha_deploy/watch/reading.py", "SGLang 0.5.23+"),
    # the GPU closure's recipe: every pin in it (WHEELS, KERNEL, the departures) was measured with
    # this release on the GPU machine; its release moves with the recipe, not with the index
    ("scripts/gpu_closure.py", "sglang==0.5.19"),
    ("scripts/gpu_closure.py", "SGLang 0.5.19 imports them at module level"),
    ("scripts/gpu_closure.py", "instead of SGLang 0.5.19's pin 0.4.6.post1"),
    # comments in the oracle's platform plugin: which release asks the platform what
    ("scripts/sglang_oracle.py", "# 0.5.23 (arg_groups/mamba_hook.py"),
    ("scripts/sglang_oracle.py", "0.5.19 never asks"),
    ("scripts/sglang_oracle.py", "# 0.5.23 (arg_groups/speculative_hook.py"),
)


def _release_pattern(versions) -> re.Pattern[str]:
    """Any version of the series of a supported release (``0.5.N`` while ``0.5.19`` is one): a
    release string, whole or inside a longer string (``v0.5.19``, ``sglang-0.5.21-*.whl``)."""
    series = sorted({re.escape(v.rsplit(".", 1)[0]) for v in versions})
    return re.compile(rf"(?<![\d.])(?:{'|'.join(series)})\.\d+(?![\d])")


def _string_constants(source: str) -> list[tuple[int, str]]:
    """``(line, text)`` of each string constant of ``source``, f-string parts included,
    docstrings (which document) left out."""
    tree = ast.parse(source)
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    return [(n.lineno, n.value) for n in ast.walk(tree)
            if isinstance(n, ast.Constant) and isinstance(n.value, str) and id(n) not in docs]


def _release_strings(source: str, pattern: re.Pattern[str], allowed: list[str] = ()) -> list[tuple[int, str]]:
    """``(line, text)`` of each string constant of ``source`` (``_string_constants``) holding a
    release string outside the ``allowed`` phrases. Constants of the same value on one line
    count once."""
    found = set()
    for line, value in _string_constants(source):
        rest = value
        for phrase in allowed:
            rest = rest.replace(phrase, "")
        if pattern.search(rest):
            found.add((line, value))
    return sorted(found)


def test_no_module_spells_a_release_string():
    """No string constant of the package or the scripts holds a release string, whole or inside a
    longer one (an image tag, a default name, a help text naming the default), apart from the
    citations (``CITATIONS``); nor a line of a shell script that is not a comment. Releases come
    from ``escha_deploy/sglang/releases.py`` (the index and each ``facts.yaml``)."""
    pattern = _release_pattern(releases.supported_releases())
    by_file: dict[str, list[str]] = {}
    for file, phrase in CITATIONS:
        assert pattern.search(phrase), (file, phrase)
        by_file.setdefault(file, []).append(phrase)
    found, used = [], set()
    for path in sorted([*PACKAGE.rglob("*.py"), *(REPO / "scripts").glob("*.py")]):
        rel = path.relative_to(REPO).as_posix()
        text = path.read_text(encoding="utf-8")
        allowed = by_file.get(rel, [])
        used |= {(rel, p) for p in allowed if any(p in value for _, value in _string_constants(text))}
        found += [f"{rel}:{line}: {value[:100]!r}" for line, value in _release_strings(text, pattern, allowed)]
    for path in sorted((REPO / "scripts").glob("*.sh")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if not line.lstrip().startswith("#") and pattern.search(line.split(" #", 1)[0]):
                found.append(f"{path.relative_to(REPO)}:{n}: {line.strip()[:100]!r}")
    assert not found, found
    assert used == set(CITATIONS), f"citations no longer in their file: {sorted(set(CITATIONS) - used)}"


def test_the_release_string_check_finds_one_inside_any_constant():
    """The check of ``test_no_module_spells_a_release_string`` on sources that spell a release:
    whole, inside a tag, in an f-string's text, in a help text, a release of the same series not
    supported yet; a docstring and a cited phrase pass."""
    pattern = _release_pattern(["0.5.19", "0.5.23"])
    source = (
        '"""Module doc: 0.5.19 is the default."""\n'
        'A = "0.5.19"\n'
        'B = "escha-sglang:0.5.19-hicache"\n'
        'C = f"lmsysorg/sglang:v0.5.23{x}"\n'
        'D = dict(help="cgroup-bounded from 0.5.21")\n'
        'E = "torch 2.13.0, transformers 5.12.1, kernel 0.4.5, 10.5.190"\n'
        'F = "seen on stock 0.5.19 (sglang#1)"\n'
        'def f():\n    """Doc: 0.5.23."""\n'
    )
    assert [line for line, _ in _release_strings(source, pattern)] == [2, 3, 4, 5, 7]
    assert [line for line, _ in _release_strings(source, pattern, ["stock 0.5.19 (sglang#1)"])] == [2, 3, 4, 5]


#: The releases added before a release's addition had to be data alone; every later release's
#: folder is checked (``test_each_release_addition_touches_only_its_paths``).
ADDED_BEFORE_THE_RULE = ("0.5.19", "0.5.23")


def _allowed_in_release_addition(path: str, release: str) -> bool:
    """Whether the commit that adds ``release`` may touch ``path``: its folder
    (``escha_deploy/catalog/releases/RELEASE/``), the release index, its series
    (``runtime_patches/RELEASE/``), the generated docs and tables (``docs/``, the catalog's JSON
    schemas and tables, ``README.md``), and test parameter data (files under ``tests/`` that are
    not Python). No ``.py`` file anywhere: a release that needs code is not data alone."""
    if path.endswith(".py"):
        return False
    return (path.startswith(f"escha_deploy/catalog/releases/{release}/")
            or path == "escha_deploy/catalog/releases/index.yaml"
            or path.startswith(f"runtime_patches/{release}/")
            or path.startswith("docs/") or path == "README.md"
            or (path.startswith("escha_deploy/catalog/") and path.count("/") == 2 and path.endswith(".json"))
            or path.startswith("tests/"))


def _git(repo: Path, *args: str) -> str:
    import subprocess

    return subprocess.run(["git", "-C", str(repo), *args], check=True, capture_output=True, text=True).stdout


def release_addition_problems(repo: Path, release: str) -> list[str]:
    """What each commit that added ``release``'s folder (each that adds its ``facts.yaml``: a
    release taken out by a revert and added again has two) touched outside
    ``_allowed_in_release_addition``, one line per path, oldest commit first; a folder no commit
    added is a problem too (commit the addition on its own)."""
    facts = f"escha_deploy/catalog/releases/{release}/facts.yaml"
    added = _git(repo, "log", "--diff-filter=A", "--format=%H", "--", facts).split()
    if not added:
        shallow = _git(repo, "rev-parse", "--is-shallow-repository").strip() == "true"
        return [f"{facts}: no commit adds it" + (" (a shallow clone: fetch the history)" if shallow else
                                                 " (commit the release's addition on its own)")]
    problems = []
    for commit in reversed(added):
        touched = _git(repo, "show", "--name-only", "--format=", "--no-renames", commit).split()
        problems += [f"{commit[:12]} adds SGLang {release} and touches {path}" for path in touched
                     if not _allowed_in_release_addition(path, release)]
    return problems


def test_each_release_addition_touches_only_its_paths():
    """The commit that adds each release after ``ADDED_BEFORE_THE_RULE`` touches only its data,
    the index, its series, generated docs and tables, and test data: no code (``git show
    --name-only`` of that commit)."""
    assert set(ADDED_BEFORE_THE_RULE) <= set(releases.supported_releases())
    assert (REPO / ".git").exists(), "the release-addition check reads the git history"
    problems = [p for v in releases.supported_releases() if v not in ADDED_BEFORE_THE_RULE
                for p in release_addition_problems(REPO, v)]
    assert problems == []


def test_the_release_addition_check_refuses_code(tmp_path):
    """On a real git repository: a release added as data passes; one whose commit also changes a
    module, a script or a test's code is refused naming each path; one never committed too."""
    repo = tmp_path / "repo"
    repo.mkdir()
    _git(repo, "init", "-q")
    _git(repo, "config", "user.email", "t@example.invalid")
    _git(repo, "config", "user.name", "t")

    def commit(files: dict[str, str], message: str) -> None:
        for name, text in files.items():
            (repo / name).parent.mkdir(parents=True, exist_ok=True)
            (repo / name).write_text(text)
        _git(repo, "add", "-A")
        _git(repo, "commit", "-q", "-m", message)

    rel = "escha_deploy/catalog/releases"
    commit({f"{rel}/index.yaml": "supported: []\n", "escha_deploy/sglang/releases.py": "", "scripts/gen.py": ""}, "base")
    commit({f"{rel}/9.9.1/facts.yaml": "v\n", f"{rel}/9.9.1/flags.json": "{}", f"{rel}/index.yaml": "supported: [a]\n",
            "runtime_patches/9.9.1/series": "", "docs/runtime.md": "t", "tests/corpus/case.yaml": "x"}, "add 9.9.1")
    assert release_addition_problems(repo, "9.9.1") == []
    commit({f"{rel}/9.9.2/facts.yaml": "v\n", "escha_deploy/sglang/releases.py": "X = 1\n", "scripts/gen.py": "Y = 2\n",
            "tests/test_x.py": "", "runtime_patches/9.9.1/series": "z", f"{rel}/9.9.1/flags.json": "[]"}, "add 9.9.2")
    problems = release_addition_problems(repo, "9.9.2")
    assert [p.split(" touches ")[1] for p in problems] == [
        f"{rel}/9.9.1/flags.json", "escha_deploy/sglang/releases.py", "runtime_patches/9.9.1/series", "scripts/gen.py",
        "tests/test_x.py"]
    assert all(" adds SGLang 9.9.2 and touches " in p for p in problems)
    assert release_addition_problems(repo, "9.9.3") == [f"{rel}/9.9.3/facts.yaml: no commit adds it "
                                                        "(commit the release's addition on its own)"]
    # taken out (a revert) and added again: the second addition is checked too
    _git(repo, "rm", "-q", "-r", f"{rel}/9.9.1")
    _git(repo, "commit", "-q", "-m", "revert 9.9.1")
    commit({f"{rel}/9.9.1/facts.yaml": "w\n", "escha_deploy/planner.py": "Z = 3\n"}, "add 9.9.1 again")
    again = _git(repo, "rev-parse", "HEAD").strip()
    assert release_addition_problems(repo, "9.9.1") == [f"{again[:12]} adds SGLang 9.9.1 and touches escha_deploy/planner.py"]


@pytest.mark.wheel
@pytest.mark.parametrize("version", releases.supported_releases())
def test_facts_agree_with_the_wheel(version):
    """Pins from the wheel's METADATA, the host reserve from its ``pool_host/base.py``."""
    wheel = _wheel(version)
    release = releases.load_release(version)
    with zipfile.ZipFile(wheel) as zf:
        meta = zf.read(f"sglang-{version}.dist-info/METADATA").decode()
        names = zf.namelist()
        guard_file = next(n for n in ("sglang/srt/mem_cache/host_memory.py", "sglang/srt/mem_cache/pool_host/base.py")
                          if n in names and "HICACHE_HOST_MEMORY_RESERVE_BYTES" in zf.read(n).decode())
        guard_src = zf.read(guard_file).decode()
    assert f"Requires-Python: {release.pins.python.value}" in meta
    assert f"Requires-Dist: torch=={release.pins.torch.value}\n" in meta
    assert f"Requires-Dist: transformers=={release.pins.transformers.value}\n" in meta
    m = re.search(r"^HICACHE_HOST_MEMORY_RESERVE_BYTES(?:: int)? = (.+)$", guard_src, re.M)
    assert m, guard_file
    assert eval(compile(ast.parse(m.group(1), mode="eval"), guard_file, "eval"), {"__builtins__": {}}) == release.host_guard.reserve_bytes
    assert guard_file.removeprefix("sglang/") in release.host_guard.source


def test_flags_diff_is_current_and_names_what_0_5_23_refuses(capsys):
    gen = load_script("gen_flags_diff")
    assert gen.supported() == list(releases.supported_releases())
    assert gen.main(["--check"]) == 0
    assert "flags 0.5.19 -> 0.5.23: 26 removed" in capsys.readouterr().err
    d = json.loads(releases.release_file("0.5.23", "flags-diff.json").read_text())
    removed = {r["flag"]: r for r in d["removed"]}
    # 0.5.23's parser: a prefix of the per-phase flags, refused as ambiguous (abbreviations on)
    assert removed["--cuda-graph-max-bs"]["ambiguous_with"] == ["--cuda-graph-max-bs-decode", "--cuda-graph-max-bs-prefill"]
    assert {"--stream-output", "--mamba-scheduler-strategy", "--enable-breakable-cuda-graph"} <= set(removed)
    assert {"flag": "--enable-dp-attention", "new_flag": "--attn-dp-size <dp-size>", "old_still_accepted": True} in d["renamed"]
    assert "--hicache-host-memory-fraction" in d["added"]
    assert set(d["added"]).isdisjoint(removed)


def test_flags_diff_fails_on_a_stale_file(tmp_path, monkeypatch, capsys):
    gen = load_script("gen_flags_diff")
    fake = tmp_path / "releases"
    for v in releases.supported_releases():
        (fake / v).mkdir(parents=True)
        (fake / v / "flags.json").write_text(releases.release_file(v, "flags.json").read_text())
    (fake / "index.yaml").write_text((releases.releases_dir() / "index.yaml").read_text())
    (fake / releases.supported_releases()[1] / "flags-diff.json").write_text("{}\n")
    monkeypatch.setattr(gen, "RELEASES", fake)
    assert gen.main(["--check"]) == 1
    assert "flags-diff.json is stale" in capsys.readouterr().err


@pytest.mark.wheel
@pytest.mark.parametrize("version", releases.supported_releases())
def test_cuda_graph_config_keys_agree_with_the_wheel(version):
    wheel = _wheel(version)
    with zipfile.ZipFile(wheel) as zf:
        src = zf.read("sglang/srt/model_executor/cuda_graph_config.py").decode()
    tree = ast.parse(src)
    node = next(n for n in tree.body if isinstance(n, ast.Assign)
                and getattr(n.targets[0], "id", None) == "ALLOWED_KEYS_PER_PHASE")
    got = {k.attr.lower(): tuple(ast.literal_eval(v)) for k, v in zip(node.value.keys, node.value.values)}
    keys = releases.load_release(version).cuda_graph_config_keys
    assert got == {"decode": keys.decode, "prefill": keys.prefill}


@pytest.mark.wheel
def test_0_5_23_late_checks_are_current_with_the_inherited_annotations(capsys):
    wheel = _wheel("0.5.23")
    gen = load_script("gen_late_checks")
    assert gen.main(["--wheel", str(wheel), "--check", "--release", "0.5.23"]) == 0
    err = capsys.readouterr().err
    assert "late checks: sglang 0.5.23: 5317 rows;" in err and "unreviewed" not in err
    assert gen.main(["--wheel", str(wheel), "--check", "--release", "0.5.19"]) == 2
    assert "is sglang 0.5.23, not 0.5.19" in capsys.readouterr().err


def test_a_profile_names_a_supported_release_or_is_refused_naming_the_field():
    from escha_deploy.profile import load_profile

    assert load_profile("rtx5060ti-tp2-fp8").runtime.sglang_version is None  # unset: chosen at plan time
    assert load_profile("rtx5060ti-tp2-fp8", ["runtime.sglang_version=0.5.23"]).runtime.sglang_version == "0.5.23"
    with pytest.raises(BadInput) as e:
        load_profile("rtx5060ti-tp2-fp8", ["runtime.sglang_version=0.4.0"])
    assert "runtime.sglang_version" in str(e.value) and "SGLang 0.4.0 is not a supported release" in str(e.value)


def test_the_series_is_made_for_the_release_its_base_inventories_are_of():
    from escha_deploy.utils.paths import runtime_patches_dir

    versions = {json.loads(p.read_text())["version"] for p in (runtime_patches_dir() / "base").glob("*.json")}
    assert versions == {releases.series_release()}
