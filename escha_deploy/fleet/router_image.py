"""``fleet build-router``: the router image, built locally from PyPI's ``smg`` wheel.

The upstream image (``lightseekorg/smg``) holds the same binary; building it here needs no image
registry beyond the base (any Debian image whose ``python3`` can ``pip install``: the CI uses
the local base image SGLang's test images are built on). The wheels are downloaded on this
machine with pip (``smg`` 1.13.0: its Rust router is ``smg/smg_rs.abi3.so``; ``setproctitle``, the
only import ``smg launch`` needs beyond it), copied into the build context and installed with
``--no-index --no-deps``; ``smg_launch.py`` goes to ``/usr/local/bin`` (the key-from-file
launcher). docker-py's classic builder, as ``escha-deploy build``.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from ..utils.errors import Failed
from .model import IMAGE_SMG, SMG_VERSION
from .router import launcher_path

#: What the image installs, pinned (``smg launch`` imports ``setproctitle``; smg's other
#: requirements serve its gRPC worker mode, which the router in front of HTTP workers does not load).
WHEELS = (f"smg=={SMG_VERSION}", "setproctitle==1.3.8")

DOCKERFILE = """\
ARG BASE_IMAGE
FROM ${BASE_IMAGE}
COPY wheels /tmp/smg-wheels
RUN python3 -m pip install --no-index --no-deps --no-cache-dir /tmp/smg-wheels/*.whl && rm -rf /tmp/smg-wheels \\
 && python3 -c "import smg.launch_router, setproctitle"
COPY smg_launch.py /usr/local/bin/smg_launch.py
LABEL org.opencontainers.image.title="SMG router for escha-deploy" \\
      org.opencontainers.image.version="%(version)s" \\
      io.escha.smg-version="%(version)s"
ENTRYPOINT []
CMD ["python3", "/usr/local/bin/smg_launch.py", "--help"]
"""


def download_wheels(dest: Path, python_version: str = "3.11") -> list[Path]:
    """``pip download`` the pinned wheels for Linux x86-64 and ``python_version`` into ``dest``.
    ``Failed`` with pip's last line when it cannot."""
    cmd = [sys.executable, "-m", "pip", "download", "-q", "--no-deps", "--only-binary=:all:",
           "--python-version", python_version, "--implementation", "cp",
           "--platform", "manylinux2014_x86_64", "--platform", "manylinux_2_17_x86_64",
           "--platform", "manylinux_2_28_x86_64", "--platform", "manylinux_2_5_x86_64", "-d", str(dest), *WHEELS]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        last = (r.stderr.strip().splitlines() or ["pip failed"])[-1]
        raise Failed(f"downloading {', '.join(WHEELS)}: {last}")
    return sorted(dest.glob("*.whl"))


def build_router_image(base_image: str, tag: str = IMAGE_SMG, python_version: str = "3.11",
                       progress=None) -> str:
    """Build the router image; return its id (``sha256:...``). ``progress(line)`` gets the
    builder's step lines. ``Failed`` (exit 4) when a step fails, with the builder's message."""
    import docker

    client = docker.from_env()
    with tempfile.TemporaryDirectory(prefix="escha-smg-") as tmp:
        ctx = Path(tmp)
        download_wheels(ctx / "wheels", python_version)
        shutil.copy(launcher_path(), ctx / "smg_launch.py")
        (ctx / "Dockerfile").write_text(DOCKERFILE % {"version": SMG_VERSION})
        image_id = None
        for chunk in client.api.build(path=str(ctx), tag=tag, buildargs={"BASE_IMAGE": base_image}, rm=True,
                                      forcerm=True, decode=True):
            if "error" in chunk:
                raise Failed(f"building {tag}: {chunk['error'].strip()}")
            if progress and chunk.get("stream", "").startswith("Step "):
                progress(chunk["stream"].strip())
            if "aux" in chunk and "ID" in chunk["aux"]:
                image_id = chunk["aux"]["ID"]
    return image_id or client.images.get(tag).id
