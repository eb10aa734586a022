"""``fleet compose``: which files the printed instructions say to copy next to each box's
compose file, and what each box needs before ``docker compose up``."""

from __future__ import annotations

from pathlib import Path

import yaml
from .test_fleet_plan import run_cli as run


PROFILE = "rtx5060ti-tp2-fp8"




def same_key_fleet(folder: Path, replica_key: str) -> Path:
    """One box runs the router and its replica; the replica holds the router's key (as
    docs/scale-out.md asks), named ``replica_key`` in its ``set``."""
    folder.mkdir()
    (folder / "router.key").write_text("k-123\n")
    path = folder / "same.yaml"
    path.write_text(yaml.safe_dump({
        "name": "lab",
        "boxes": [{"name": "a", "address": "127.0.0.1", "profile": PROFILE, "host_ram": "64GiB", "platform": "linux",
                   "set": ["container.expose=true", f"container.api_key_file={replica_key}"]}],
        "router": {"box": "a", "api_key_file": "router.key"},
    }, sort_keys=False))
    return path


def test_one_key_named_relative_and_absolute_is_copied_once(tmp_path, capsys, monkeypatch):
    """The router's ``router.key`` (relative to the fleet file) and the replica's
    ``container.api_key_file=router.key`` are the same file: plan and compose both exit 0, and
    it is copied once. Run from another folder: the relative path is the fleet file's folder's."""
    path = same_key_fleet(tmp_path / "fleet", "router.key")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    assert run(capsys, "fleet", "plan", str(path))[0] == 0
    code, out, err = run(capsys, "fleet", "compose", str(path), "--out", str(tmp_path / "sameout"))
    assert code == 0, err
    key = (tmp_path / "fleet" / "router.key").resolve()
    assert f"a: copy compose.a.yaml, router.key (from {key}) into one folder on a" in err
    assert err.count("router.key (from") == 1
    doc = yaml.safe_load((tmp_path / "sameout" / "compose.a.yaml").read_text())
    assert doc["secrets"] == {"escha_api_key": {"file": "./router.key"}, "escha_router_api_key": {"file": "./router.key"}}
    assert sorted(p.name for p in (tmp_path / "sameout").iterdir()) == ["compose.a.yaml"]


