"""Host facts from this machine's real /proc and cgroup files, and from fixture trees of other
hosts written from public facts (learn.microsoft.com/windows/wsl)."""

from pathlib import Path

from escha_deploy.facts.host import HostFacts
from escha_deploy.facts.machine import detect_platform, gather_host_facts, read_cgroup_memory, read_meminfo

WSL2_OSRELEASE = "5.15.167.4-microsoft-standard-WSL2\n"
WSL2_VERSION = ("Linux version 5.15.167.4-microsoft-standard-WSL2 (root@f9c826d3017f) (gcc (GCC) 11.2.0, "
                "GNU ld (GNU Binutils) 2.37) #1 SMP Tue Nov 5 00:21:55 UTC 2024\n")


def tree(tmp_path: Path, files: dict[str, str]) -> Path:
    for rel, text in files.items():
        p = tmp_path / rel
        p.parent.mkdir(parents=True, exist_ok=True)
        p.write_text(text)
    return tmp_path


def test_this_machine():
    mem = read_meminfo()
    assert mem["MemTotal"] > mem["MemAvailable"] > 0
    facts = gather_host_facts(use_findings=False)
    assert facts.source == "live" and facts.mem_total_bytes == mem["MemTotal"]
    assert facts.platform in ("linux", "wsl2")
    assert len(facts.host_id) == 16


def test_wsl2_vm_with_hugepages(tmp_path):
    root = tree(tmp_path, {
        "proc/sys/kernel/osrelease": WSL2_OSRELEASE, "proc/version": WSL2_VERSION,
        "proc/meminfo": "MemTotal:       16343568 kB\nMemAvailable:   15123456 kB\nHugePages_Total:       4\n"
                        "Hugepagesize:       2048 kB\n",
    })
    assert detect_platform(root) == "wsl2"
    mem = read_meminfo(root)
    assert mem["MemTotal"] == 16343568 * 1024 and mem["HugePages_Total"] == 4 and mem["Hugepagesize"] == 2 * 2**20


def test_plain_linux_is_not_wsl(tmp_path):
    root = tree(tmp_path, {"proc/sys/kernel/osrelease": "6.1.0-27-amd64\n", "proc/version": "Linux version 6.1.0-27-amd64\n"})
    assert detect_platform(root) == "linux"


def test_cgroup_v2_limit_and_unlimited(tmp_path):
    assert read_cgroup_memory(tree(tmp_path / "a", {"sys/fs/cgroup/memory.max": "21474836480\n",
                                                    "sys/fs/cgroup/memory.current": "1073741824\n"})) == (20 * 2**30, 2**30)
    assert read_cgroup_memory(tree(tmp_path / "b", {"sys/fs/cgroup/memory.max": "max\n",
                                                    "sys/fs/cgroup/memory.current": "5\n"})) == (None, 5)


def test_cgroup_v1_unlimited_is_none(tmp_path):
    root = tree(tmp_path, {"sys/fs/cgroup/memory/memory.limit_in_bytes": "9223372036854771712\n",
                           "sys/fs/cgroup/memory/memory.usage_in_bytes": "123\n"})
    assert read_cgroup_memory(root) == (None, 123)


def test_available_now_respects_the_cgroup():
    h = HostFacts(source="live", platform="linux", mem_total_bytes=100, mem_available_bytes=90,
                  cgroup_limit_bytes=50, cgroup_usage_bytes=20)
    assert (h.memory_base_bytes, h.available_now_bytes) == (50, 30)


def test_plan_inputs_are_gathered_one_way(tmp_path):
    """plan, up and serve share one gather: the model folder's weights and a described host the
    same way; a broken config.json names its field."""
    import json

    import pytest

    from escha_deploy.utils.errors import BadInput
    from escha_deploy.facts.machine import read_model_folder
    from escha_deploy.pipeline import DescribedHost, ThisHost, gather
    from escha_deploy.profile import load_profile

    (tmp_path / "model-00001.safetensors").write_bytes(b"\0" * 4096)
    prof = load_profile("rtx5060ti-tp2-fp8", [f"model.host_dir={tmp_path}"])
    with pytest.raises(BadInput, match="^model.host_dir: .* has no config.json$"):  # weights alone: not loadable
        gather(prof, DescribedHost(16 * 2**30, "wsl2"))
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "llama", "num_hidden_layers": 2,
                                                      "num_attention_heads": 4, "num_key_value_heads": 2,
                                                      "head_dim": 64}))
    g = gather(prof, DescribedHost(16 * 2**30, "wsl2"))
    host, model = g.host, g.model_dir
    assert (host.source, host.platform, host.mem_total_bytes) == ("described", "wsl2", 16 * 2**30)
    assert model.safetensors_bytes == 4096 and model.arch.num_hidden_layers == 2
    live = gather(prof, ThisHost()).host
    assert live.source == "live" and not live.l3_checked  # no file L3 backend in this profile
    (tmp_path / "config.json").write_text("{")
    with pytest.raises(BadInput, match="^model.host_dir: .*config.json:1"):
        gather(prof, ThisHost())
    with pytest.raises(BadInput, match="^model.path: "):
        read_model_folder(prof, model_path=str(tmp_path))
