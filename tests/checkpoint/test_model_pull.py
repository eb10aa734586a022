"""`escha-deploy model pull` and `model verify` with the unmodified huggingface_hub client
against the hub STAND-IN on 127.0.0.1 (tests/checkpoint/hub_standin.py): never the internet."""

from __future__ import annotations

import json

from .conftest import REPO, checkpoint

WEIGHTS = ["model-00001-of-00002.safetensors", "model-00002-of-00002.safetensors"]


def test_pull_fetches_only_what_sglang_needs_verifies_and_pins(cli, hub, tmp_path):
    dest = tmp_path / "m"
    r = cli("model", "pull", REPO, "--to", str(dest), "-f", "json")
    assert r.code == 0, r.err
    out = json.loads(r.out)
    names = sorted(f["name"] for f in out["lock"]["files"])
    assert names == sorted(["config.json", "tokenizer.json", "model.safetensors.index.json", *WEIGHTS])
    assert not (dest / "pytorch_model.bin").exists() and not (dest / "README.md").exists()
    assert not (dest / "original").exists()
    lock = json.loads((dest / "escha-model.lock.json").read_text())
    assert lock["repo"] == REPO and lock["revision"] == "main" and len(lock["commit"]) == 40
    files = {f["name"]: f for f in lock["files"]}
    data = checkpoint()
    import hashlib

    assert files[WEIGHTS[0]]["sha256"] == hashlib.sha256(data[WEIGHTS[0]]).hexdigest()
    assert files[WEIGHTS[0]]["size"] == len(data[WEIGHTS[0]]) and files["config.json"]["git_sha1"]
    v = cli("model", "verify", str(dest))
    assert v.code == 0 and "5 files verified" in v.out, v.err
    again = json.loads(cli("model", "pull", REPO, "--to", str(dest), "-f", "json").out)
    assert again["fetched"] == [] and len(again["present"]) == 5  # nothing fetched twice
    (dest / WEIGHTS[1]).write_bytes(b"x" + data[WEIGHTS[1]][1:])
    bad = cli("model", "verify", str(dest))
    assert bad.code == 3 and f"model verify: {dest / WEIGHTS[1]}: sha256" in bad.err


def test_a_file_whose_bytes_differ_from_its_sha256_is_refused_naming_it(cli, hub, tmp_path):
    hub.corrupt.add(WEIGHTS[0])
    dest = tmp_path / "m"
    r = cli("model", "pull", REPO, "--to", str(dest))
    assert r.code == 3, r.err
    errors = [ln for ln in r.err.splitlines() if ln.startswith("error: ")]
    assert errors == [f"error: model pull: {dest / WEIGHTS[0]}: sha256 "
                      f"{errors[0].split('sha256 ')[1].split('...')[0]}... differs from the hub's "
                      f"{errors[0].split('hub' + chr(39) + 's ')[1].split('...')[0]}...; removed"], errors
    assert not (dest / WEIGHTS[0]).exists()  # never used as if whole
    assert not (dest / "escha-model.lock.json").exists()


def test_an_interrupted_download_resumes(cli, hub, tmp_path):
    """The connection is cut after half of a 24 MiB shard: the client asks for the rest with an
    HTTP Range request from where it stopped (within the pull, or the next pull from the
    partial file kept), and the file verifies."""
    hub.add("escha-test/big", checkpoint(big=True))
    hub.interrupt_once.add(WEIGHTS[1])
    dest = tmp_path / "m"
    first = cli("model", "pull", "escha-test/big", "--to", str(dest))
    if first.code != 0:  # the client gave up on the cut: the partial file is kept, the next pull resumes
        assert first.code == 3, first.err
        second = cli("model", "pull", "escha-test/big", "--to", str(dest))
        assert second.code == 0, second.err
    gets = [rng for (m, path, rng) in hub.requests
            if m == "GET" and path.startswith("/escha-test/big/resolve/") and path.endswith(WEIGHTS[1])]
    starts = [int(r_[6:].split("-")[0]) for r_ in gets if r_]
    assert starts and 0 < starts[0] < len(checkpoint(big=True)[WEIGHTS[1]]), gets  # resumed, not fetched again
    assert cli("model", "verify", str(dest)).code == 0


def test_a_repository_that_does_not_exist_is_bad_input(cli, hub, tmp_path):
    r = cli("model", "pull", "escha-test/no-such-model", "--to", str(tmp_path / "m"))
    assert r.code == 2, r.err
    assert r.err.splitlines()[0].startswith("error: model pull: escha-test/no-such-model: no such repository on http://127.0.0.1:")
    r = cli("model", "pull", f"{REPO}@no-such-branch", "--to", str(tmp_path / "m"))
    assert r.code == 2 and f"model pull: {REPO}@no-such-branch: no such revision" in r.err
    assert not (tmp_path / "m").exists()  # nothing written


