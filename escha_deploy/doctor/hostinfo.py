"""Host readers beyond ``escha_deploy.facts.machine``: swap, page cache, hugepages, the memlock ulimit,
the /dev/shm size, the WSL2 signals, and what kind of Docker daemon ``docker info`` describes.

Every reader takes a ``root`` (default ``/``) so tests point it at fixture trees of WSL2 and
other hosts (tests/doctor/fixtures/). MemTotal, MemAvailable and the cgroup limit come from
``escha_deploy.facts.machine`` (``read_meminfo``, ``read_cgroup_memory``); this module does not re-read
them another way.
"""

from __future__ import annotations

import os
import re
from collections.abc import Mapping
from pathlib import Path
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

from escha_deploy.facts.machine import hugetlb_bytes, read_cgroup_memory, read_meminfo


class MemoryFacts(BaseModel):
    """Host memory in bytes, from ``/proc/meminfo`` (kB there is KiB) and the memory cgroup.

    ``page_cache_bytes`` is ``Cached`` (page cache: what the kernel gives back first under memory pressure);
    ``hugepages_*`` are page counts and ``hugepage_size_bytes`` the default huge page size
    (``Hugepagesize``); ``hugetlb_bytes`` is ``escha_deploy.facts.machine.hugetlb_bytes`` (``Hugetlb``, or
    ``HugePages_Total`` x ``Hugepagesize``), memory the kernel holds for huge pages only (an
    anonymous host pool cannot use it, so the plan subtracts it from MemTotal).
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    mem_total_bytes: int
    mem_available_bytes: int | None
    swap_total_bytes: int = 0
    swap_used_bytes: int = 0
    page_cache_bytes: int | None = None
    hugepages_total: int = 0
    hugepages_free: int = 0
    hugepage_size_bytes: int | None = None
    hugetlb_bytes: int = 0
    cgroup_limit_bytes: int | None = None
    cgroup_usage_bytes: int | None = None


def read_memory(root: Path = Path("/")) -> MemoryFacts:
    """Read ``MemoryFacts`` from ``root``'s ``/proc/meminfo`` and memory cgroup.

    Raises ``OSError`` when ``/proc/meminfo`` is missing, ``KeyError`` when it has no MemTotal.
    """
    mem = read_meminfo(root)
    limit, usage = read_cgroup_memory(root)
    swap_total = mem.get("SwapTotal", 0)
    pages_total = mem.get("HugePages_Total", 0)
    page_size = mem.get("Hugepagesize")
    return MemoryFacts(
        mem_total_bytes=mem["MemTotal"],
        mem_available_bytes=mem.get("MemAvailable"),
        swap_total_bytes=swap_total,
        swap_used_bytes=max(swap_total - mem.get("SwapFree", swap_total), 0),
        page_cache_bytes=mem.get("Cached"),
        hugepages_total=pages_total,
        hugepages_free=mem.get("HugePages_Free", 0),
        hugepage_size_bytes=page_size,
        hugetlb_bytes=hugetlb_bytes(mem),
        cgroup_limit_bytes=limit,
        cgroup_usage_bytes=usage,
    )


def read_memlock(root: Path = Path("/"), pid: str = "self") -> tuple[int | None, int | None]:
    """``(soft, hard)`` locked-memory limit in bytes from ``/proc/<pid>/limits``; ``None`` is
    unlimited. On WSL2 this is not the pinned ceiling (microsoft/WSL#14078 hit ~500 MB with
    ``memlock: -1``), but SGLang's compose sets it to -1 and ``doctor`` reports it.

    Raises ``OSError`` when the file is missing, ``ValueError`` when it has no such line.
    """
    for line in (root / f"proc/{pid}/limits").read_text().splitlines():
        if line.startswith("Max locked memory"):
            fields = line[len("Max locked memory"):].split()
            return _limit(fields[0]), _limit(fields[1])
    raise ValueError(f"{root / f'proc/{pid}/limits'}: no 'Max locked memory' line")


def _limit(text: str) -> int | None:
    return None if text == "unlimited" else int(text)


_TMPFS_SIZE = re.compile(r"(?:^|,)size=(\d+)([kmgKMG%]?)(?:,|$)")


def read_shm_size(root: Path = Path("/")) -> int | None:
    """Size of ``/dev/shm`` in bytes, or ``None`` when there is none.

    Read from the tmpfs ``size=`` option in ``/proc/self/mounts`` (Docker's default is
    ``size=65536k``, 64 MiB: sglang#4259); when the option is absent (tmpfs then defaults
    to half of RAM) or a percentage, from ``statvfs`` on the live path.
    """
    try:
        mounts = (root / "proc/self/mounts").read_text().splitlines()
    except OSError:
        mounts = []
    for line in mounts:
        parts = line.split()
        if len(parts) >= 4 and parts[1] == "/dev/shm":
            m = _TMPFS_SIZE.search(parts[3])
            if m and m.group(2) != "%":
                factor = {"": 1, "k": 1024, "m": 2**20, "g": 2**30}[m.group(2).lower()]
                return int(m.group(1)) * factor
            break
    shm = root / "dev/shm"
    if not shm.is_dir():
        return None
    st = os.statvfs(shm)
    return st.f_blocks * st.f_frsize


class WslSignals(BaseModel):
    """The WSL2 signals, each a plain fact.

    ``kernel``: ``osrelease``/``/proc/version`` names Microsoft's kernel (also true inside a
    container on WSL2, since the kernel is shared). ``dxg``: ``/dev/dxg`` exists (GPU-PV
    reachable; in a container only with ``--gpus all`` or the CDI ``wsl`` spec). ``wsl_lib``:
    ``/usr/lib/wsl/lib`` exists (the Windows driver's user-mode libraries). ``userland``: the
    WSL init's environment or paths are visible (``WSL_DISTRO_NAME``, ``WSL_INTEROP``,
    ``/mnt/wsl``, the ``WSLInterop`` binfmt); absent in containers and sanitized environments.
    ``docker_desktop_socket``: Docker Desktop's WSL integration proxy socket is present.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    osrelease: str | None = None
    kernel: bool = False
    dxg: bool = False
    wsl_lib: bool = False
    userland: bool = False
    docker_desktop_socket: bool = False


