"""``escha-deploy build``: build the stock or the patched (``--hicache``) image with docker-py.

The classic builder (docker-py's ``APIClient.build``; no BuildKit, no buildx here), with the
build's own step lines as progress on stderr. The release (``--sglang-version``) picks the
base image, the series (``runtime_patches/`` or ``runtime_patches/<release>/``) and the tag from
the release data (``releases.official_image``, ``releases.image_tag``). The series (with a fork's
imported commits, in their order), its capabilities, the release and the base image are passed as
build arguments; the Dockerfile mirrors them in ``io.escha.`` labels and
``runtime apply --expect-*`` refuses a build whose series disagrees. A fork's commits' provenance
(hash, subject, author, date) goes into the ``io.escha.runtime.fork`` label. A failed step is reported
with escha-deploy's own ``error:`` lines from the build log (a reject names the patch and file).
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Annotated, Optional

import typer

from escha_deploy.cli.app import PANEL_RUNTIME
from escha_deploy.cli.options import FormatOpt, OutputFormat

_ANSI = re.compile(r"\x1b\[[0-9;]*m")


def build_args(base_image: str, python_version: str, wheelhouse: str, overlay_dir: str,
               patches: list | None, release: str | None = None) -> dict[str, str]:
    """The Dockerfiles' build arguments. ``patches`` (series + overlays) for the hicache image,
    ``None`` for the stock one; ``release``: the SGLang release the base image holds (default:
    the default release; ``SGLANG_VERSION``: the image's label, and ``runtime apply
    --expect-sglang-version`` refuses a base that holds another)."""
    from escha_deploy.sglang.releases import default_release
    from escha_deploy.runtime.series import capabilities_of

    args = {"BASE_IMAGE": base_image, "PYTHON_VERSION": python_version, "WHEELHOUSE": wheelhouse,
            "SGLANG_VERSION": release or default_release()}
    if patches is not None:
        args.update({
            "OVERLAY_DIR": overlay_dir,
            "ESCHA_SERIES": ",".join(p.name for p in patches),
            "ESCHA_CAPABILITIES": ",".join(capabilities_of(patches)),
        })
    return args


def base_missing(client, base_image: str) -> None:
    """Refuse (exit 3, nothing started) when ``base_image`` is not on the daemon, naming it and
    the pull command: the classic builder would pull a missing ``FROM`` image on its own, and
    SGLang's image is tens of GB (``releases.official_image``). ``build`` never pulls."""
    from docker.errors import NotFound

    from escha_deploy.utils.errors import Refused

    try:
        client.inspect_image(base_image)
    except NotFound:  # docker-py's ImageNotFound is one
        repo = base_image.split("@", 1)[0]
        if ":" in repo.rsplit("/", 1)[-1]:  # drop the tag, not a registry's port
            repo = repo.rsplit(":", 1)[0]
        pin = "" if "@sha256:" in base_image else (
            f"; to pin it, build with --base-image {repo}@sha256:DIGEST, the digest "
            f"`docker image inspect --format '{{{{index .RepoDigests 0}}}}' {base_image}` prints after the pull")
        raise Refused(f"--base-image {base_image}: not on this Docker daemon; build pulls nothing (the "
                      "SGLang image is tens of GB)",
                      hint=f"pull it first: docker pull {base_image}{pin} (README.md, docs/runtime.md)") from None