def test_a_revision_that_moved_is_refused_until_update(cli, hub, tmp_path):
    dest = tmp_path / "m"
    assert cli("model", "pull", REPO, "--to", str(dest)).code == 0
    old = json.loads((dest / "escha-model.lock.json").read_text())["commit"]
    files = checkpoint()
    files["tokenizer.json"] = b'{"version": "1.1"}'
    new = hub.move(REPO, files)
    r = cli("model", "pull", REPO, "--to", str(dest))
    assert r.code == 3, r.err
    assert f"model pull: {REPO}@main moved: {dest} holds commit {old[:12]}" in r.err and new[:12] in r.err
    u = cli("model", "pull", REPO, "--to", str(dest), "--update", "-f", "json")
    assert u.code == 0, u.err
    out = json.loads(u.out)
    assert out["lock"]["commit"] == new and out["fetched"] == ["tokenizer.json"]


def test_a_folder_holding_another_models_files_is_refused(cli, hub, tmp_path):
    dest = tmp_path / "m"
    dest.mkdir()
    (dest / "config.json").write_text("{}")
    (dest / "model.safetensors").write_bytes(b"\0" * 16)
    r = cli("model", "pull", REPO, "--to", str(dest))
    assert r.code == 3 and "holds files no pull of" in r.err and "config.json" in r.err, r.err
    other = tmp_path / "o"
    hub.add("escha-test/other", checkpoint())
    assert cli("model", "pull", "escha-test/other", "--to", str(other)).code == 0
    r = cli("model", "pull", REPO, "--to", str(other))
    assert r.code == 3 and f"{other} holds escha-test/other@" in r.err


def test_offline_reads_what_is_there_and_sends_nothing(cli, hub, tmp_path, monkeypatch):
    dest = tmp_path / "m"
    assert cli("model", "pull", REPO, "--to", str(dest)).code == 0
    n = len(hub.requests)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    r = cli("model", "pull", REPO, "--to", str(dest))
    assert r.code == 0 and "5 files verified" in r.out, r.err
    assert len(hub.requests) == n
    assert cli("model", "pull", REPO, "--to", str(tmp_path / "empty")).code == 2


def test_the_token_comes_from_its_file_and_is_never_printed(cli, hub, tmp_path):
    tok = tmp_path / "token"
    tok.write_text("hf_planted_token_5e1a\n")
    r = cli("model", "pull", "escha-test/no-such-model", "--to", str(tmp_path / "m"), "--token-file", str(tok))
    assert r.code == 2 and "hf_planted_token_5e1a" not in r.out + r.err
    ok = cli("model", "pull", REPO, "--to", str(tmp_path / "m2"), "--token-file", str(tok))
    assert ok.code == 0 and "hf_planted_token_5e1a" not in ok.out + ok.err


def test_disk_space_is_checked_before_the_first_byte(cli, hub, tmp_path, monkeypatch):
    import shutil
    from collections import namedtuple

    usage = namedtuple("usage", "total used free")
    monkeypatch.setattr(shutil, "disk_usage", lambda p: usage(10**9, 10**9 - 100, 100))
    dest = tmp_path / "m"
    r = cli("model", "pull", REPO, "--to", str(dest))
    assert r.code == 3 and "needs" in r.err and "free (shutil.disk_usage)" in r.err, r.err
    assert not any(m == "GET" and p.endswith(".safetensors") for m, p, _ in hub.requests)


def test_each_shipped_profile_names_its_checkpoint_or_says_none_is_published(cli, hub, tmp_path):
    """rtx5060ti-tp2's W2 weights are the fork's own: no repository, and `model pull` says so
    (exit 2) with the profile's reason; the others name a hub repository id and its source."""
    from escha_deploy.profile import list_profiles, load_profile

    for name in list_profiles():
        cp = load_profile(name).model.checkpoint
        assert cp is not None and cp.source, name
        assert (cp.repo is None) == (name == "rtx5060ti-tp2"), (name, cp.repo)
        assert "Qwen/Qwen3.5-27B" in cp.source  # the checkpoint SGLang's wheel names
    r = cli("model", "pull", "rtx5060ti-tp2", "--to", str(tmp_path / "w2"))
    assert r.code == 2 and "model pull: rtx5060ti-tp2: model.checkpoint.repo is null (none published" in r.err
    assert not any("/resolve/" in p for _, p, _ in hub.requests)


def test_the_progress_line_prints_a_hubs_file_name_without_terminal_controls(cli, hub, tmp_path):
    """A name the hub lists reaches the progress line on stderr: its ESC sequences and bidi
    controls do not (``termtext.printable``)."""
    hostile = "\x1b]0;PWNED\x07\x1b[31m\u202e\u2066"
    hub.add("escha-test/hostile-names", {**checkpoint(), f"tokenizer_config{hostile}.json": b"{}"})
    r = cli("model", "pull", "escha-test/hostile-names", "--to", str(tmp_path / "m"))
    assert "model pull: tokenizer_config" in r.err, r.err
    assert not any(c in r.out + r.err for c in ("\x1b", "\x07", "\u202e", "\u2066")), repr(r.err)