#: Docker Desktop's WSL integration proxy socket (docker/for-win#14686, desktop-feedback#423).
DOCKER_DESKTOP_PROXY_SOCKET = "mnt/wsl/docker-desktop/shared-sockets/guest-services/docker.proxy.sock"


def read_wsl_signals(root: Path = Path("/"), environ: Mapping[str, str] | None = None) -> WslSignals:
    """Read ``WslSignals`` from ``root`` and ``environ`` (default ``os.environ``)."""
    environ = os.environ if environ is None else environ
    osrelease = None
    kernel = False
    for rel in ("proc/sys/kernel/osrelease", "proc/version"):
        try:
            text = (root / rel).read_text().strip()
        except OSError:
            continue
        if rel.endswith("osrelease"):
            osrelease = text
        low = text.lower()
        kernel = kernel or "microsoft" in low or "wsl" in low
    userland = (
        "WSL_DISTRO_NAME" in environ
        or "WSL_INTEROP" in environ
        or (root / "mnt/wsl").is_dir()
        or (root / "proc/sys/fs/binfmt_misc/WSLInterop").exists()
    )
    return WslSignals(
        osrelease=osrelease,
        kernel=kernel,
        dxg=(root / "dev/dxg").exists(),
        wsl_lib=(root / "usr/lib/wsl/lib").is_dir(),
        userland=userland,
        docker_desktop_socket=(root / DOCKER_DESKTOP_PROXY_SOCKET).exists(),
    )


DockerKind = Literal["docker-desktop", "engine"]


class DockerFacts(BaseModel):
    """What ``docker info`` says, classified.

    ``kind``: ``docker-desktop`` when ``OperatingSystem`` is "Docker Desktop" or ``Name`` is
    "docker-desktop" (or a ``com.docker.desktop.*`` label is set), else ``engine``.
    ``wsl_kernel``: the daemon's ``KernelVersion`` is a WSL2 kernel (both Docker Desktop's WSL2
    backend and an engine inside a distro; Docker Desktop on Hyper-V or macOS says
    ``linuxkit``). ``gpu_runtimes``: an ``nvidia`` runtime, or CDI devices named
    ``nvidia.com/gpu=...`` that the daemon discovered.
    """

    model_config = ConfigDict(frozen=True, extra="forbid")

    reachable: bool
    error: str | None = None
    kind: DockerKind | None = None
    operating_system: str | None = None
    server_version: str | None = None
    kernel_version: str | None = None
    wsl_kernel: bool = False
    mem_total_bytes: int | None = None
    gpu_runtimes: list[str] = Field(default_factory=list)
    default_runtime: str | None = None


