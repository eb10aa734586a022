"""``up --build``: build the profile's image when it is absent, before `up` plans (its
preflight's ``image`` check runs it)."""

from __future__ import annotations

import sys

from escha_deploy.utils.errors import Refused

from .progress import Report, quiet


def build_image(client, image: str, *, base_image: str | None = None, release: str | None = None,
                report: Report = quiet) -> None:
    """``--build``: when ``image`` is absent, build it with ``escha-deploy build --hicache --tag
    IMAGE`` on ``base_image`` (the profile's ``runtime.base_image``) for ``release`` (its
    ``runtime.sglang_version``; None: the release the base's tag names, else the default one),
    the builder run as a child of this same installation; its progress goes to stderr. Raises
    ``Refused`` (exit 3, nothing created) when the build fails."""
    import subprocess

    from . import docker as dk

    if dk.image_labels(client, image) is not None:
        return
    argv = ["build", "--hicache", "--tag", image]
    if base_image:
        argv += ["--base-image", base_image]
    if release:
        argv += ["--sglang-version", release]
    report("info", f"up: building {image} (escha-deploy {' '.join(argv)})")
    r = subprocess.run([sys.executable, "-m", "escha_deploy.cli.main", *argv], stdout=sys.stderr)
    if r.returncode != 0:
        raise Refused(f"--build: `escha-deploy {' '.join(argv)}` failed (exit {r.returncode})")
