"""`profiles copy NAME [DEST]` writes an editable copy that plans as its source; `-p NAME`
says which file it read."""

from __future__ import annotations

import json

import pytest

from escha_deploy.profile import list_profiles, shipped_profile_file

PLAN = ("--host-ram", "16GiB", "--wsl2", "-f", "json")


@pytest.mark.parametrize("name", list_profiles())
def test_a_copy_plans_as_its_source(cli, tmp_path, monkeypatch, name):
    monkeypatch.chdir(tmp_path)
    r = cli("profiles", "copy", name)
    copy = tmp_path / f"{name}.yaml"
    assert r.code == 0 and copy.is_file(), r.err
    assert f"`escha-deploy plan -p ./{name}.yaml`" in r.out
    shipped, mine = cli("plan", "-p", name, *PLAN), cli("plan", "-p", f"./{name}.yaml", *PLAN)
    assert shipped.code == mine.code
    # the profile path aside (positions in reasons name the file and line), the same plan
    assert json.loads(mine.out.replace(str(copy.resolve()), str(shipped_profile_file(name)))
                      .replace(f"./{name}.yaml", str(shipped_profile_file(name)))) == json.loads(shipped.out)


def test_an_edit_of_the_copy_is_what_plans(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    assert cli("profiles", "copy", "rtx5060ti-tp2", "box.yaml").code == 0
    text = (tmp_path / "box.yaml").read_text()
    assert text.splitlines()[0].endswith("catalog/profile.schema.json") and "../" not in text.splitlines()[0]
    assert "  hicache_ratio: auto " in text
    (tmp_path / "box.yaml").write_text(text.replace("  hicache_ratio: auto ", "  hicache_ratio: 1.25 #", 1))
    d = json.loads(cli("plan", "-p", "./box.yaml", *PLAN).out)
    assert d["hicache"]["ratio"] == 1.25


def test_refusals_write_nothing(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "taken.yaml").write_text("mine\n")
    for args, named in ((("nope",), "'nope' is not a shipped profile"),
                        (("rtx5060ti-tp2", "taken.yaml"), "taken.yaml: exists"),
                        (("rtx5060ti-tp2", "box.txt"), "box.txt: a profile copy is a YAML file"),
                        (("rtx5060ti-tp2", "no/such/box.yaml"), "No such file or directory")):
        r = cli("profiles", "copy", *args)
        assert r.code == 2 and r.out == "" and named in r.err and len(r.err.splitlines()) == 1, r.err
    assert sorted(p.name for p in tmp_path.iterdir()) == ["taken.yaml", "xdg-cache"] or \
        sorted(p.name for p in tmp_path.iterdir()) == ["taken.yaml"]
    assert (tmp_path / "taken.yaml").read_text() == "mine\n"
    assert cli("profiles", "copy", "rtx5060ti-tp2", "taken.yaml", "--force").code == 0
    assert (tmp_path / "taken.yaml").read_text() != "mine\n"
    assert cli("profiles", "copy", "rtx5060ti-tp2", ".").code == 0 and (tmp_path / "rtx5060ti-tp2.yaml").is_file()


def test_a_shipped_name_says_which_file_it_read(cli, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    r = cli("plan", "-p", "rtx5060ti-tp2", "--host-ram", "16GiB", "--wsl2")
    line = (f"plan: profile rtx5060ti-tp2 read from the shipped file {shipped_profile_file('rtx5060ti-tp2')} "
            "(to edit a copy: `escha-deploy profiles copy rtx5060ti-tp2`)")
    assert r.err.splitlines()[0] == line
    cli("profiles", "copy", "rtx5060ti-tp2")
    assert "shipped file" not in cli("plan", "-p", "./rtx5060ti-tp2.yaml", "--host-ram", "16GiB", "--wsl2").err