def classify_docker_info(info: Mapping[str, Any]) -> DockerFacts:
    """Classify a ``docker info`` mapping (docker-py ``client.info()`` or
    ``docker info --format '{{json .}}'``; the same keys)."""
    os_name = info.get("OperatingSystem") or ""
    labels = info.get("Labels") or []
    desktop = (
        os_name == "Docker Desktop"
        or info.get("Name") == "docker-desktop"
        or any(str(label).startswith("com.docker.desktop.") for label in labels)
    )
    kernel = info.get("KernelVersion") or ""
    gpu: list[str] = []
    runtimes = info.get("Runtimes") or {}
    gpu += [f"runtime:{name}" for name in runtimes if "nvidia" in name]
    for dev in info.get("DiscoveredDevices") or []:
        dev_id = str(dev.get("ID", ""))
        if dev_id.startswith("nvidia.com/gpu"):
            gpu.append(f"cdi:{dev_id}")
    return DockerFacts(
        reachable=True,
        kind="docker-desktop" if desktop else "engine",
        operating_system=os_name or None,
        server_version=info.get("ServerVersion"),
        kernel_version=kernel or None,
        wsl_kernel="microsoft" in kernel.lower() or "wsl" in kernel.lower(),
        mem_total_bytes=info.get("MemTotal"),
        gpu_runtimes=gpu,
        default_runtime=info.get("DefaultRuntime"),
    )


def read_docker(timeout_s: float = 5.0) -> DockerFacts:
    """Ask the local daemon (``DOCKER_HOST`` or the default socket) for ``docker info``
    through docker-py; ``reachable=False`` with the reason when it does not answer."""
    try:
        import docker
    except ImportError as exc:  # a dependency of escha-deploy, but the image may lack it
        return DockerFacts(reachable=False, error=f"docker-py not installed ({exc})")
    try:
        client = docker.from_env(timeout=int(max(timeout_s, 1)))
        try:
            info = client.info()
        finally:
            client.close()
    except Exception as exc:  # docker.errors.DockerException, requests errors, OSError
        return DockerFacts(reachable=False, error=_first_line(str(exc)) or type(exc).__name__)
    return classify_docker_info(info)


def _first_line(text: str) -> str:
    return text.strip().splitlines()[0] if text.strip() else ""


#: ``wslinfo`` ships with WSL 2.0+ (the Store/MSI release) inside every distro; its
#: ``--networking-mode`` prints ``nat``, ``mirrored``, ``virtioproxy`` or ``none``
#: (learn.microsoft.com/windows/wsl/networking). In NAT mode (the default) the VM has a private
#: address that other machines cannot reach, so a WSL2 box can serve HTTP through a port proxy
#: but cannot be a peer of a multi-node NCCL group.


