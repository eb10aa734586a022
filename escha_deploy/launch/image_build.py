"""``up --build``: build the profile's image when it is absent, before `up` plans (its
preflight's ``image`` check runs it)."""

from __future__ import annotations

import sys

from escha_deploy.errors import Refused

from .progress import Report, quiet


def build_image(client, image: str, *, report: Report = quiet) -> None:
    """``--build``: when ``image`` is absent, build it with ``escha-deploy build --hicache --tag
    IMAGE`` (the builder, run as a child of this same installation; its progress goes to
    stderr). Raises ``Refused`` (exit 3, nothing created) when the build fails."""
    import subprocess

    from . import docker as dk

    if dk.image_labels(client, image) is not None:
        return
    report("info", f"up: building {image} (escha-deploy build --hicache)")
    r = subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", "build", "--hicache",
                        "--tag", image], stdout=sys.stderr)
    if r.returncode != 0:
        raise Refused(f"--build: `escha-deploy build --hicache --tag {image}` failed (exit {r.returncode})")