def _base_lock(ctx: Path, base_lock: str | None, built: str | None, version: str) -> dict[str, str] | None:
    """The build arguments of the lock file (``BASE_LOCK_DIR``, ``BASE_LOCK``) the image build checks
    its base's tree against, read and checked here first: ``--base-lock`` (relative to the context
    ``ctx``), else ``runtime.lock.DEFAULT_LOCK`` when the base is ``built`` from a commit. ``BadInput``
    (exit 2, nothing started) for a lock that is missing, outside the context, not a lock file, or
    that pins another version than ``version``."""
    from escha_deploy.runtime.lock import DEFAULT_LOCK, read_lock
    from escha_deploy.utils.errors import BadInput

    if base_lock is None and built is None:
        return None
    rel = Path(base_lock or DEFAULT_LOCK)
    path = (ctx / rel).resolve()
    folder = path.parent.relative_to(ctx.resolve()).as_posix() if path.is_relative_to(ctx.resolve()) else None
    if folder is None or not (folder == "runtime_base" or re.fullmatch(r"build/base-[^/]+", folder)):
        # .dockerignore sends only these folders to the daemon
        raise BadInput(f"--base-lock {rel}: must be a file in runtime_base/ or build/base-NAME/ of the build "
                       f"context {ctx} (the folders .dockerignore sends to the build)")
    if not path.is_file():
        raise BadInput(f"--base-lock {rel}: no such file in {ctx}",
                       hint=f"pin the tree first: `escha-deploy runtime lock --python SGLANG_PY --output {ctx / DEFAULT_LOCK}`"
                       " in the base image or a copy of its tree (docs/runtime.md, \"A commit-built base\")")
    lock = read_lock(path)
    if lock.version != version:
        raise BadInput(f"--base-lock {rel}: pins SGLang {lock.version}, but --sglang-version is {version}",
                       hint="name one version: the lock's, or lock the tree the base image holds")
    return {"BASE_LOCK_DIR": folder, "BASE_LOCK": path.name}