def read_wsl_networking_mode(timeout_s: float = 5.0) -> str | None:
    """``wslinfo --networking-mode``, lower-cased; ``None`` when ``wslinfo`` is absent (not
    WSL, an old WSL, or inside a container) or does not answer."""
    import shutil
    import subprocess

    exe = shutil.which("wslinfo")
    if exe is None:
        return None
    try:
        out = subprocess.run([exe, "--networking-mode"], capture_output=True, text=True,
                             timeout=timeout_s, check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    mode = out.stdout.strip().lower()
    return mode if out.returncode == 0 and mode else None


class ImageFacts(BaseModel):
    """The server image as the local daemon has it: ``id`` is the content digest of the image
    configuration (``sha256:...``, what ``docker image inspect --format '{{.Id}}'`` prints),
    the same on every box that built or loaded the same image; ``repo_digests`` are registry
    digests (empty for a locally built image). ``error``: why it could not be read."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    ref: str
    id: str | None = None
    repo_digests: list[str] = Field(default_factory=list)
    error: str | None = None


def read_image(ref: str, timeout_s: float = 5.0) -> ImageFacts:
    """Ask the local daemon for image ``ref`` through docker-py; never raises."""
    try:
        import docker
    except ImportError as exc:
        return ImageFacts(ref=ref, error=f"docker-py not installed ({exc})")
    try:
        client = docker.from_env(timeout=int(max(timeout_s, 1)))
        try:
            image = client.images.get(ref)
            return ImageFacts(ref=ref, id=image.id, repo_digests=list(image.attrs.get("RepoDigests") or []))
        finally:
            client.close()
    except Exception as exc:  # docker.errors.ImageNotFound, DockerException, requests errors
        return ImageFacts(ref=ref, error=_first_line(str(exc)) or type(exc).__name__)


class MemlockProbe(BaseModel):
    """Whether the Docker daemon can start a container with ``--ulimit memlock=-1``
    (``launch.docker.memlock_probe``, a one-second ``true`` container). ``ok``: None when the
    probe did not run (``not_run`` says why: no daemon, no image here to run it from)."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    image: str | None = None
    ok: bool | None = None
    error: str | None = None
    not_run: str | None = None


def probe_memlock(images: list[str], timeout_s: float = 60.0) -> MemlockProbe:
    """Run the memlock probe from the first of ``images`` present on the local daemon (the
    profile's image, then the base ``up`` builds on; nothing is pulled). Never raises."""
    try:
        import docker
        from docker.errors import ImageNotFound

        from escha_deploy.launch.docker import memlock_probe
    except ImportError as exc:
        return MemlockProbe(not_run=f"docker-py not installed ({exc})")
    try:
        client = docker.from_env(timeout=int(max(timeout_s, 1)))
    except Exception as exc:  # docker.errors.DockerException
        return MemlockProbe(not_run=f"daemon not reachable: {_first_line(str(exc)) or type(exc).__name__}")
    try:
        for ref in images:
            try:
                client.images.get(ref)
            except ImageNotFound:
                continue
            error = memlock_probe(client, ref, timeout_s)
            return MemlockProbe(image=ref, ok=error is None, error=error)
        return MemlockProbe(not_run=f"no image to run it from: {', '.join(images)} not on this daemon "
                            "(nothing is pulled; `escha-deploy build --hicache` makes the image)")
    except Exception as exc:  # docker errors, requests errors
        return MemlockProbe(not_run=_first_line(str(exc)) or type(exc).__name__)
    finally:
        client.close()


class WslConfigFile(BaseModel):
    """A Windows user's ``%UserProfile%\\.wslconfig`` as this WSL2 VM sees it
    (``/mnt/c/Users/NAME/.wslconfig``). ``encoding_problem``: why WSL ignores the file, when it
    does (UTF-16, or a byte-order mark: WSL reads UTF-8 without one; microsoft/WSL#7851,
    #5383). ``memory_bytes``: ``memory=`` under ``[wsl2]`` (WSL's units are binary: 16GB is
    16 GiB), None when not set; ``memory_text`` as written."""

    model_config = ConfigDict(frozen=True, extra="forbid")

    path: str
    encoding_problem: str | None = None
    memory_text: str | None = None
    memory_bytes: int | None = None
    error: str | None = None


_WSL_UNITS = {"": 1, "b": 1, "k": 2**10, "kb": 2**10, "m": 2**20, "mb": 2**20, "g": 2**30, "gb": 2**30,
              "t": 2**40, "tb": 2**40}


def _wsl_size(text: str) -> int | None:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([a-zA-Z]*)\s*", text)
    if not m or m.group(2).lower() not in _WSL_UNITS:
        return None
    return int(float(m.group(1)) * _WSL_UNITS[m.group(2).lower()])


def read_wslconfig(root: Path = Path("/"), limit: int = 1 << 16) -> list[WslConfigFile]:
    """Every readable ``mnt/c/Users/*/.wslconfig`` under ``root`` (the Windows drive WSL mounts
    at /mnt/c), at most ``limit`` bytes each; never raises."""
    import configparser

    out = []
    users = root / "mnt" / "c" / "Users"
    try:
        candidates = sorted(users.glob("*/.wslconfig"))
    except OSError:
        return out
    for p in candidates:
        try:
            if not p.is_file():
                continue
            raw = p.open("rb").read(limit)
        except OSError:
            continue
        problem = None
        if raw.startswith((b"\xff\xfe", b"\xfe\xff")):
            problem, text = "UTF-16 with a byte-order mark", raw.decode("utf-16", "replace")
        elif b"\x00" in raw[:64]:
            problem = "UTF-16 without a byte-order mark"
            text = raw.decode("utf-16-le" if raw[1:2] == b"\x00" else "utf-16-be", "replace")
        elif raw.startswith(b"\xef\xbb\xbf"):
            problem, text = "UTF-8 with a byte-order mark", raw[3:].decode("utf-8", "replace")
        else:
            text = raw.decode("utf-8", "replace")
        parser = configparser.ConfigParser(strict=False, interpolation=None)
        try:
            parser.read_string(text)
            mem = parser.get("wsl2", "memory", fallback=None)
        except configparser.Error as exc:
            out.append(WslConfigFile(path=str(p), encoding_problem=problem,
                                     error=" ".join(str(exc).split())[:200]))
            continue
        out.append(WslConfigFile(path=str(p), encoding_problem=problem, memory_text=mem.strip() if mem else None,
                                 memory_bytes=_wsl_size(mem) if mem else None))
    return out
