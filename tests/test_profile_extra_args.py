"""A flag in ``runtime.extra_args`` that a profile key renders is refused as bad input (exit 2)
naming the key to use, so the rules on that key cannot be bypassed: ``--enable-mixed-chunk``
raw escaped the refusal of ``runtime.enable_mixed_chunk=true`` (mixed chunk corrupts mamba
checkpoints on hybrid models without sglang#39526)."""

import pytest

from escha_deploy.utils.errors import BadInput
from escha_deploy.profile import extra_args_duplicating_keys, list_profiles, load_profile

P = "rtx5060ti-tp2"


def test_the_key_itself_is_refused_exit_3(cli):
    r = cli("plan", "-p", P, "--host-ram", "64GiB", "--linux", "--set", "runtime.enable_mixed_chunk=true")
    assert r.code == 3


def test_the_raw_flag_is_refused_exit_2_naming_the_key(cli):
    r = cli("plan", "-p", P, "--host-ram", "64GiB", "--linux", "--set", 'runtime.extra_args=["--enable-mixed-chunk"]')
    assert r.code == 2
    assert r.out == ""
    lines = r.err.strip().splitlines()
    assert len(lines) == 1
    assert "runtime.extra_args: item 0: --enable-mixed-chunk is the flag of the profile key " \
           "runtime.enable_mixed_chunk; set runtime.enable_mixed_chunk instead" in lines[0]


@pytest.mark.parametrize("extra,key", [
    (["--port=31000"], "container.port"),                      # --flag=value, key by dest name
    (["--hicache-ratio", "2"], "hicache.hicache_ratio"),       # a value flag
    (["--enable-metrics"], "runtime.enable_metrics"),
    (["--kv-cache-quant-group-size", "32"], "runtime.kv_cache.int2.group_size"),  # declared by int2-kv
    (["--mamba-ssm-dtype", "bfloat16"], "runtime.mamba_ssm_dtype"),  # not model.architecture.*
])
def test_every_key_flag_is_caught(extra, key):
    with pytest.raises(BadInput) as e:
        load_profile(P, [f"runtime.extra_args={extra!r}".replace("'", '"')])
    text = "\n".join(e.value.args)
    assert f"is the flag of the profile key {key}; set {key} instead" in text


def test_flags_without_a_key_still_pass():
    prof = load_profile(P, ['runtime.extra_args=["--dp-size", "1", "--log-level", "info"]'])
    assert extra_args_duplicating_keys(prof) == []


def test_in_a_profile_file_the_line_is_named(tmp_path, cli):
    f = tmp_path / "p.yaml"
    f.write_text(f"extends: {P}\nruntime:\n  extra_args: [--log-level, info, --enable-mixed-chunk]\n")
    r = cli("profiles", "validate", str(f))
    assert r.code == 2
    assert f"{f}:3: runtime.extra_args: item 2: --enable-mixed-chunk" in r.err


@pytest.mark.parametrize("name", list_profiles())
def test_shipped_profiles_use_keys_not_raw_duplicates(name):
    assert extra_args_duplicating_keys(load_profile(name)) == []


# --------------------------------------------------------------------------- the key -> flag map is metadata


def test_every_key_flag_is_a_flag_of_the_catalog():
    """Each ``SGLangFlag`` names a flag SGLang 0.5.19's parser has (with the capabilities'
    declared flags): a typo in the metadata fails here, not silently in the extra_args rule."""
    from escha_deploy.sglang import capabilities as caps
    from escha_deploy.sglang.flagcheck import _parser_for
    from escha_deploy.profile import key_flags

    catalog = _parser_for(frozenset(caps.CAPABILITIES))
    flags = key_flags()
    assert flags["runtime.tp_size"] == ("--tp-size",) and flags["container.port"] == ("--port",)
    assert [(k, f) for k, fs in flags.items() for f in fs if f not in catalog.by_option] == []


def test_the_rule_reads_the_metadata_not_the_description(monkeypatch):
    """Rewording a description changes nothing that is refused: runtime.extra_args' own
    description names --api-key, yet no key maps to extra_args, and a key whose description
    no longer names its flag still owns that flag."""
    from escha_deploy.profile import Runtime, key_flags

    assert "--api-key" in Runtime.model_fields["extra_args"].description
    assert "runtime.extra_args" not in key_flags()
    monkeypatch.setattr(Runtime.model_fields["enable_mixed_chunk"], "description", "mixes chunks")
    prof = load_profile("rtx5060ti-tp2")
    prof = prof.model_copy(update={"runtime": prof.runtime.model_copy(update={"extra_args": ["--enable-mixed-chunk"]})})
    assert extra_args_duplicating_keys(prof) == [
        (("runtime", "extra_args"), "item 0: --enable-mixed-chunk is the flag of the profile key "
         "runtime.enable_mixed_chunk; set runtime.enable_mixed_chunk instead, so the rules on that key apply")]


def test_the_secret_metadata_agrees_with_the_secret_flags():
    """A key whose flag carries a secret says so (``SGLangFlag.secret``), and every secret flag
    a key renders is one secretargs refuses in extra_args."""
    from escha_deploy.profile import Profile, sglang_flag
    from escha_deploy.utils.secretargs import SECRET_FLAGS
    from escha_deploy.utils.yamlpos import model_in

    def leaves(model):
        for name, field in model.model_fields.items():
            sub = model_in(field.annotation)
            if sub is not None:
                yield from leaves(sub)
            elif (meta := sglang_flag(field)) is not None:
                yield meta

    metas = list(leaves(Profile))
    assert [m.flag for m in metas if m.flag in SECRET_FLAGS and not m.secret] == []
    assert [m.flag for m in metas if m.secret and m.flag and m.flag not in SECRET_FLAGS] == []
    assert any(m.secret and m.env == "HF_TOKEN" for m in metas)