def test_a_box_with_a_facts_file_finds_its_key_beside_the_fleet_file_too(tmp_path, capsys, monkeypatch):
    """As above with the box's facts file instead of host_ram: its key, relative to the fleet
    file, is found from another folder (the facts-file gather refused it as no file here)."""
    path = same_key_fleet(tmp_path / "fleet", "router.key")
    facts = tmp_path / "fleet" / "box.json"
    assert run(capsys, "plan", "-p", PROFILE, "--host-ram", "64GiB", "--linux", "--write-facts", str(facts))[0] == 0
    doc = yaml.safe_load(path.read_text())
    box = doc["boxes"][0]
    del box["host_ram"], box["platform"]
    box["facts"] = "box.json"
    path.write_text(yaml.safe_dump(doc, sort_keys=False))
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    monkeypatch.chdir(elsewhere)
    code, out, err = run(capsys, "fleet", "plan", str(path))
    assert code == 0, err
    code, out, err = run(capsys, "fleet", "compose", str(path), "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert err.count("router.key (from") == 1


def test_a_key_typed_where_its_file_goes_is_refused_and_never_written(tmp_path, capsys):
    """``container.api_key_file=KEY`` in a box's set: exit 2 naming the key's setting (never
    the key), nothing rendered, whether the box has host_ram or a facts file; `fleet compose`
    used to write the key into the file's `--set` line."""
    path = same_key_fleet(tmp_path / "fleet", "sk-typed-key-0123456789")
    facts = tmp_path / "fleet" / "box.json"
    assert run(capsys, "plan", "-p", PROFILE, "--host-ram", "64GiB", "--linux", "--write-facts", str(facts))[0] == 0
    for described in ({}, {"facts": "box.json"}):
        doc = yaml.safe_load(path.read_text())
        if described:
            doc["boxes"][0] = {k: v for k, v in doc["boxes"][0].items() if k not in ("host_ram", "platform")}
            doc["boxes"][0].update(described)
        path.write_text(yaml.safe_dump(doc, sort_keys=False))
        for verb in (["plan", str(path)], ["compose", str(path), "--out", str(tmp_path / "out")]):
            code, out, err = run(capsys, "fleet", *verb)
            assert code == 2, (described, verb, err)
            assert "error: box a: container.api_key_file: the path given (23 characters, starting 'sk-'; " \
                   "not shown whole) is neither an existing file nor an absolute path" in err.splitlines()
            assert "sk-typed-key" not in out + err
        assert not (tmp_path / "out").exists()


def test_absolute_and_relative_names_of_one_key_are_one_file(tmp_path, capsys):
    path = same_key_fleet(tmp_path / "fleet", str(tmp_path / "fleet" / "router.key"))
    code, out, err = run(capsys, "fleet", "compose", str(path), "--out", str(tmp_path / "out"))
    assert code == 0, err
    assert err.count("router.key (from") == 1


def test_two_different_files_of_one_name_are_still_refused(tmp_path, capsys):
    (tmp_path / "keys").mkdir()
    (tmp_path / "keys" / "router.key").write_text("k-123\n")
    path = same_key_fleet(tmp_path / "fleet", str(tmp_path / "keys" / "router.key"))
    code, out, err = run(capsys, "fleet", "compose", str(path), "--out", str(tmp_path / "out"))
    assert code == 2
    assert err.splitlines() == [f"error: box a: {(tmp_path / 'keys' / 'router.key').resolve()} and "
                                f"{(tmp_path / 'fleet' / 'router.key').resolve()} would both be copied as "
                                "router.key next to its compose file; rename one of them"]


def test_instructions_name_the_images_each_box_needs_and_how_to_make_them(tmp_path, capsys):
    """docs/scale-out.md's fleet: the files have no ``build:`` and no registry holds the images,
    so stderr and each file's header say which images each box needs and the command making
    each; the commands' options are the real CLI's (checked against their --help)."""
    import shlex

    from .test_fleet_render import docs_fleet

    path = docs_fleet(tmp_path)
    capsys.readouterr()
    code, out, err = run(capsys, "fleet", "compose", str(path), "--out", str(tmp_path / "deploy"))
    assert code == 0, err
    server = "escha-deploy build --hicache --context CHECKOUT --tag escha-sglang:0.5.19-hicache"
    router = "escha-deploy fleet build-router --base-image IMAGE --tag escha-smg:1.13.0"
    need = "needs image {} first (no registry holds it; the file builds nothing): make it on {} with `{}`"
    lines = err.splitlines()
    assert f"wsl-a: {need.format('escha-sglang:0.5.19-hicache', 'wsl-a', server)}" in lines
    assert f"lin-b: {need.format('escha-sglang:0.5.19-hicache', 'lin-b', server)}" in lines
    assert f"lin-b: {need.format('escha-smg:1.13.0', 'lin-b', router)}" in lines
    assert not any("escha-smg" in ln for ln in lines if ln.startswith("wsl-a:"))
    head = (tmp_path / "deploy" / "compose.lin-b.yaml").read_text().split("services:")[0]
    assert f"#   escha-smg:1.13.0: `{router}`" in head and f"#   escha-sglang:0.5.19-hicache: `{server}`" in head
    for cmd in (server, router):
        argv = shlex.split(cmd)[1:]
        verb = argv[:argv.index(next(a for a in argv if a.startswith("--")))]
        code, helptext, _ = run(capsys, *verb, "--help")
        assert code == 0
        for opt in (a for a in argv if a.startswith("--")):
            assert opt in helptext, f"{' '.join(verb)} has no {opt}"