def register(app: typer.Typer) -> None:
    @app.command("build", rich_help_panel=PANEL_RUNTIME)
    def build_cmd(
        hicache: Annotated[bool, typer.Option(
            "--hicache/--stock", help="Dockerfile.hicache (escha-deploy's patch series + overlays) or "
            "docker/Dockerfile (stock runtime, no patches).")] = True,
        base_image: Annotated[Optional[str], typer.Option(
            "--base-image", help="The SGLang image to build on, holding --sglang-version; pin it by digest "
            "(NAME@sha256:...). Default: that release's official image "
            "(escha_deploy/catalog/releases/X.Y.Z/facts.yaml).")] = None,
        sglang_version: Annotated[Optional[str], typer.Option(
            "--sglang-version", help="The SGLang release the base image holds: picks the series, the default "
            "base image and tag. Default: the release --base-image's tag names, else the default release "
            "(escha_deploy/catalog/releases/index.yaml).")] = None,
        python_version: Annotated[str, typer.Option(
            "--python-version", help="python3's version in the base image (official image "
            "3.12, the Debian test base 3.11); picks the wheelhouse.")] = "3.12",
        tag: Annotated[Optional[str], typer.Option(
            "--tag", "-t", help="Image name. Default: the release's hicache or stock tag "
            "(escha_deploy/catalog/releases/index.yaml, image_tags).")] = None,
        context: Annotated[Optional[Path], typer.Option(
            "--context", help="Build context: an escha-deploy source checkout. Default: this "
            "one.")] = None,
        overlay_dir: Annotated[str, typer.Option(
            "--overlay-dir", help="Folder of your overlays, relative to the context.")]
            = "runtime_overlays",
        fork_dir: Annotated[str, typer.Option(
            "--fork-dir", help="Folder of a fork's commits imported by `escha-deploy runtime "
            "import`, relative to the context; applied with escha-deploy's series in the order its "
            "escha-fork.yaml gives.")] = "runtime_fork",
        base_lock: Annotated[Optional[str], typer.Option(
            "--base-lock", help="The lock file of a commit-built SGLang in --base-image (`escha-deploy runtime "
            "lock`), relative to the context; the build refuses a tree that does not match it. Default: "
            "runtime_base/sglang.lock.json when --sglang-version is built from a commit (docs/runtime.md, "
            "\"A commit-built base\").")] = None,
        fmt: FormatOpt = OutputFormat.table,
    ) -> None:
        """Build the runtime image (classic builder, progress on stderr)."""
        import docker
        from docker.errors import APIError, DockerException

        from escha_deploy.cli.output import info, print_json, warn
        from escha_deploy.utils.errors import BadInput, Failed, Refused
        from escha_deploy.utils.paths import source_checkout
        from escha_deploy.sglang.releases import check_supported, default_release, image_tag, image_tag_release, official_image
        from escha_deploy.runtime import patching

        from escha_deploy.sglang.releases import is_built_version, nearest_release

        built = sglang_version if sglang_version and is_built_version(sglang_version) else None
        if built:  # built from a commit: its nearest release's series, its own pinned tree
            release = nearest_release(built, "--sglang-version")
            if not base_image:
                raise BadInput(f"--sglang-version {built}: built from a commit, so no official image holds it; "
                               "name the image that does with --base-image NAME@sha256:...")
        else:
            release = check_supported(sglang_version or (base_image and image_tag_release(base_image))
                                      or default_release(), "--sglang-version")
        base_image = base_image or official_image(release)

        dockerfile = "Dockerfile.hicache" if hicache else "docker/Dockerfile"
        # default: the checkout you are in, else the source checkout this package runs from
        ctx = context.resolve() if context else source_checkout(dockerfile=dockerfile)
        if ctx is None:
            raise BadInput(f"no {dockerfile} in {Path.cwd()} or beside the installed package: "
                           "build from an escha-deploy source checkout (--context)")
        if not (ctx / dockerfile).is_file():
            raise BadInput(f"--context {ctx}: no {dockerfile} (build from a source checkout)")
        wheelhouse = f"build/wheelhouse-py{python_version}"
        if not any((ctx / wheelhouse).glob("escha_deploy-*.whl")):
            raise BadInput(f"{ctx / wheelhouse}: no escha-deploy wheelhouse for Python "
                           f"{python_version}",
                           hint=f"scripts/build-wheelhouse.sh {python_version}")
        lock_arg = _base_lock(ctx, base_lock, built, sglang_version or release) if hicache else None
        patches = None
        if hicache:
            if not (ctx / overlay_dir).is_dir():
                raise BadInput(f"--overlay-dir {overlay_dir}: not a folder under {ctx}")
            if not (ctx / fork_dir).is_dir():
                raise BadInput(f"--fork-dir {fork_dir}: not a folder under {ctx}")
            patches = patching.load_patches(ctx / overlay_dir, ctx / fork_dir, release)
        if "@sha256:" not in base_image:
            warn(f"--base-image {base_image} is not pinned by digest; the build is not "
                 "reproducible (use NAME@sha256:...)")
        args = build_args(base_image, python_version, wheelhouse, overlay_dir, patches, built or release)
        if lock_arg is not None:
            args.update(lock_arg)
        from escha_deploy import __version__
        from escha_deploy.runtime.description import LABEL_ESCHA

        labels = {LABEL_ESCHA: __version__}  # the CLI the image's `serve --spec` runs
        if patches is not None:
            from escha_deploy.runtime.description import LABEL_FORK
            from escha_deploy.runtime.patching import fork_label

            args["FORK_DIR"] = fork_dir
            if fork_label(patches):  # provenance of the fork's commits, non-ASCII kept
                labels[LABEL_FORK] = fork_label(patches)
        tag = tag or image_tag("hicache" if hicache else "stock", release, built=built)
        try:
            client = docker.APIClient(version="auto")
            base_missing(client, base_image)  # before the build starts: it would pull tens of GB itself
            stream = client.build(path=str(ctx), dockerfile=dockerfile, tag=tag, buildargs=args,
                                  rm=True, forcerm=True, decode=True, labels=labels or None)
            image_id, log_tail, error = None, [], None
            for chunk in stream:
                if "stream" in chunk:
                    # the classic builder wraps a step's stderr in ANSI colour codes
                    for line in _ANSI.sub("", chunk["stream"]).splitlines():
                        if line.strip():
                            log_tail = (log_tail + [line])[-200:]
                            info(line)
                if "aux" in chunk and "ID" in chunk["aux"]:
                    image_id = chunk["aux"]["ID"]
                if "error" in chunk:
                    error = chunk["error"].strip()
        except (DockerException, APIError) as exc:
            raise Failed(f"docker: {exc}", hint="is dockerd running? (.ci/dockerd.sh)") from None
        if error is not None:
            ours = [ln.removeprefix("error: ") for ln in log_tail if ln.startswith("error: ")]
            raise Refused(*(ours or [error]), f"build of {dockerfile} failed: {error}")
        labels = client.inspect_image(tag)["Config"]["Labels"] or {}
        result = {"image": tag, "id": image_id, "dockerfile": dockerfile, "sglang_version": release,
                  "base_image": base_image, "labels": labels}
        if fmt == OutputFormat.json:
            print_json(result)
        else:
            print(f"built {tag} ({image_id}) from {dockerfile} on {base_image} (SGLang {release})")
