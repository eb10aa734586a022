"""`escha-deploy model pull PROFILE|REPO[@REV]` and `model verify FOLDER`, on ``huggingface_hub``.

A pull, in order, nothing written before the checks that can refuse it:

1. resolve: ``HfApi.model_info(repo, revision, files_metadata=True)``: the commit the revision
   points at and, per file, its size and hash as the hub records them (``lfs.sha256`` for a
   Git LFS file, ``blobId`` for a file kept in Git). A repository or revision that does not
   exist is bad input (exit 2), naming it.
2. the folder: one that holds another model (its lock file names another repository, or its
   weights or config.json were not fetched by a pull: no ``.cache/huggingface/download``
   record) is refused (exit 3); so is a revision that moved since the folder's lock file
   pinned it (a branch now at another commit), unless ``update``.
3. what SGLang needs: the configuration, tokenizer and chat-template files at the top of the
   repository, and the safetensors shards its ``model.safetensors.index.json`` names (all
   top-level ``*.safetensors`` without an index); never ``*.bin``, ``*.pt``, GGUF or
   sub-folders (SGLang loads safetensors first: ``model_loader/loader.py``
   ``DefaultModelLoader._prepare_weights``).
4. the disk: the bytes still to fetch (the files' recorded sizes, less what is complete or
   partly there) against the free space where the folder is (``shutil.disk_usage``), before
   the first byte (exit 3 when short).
5. the download: ``hf_hub_download(local_dir=folder)`` per file at the resolved commit (its
   progress bar; a partial file is resumed with an HTTP Range request); a disk that fills
   mid-download is refused naming the file (exit 3), the partial file kept for the next pull.
6. verify: every file's size and hash against the hub's record; a mismatch is refused naming
   the file (exit 3) and the file removed, never used as if whole.
7. the lock file (``lock.ModelLock``) beside the weights.

Offline (``offline`` or ``HF_HUB_OFFLINE=1``): no request is sent; the folder is checked against
its lock file, as `model verify` does. The token comes from a file (``container.hf_token_file``
or ``--token-file``) and is never printed: messages go through ``redact``.
"""

from __future__ import annotations

import datetime as dt
import fnmatch
import os
import shutil
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from escha_deploy.utils.errors import BadInput, Refused

from .lock import LOCK_NAME, LockedFile, ModelLock, file_problem, read_lock, verify_folder, write_lock

#: The hub when ``HF_ENDPOINT`` is not set (``huggingface_hub.constants.ENDPOINT``'s default).
DEFAULT_ENDPOINT = "https://huggingface.co"
#: Top-level files SGLang (and the tokenizer it loads through transformers) reads besides the
#: weights: configuration, tokenizer, chat template, remote code.
SUPPORT_PATTERNS = ("*.json", "*.txt", "*.model", "*.jinja", "*.tiktoken", "*.py")
INDEX = "model.safetensors.index.json"
#: Files a folder can hold that a pull did not fetch, without being another model's.
OURS = (LOCK_NAME, ".cache", ".gitattributes")

Report = Callable[[str], None]


def endpoint() -> str:
    """The hub: ``HF_ENDPOINT`` (as ``huggingface_hub`` reads it), else ``DEFAULT_ENDPOINT``."""
    return (os.environ.get("HF_ENDPOINT") or DEFAULT_ENDPOINT).rstrip("/")


def offline_env() -> bool:
    """``HF_HUB_OFFLINE`` set to a true value (``huggingface_hub``'s own switch)."""
    return os.environ.get("HF_HUB_OFFLINE", "").strip().upper() in ("1", "ON", "YES", "TRUE")


def parse_ref(text: str) -> tuple[str, str | None]:
    """``REPO[@REV]`` -> ``(repo, rev)``. Raises ``BadInput`` for anything but ``OWNER/NAME``
    (the hub's repository id) with an optional non-empty revision."""
    repo, _, rev = text.partition("@")
    parts = repo.split("/")
    if len(parts) != 2 or not all(parts) or any(c.isspace() for c in repo) or ".." in repo:
        raise BadInput(f"model pull: {text!r} is not a repository id (OWNER/NAME[@REVISION])")
    if "@" in text and not rev:
        raise BadInput(f"model pull: {text!r}: empty revision after @")
    return repo, rev or None


@dataclass(frozen=True)
class HubFile:
    """One file of the resolved revision as the hub records it."""

    name: str
    size: int
    sha256: str | None
    git_sha1: str | None

    def locked(self) -> LockedFile:
        return LockedFile(name=self.name, size=self.size, sha256=self.sha256, git_sha1=self.git_sha1)


@dataclass
class PullResult:
    """What a pull did: the lock it wrote (or read, offline), the files fetched now and those
    already complete, the bytes fetched."""

    folder: Path
    lock: ModelLock
    fetched: list[str] = field(default_factory=list)
    present: list[str] = field(default_factory=list)
    fetched_bytes: int = 0


def wanted(names: list[str], index_weights: list[str] | None) -> list[str]:
    """The files of a revision SGLang needs (module docstring, step 3), sorted: top-level
    support files, and the shards ``index_weights`` names (else every top-level safetensors)."""
    top = [n for n in names if "/" not in n]
    support = [n for n in top if any(fnmatch.fnmatch(n, p) for p in SUPPORT_PATTERNS)]
    shards = sorted(set(index_weights)) if index_weights is not None else [n for n in top if n.endswith(".safetensors")]
    return sorted(set(support) | set(shards))


def _free_bytes(folder: Path) -> int:
    p = folder
    while not p.exists() and p != p.parent:
        p = p.parent
    return shutil.disk_usage(p).free


def _partial_bytes(folder: Path, name: str) -> int:
    """Bytes of ``name`` already here: the whole file, or its ``.incomplete`` partial download
    (``huggingface_hub``'s local-dir layout, ``.cache/huggingface/download``)."""
    f = folder / name
    if f.is_file():
        return f.stat().st_size
    d = (folder / ".cache" / "huggingface" / "download" / name).parent
    if not d.is_dir():
        return 0
    base = Path(name).name
    return max((p.stat().st_size for p in d.glob(f"{base}.*.incomplete") if p.is_file()), default=0)


def _pulled_here(folder: Path, name: str) -> bool:
    """Whether ``name`` in ``folder`` was fetched by a pull (its download record exists)."""
    return (folder / ".cache" / "huggingface" / "download" / f"{name}.metadata").is_file()


def _recorded_etag(folder: Path, name: str) -> str | None:
    """The etag ``huggingface_hub`` recorded when it fetched ``name`` into ``folder`` (its
    download record: the commit, the etag and the time, one a line; ``_local_folder.py:
    write_download_metadata``); None without one."""
    try:
        lines = (folder / ".cache" / "huggingface" / "download" / f"{name}.metadata").read_text().splitlines()
    except (OSError, UnicodeDecodeError):
        return None
    return lines[1].strip().strip('"') if len(lines) >= 2 else None


def _complete(folder: Path, f: HubFile) -> bool:
    """Whether a pull already fetched this very file whole: its size, and a download record
    whose etag is the hub's for it (the sha256 of an LFS file, the Git blob id otherwise); its
    bytes are hashed with every other file's after the download."""
    p = folder / f.name
    return (p.is_file() and p.stat().st_size == f.size
            and _recorded_etag(folder, f.name) in {h for h in (f.sha256, f.git_sha1) if h})


def foreign_files(folder: Path) -> list[str]:
    """Weights and configuration in ``folder`` that no pull fetched: another model's files."""
    if not folder.is_dir():
        return []
    out = []
    for p in sorted(folder.iterdir()):
        if p.name in OURS:
            continue
        if (p.suffix in (".safetensors", ".bin", ".pt", ".gguf") or p.name == "config.json") and not _pulled_here(folder, p.name):
            out.append(p.name)
    return out


def _hub_error(exc: BaseException, repo: str, rev: str | None, where: str, mask: Callable[[str], str]):
    """One ``EschaError`` for a ``huggingface_hub`` error (exit 2 for a repository or
    revision that does not exist, 3 for the rest), never the token."""
    from huggingface_hub.errors import (GatedRepoError, HfHubHTTPError, RepositoryNotFoundError,
                                        RevisionNotFoundError)

    if isinstance(exc, GatedRepoError):
        return Refused(f"model pull: {repo}: gated on {where}; accept its terms there and give a token",
                       hint="put the token in a file and name it with --token-file or container.hf_token_file")
    if isinstance(exc, RevisionNotFoundError):
        return BadInput(f"model pull: {repo}@{rev}: no such revision on {where}")
    if isinstance(exc, RepositoryNotFoundError):
        return BadInput(f"model pull: {repo}: no such repository on {where} (or it is private: give a token "
                        "with --token-file or container.hf_token_file)")
    if isinstance(exc, HfHubHTTPError):
        code = exc.response.status_code if exc.response is not None else "?"
        return Refused(f"model pull: {repo}: {where} answered HTTP {code}")
    if not _network_error(exc):  # it answered: JSON of another shape, not JSON at all
        return Refused(f"model pull: {repo}: {where} answered something that is not the hub's API "
                       f"({mask(type(exc).__name__)})",
                       hint="is HF_ENDPOINT the hub (or a mirror of its API)?")
    return Refused(f"model pull: {repo}: cannot reach {where} ({mask(type(exc).__name__)})",
                   hint="offline: --offline (or HF_HUB_OFFLINE=1) checks the folder against its lock file")


def _network_error(exc: BaseException) -> bool:
    """Whether ``exc`` says the hub was not reached (the HTTP client's transport errors, the
    system's), as opposed to an answer the hub's client could not read. The client's classes
    are matched by name along the exception's bases: huggingface_hub 2.x sends through
    ``httpx2`` (``TransportError``), 1.x through ``httpx``, older releases through ``requests``
    (``ConnectionError``, ``Timeout``)."""
    if isinstance(exc, (OSError, TimeoutError)):
        return True
    return any(c.__name__ in ("TransportError", "ConnectionError", "Timeout") for c in type(exc).__mro__)


def resolve(repo: str, rev: str | None, *, token: str | None, where: str,
            mask: Callable[[str], str]) -> tuple[str, list[HubFile]]:
    """``(commit, files)`` of ``repo`` at ``rev`` (default ``main``) as the hub records them."""
    from huggingface_hub import HfApi

    try:
        info = HfApi(endpoint=where, token=token or False).model_info(repo, revision=rev, files_metadata=True)
    except Exception as exc:  # huggingface_hub's errors and the HTTP client's, mapped one by one
        raise _hub_error(exc, repo, rev, where, mask) from None
    if not info.sha:
        raise Refused(f"model pull: {repo}: {where} named no commit for {rev or 'main'}")
    files = []
    for s in info.siblings or []:
        if s.size is None:
            raise Refused(f"model pull: {repo}: {where} recorded no size for {s.rfilename}")
        files.append(HubFile(s.rfilename, s.size, s.lfs.sha256 if s.lfs else None, None if s.lfs else s.blob_id))
    return info.sha, files


def pull(repo: str, rev: str | None, folder: str | Path, *, token: str | None = None, offline: bool = False,
         update: bool = False, report: Report = lambda _: None, progress: bool = True) -> PullResult:
    """Pull ``repo`` at ``rev`` into ``folder`` (module docstring). Raises ``BadInput`` (2)
    or ``Refused`` (3), one line naming the repository, revision, file or folder."""
    from escha_deploy.utils.redact import Redactor

    dest = Path(folder)
    mask = Redactor([token] if token else [])
    where = endpoint()
    existing = read_lock(dest) if dest.is_dir() else None
    if existing is not None and existing.repo != repo:
        raise Refused(f"model pull: {dest} holds {existing.pin()} (its {LOCK_NAME}), not {repo}",
                      hint="pull into another folder (--to DIR), or remove that one first")
    if offline or offline_env():
        return _offline(dest, repo, rev, existing)
    foreign = foreign_files(dest) if existing is None else []
    if foreign:
        raise Refused(f"model pull: {dest} holds files no pull of {repo} fetched ({', '.join(foreign[:4])}"
                      f"{', ...' if len(foreign) > 4 else ''}): another model's",
                      hint="pull into an empty folder (--to DIR)")
    commit, files = resolve(repo, rev, token=token, where=where, mask=mask)
    asked = rev or "main"
    if existing is not None and existing.revision == asked and existing.commit != commit and not update:
        raise Refused(f"model pull: {repo}@{asked} moved: {dest} holds commit {existing.commit[:12]} (its "
                      f"{LOCK_NAME}), the hub's {asked} is now {commit[:12]}",
                      hint=f"--update pulls {commit[:12]}; {repo}@{existing.commit} keeps what is there")
    by_name = {f.name: f for f in files}
    index_weights = None
    if INDEX in by_name:
        index_weights = _index_weights(repo, commit, dest, by_name[INDEX], token=token, where=where, mask=mask)
        missing = [n for n in index_weights if n not in by_name]
        if missing:
            raise Refused(f"model pull: {repo}@{commit[:12]}: {INDEX} names shards the repository lacks: "
                          f"{', '.join(missing[:3])}")
    names = wanted(list(by_name), index_weights)
    if not any(n.endswith(".safetensors") for n in names):
        raise BadInput(f"model pull: {repo}@{commit[:12]} has no safetensors weights (SGLang's format here)")
    todo = [by_name[n] for n in names]
    need = sum(max(f.size - _partial_bytes(dest, f.name), 0) for f in todo if not _complete(dest, f))
    free = _free_bytes(dest)
    if need > free:
        from escha_deploy.utils.units import fmt_gb

        raise Refused(f"model pull: {repo}@{commit[:12]} needs {fmt_gb(need)} more in {dest}, which has "
                      f"{fmt_gb(free)} free (shutil.disk_usage)", hint="free space there, or pull elsewhere (--to DIR)")
    dest.mkdir(parents=True, exist_ok=True)
    result = PullResult(dest, existing or _lock(repo, asked, commit, where, todo))
    for f in todo:
        if _complete(dest, f):  # hashed with the others below
            result.present.append(f.name)
            continue
        report(f"model pull: {f.name} ({f.size:,} B)")
        _download(repo, commit, dest, f, token=token, where=where, mask=mask, progress=progress)
        result.fetched.append(f.name)
        result.fetched_bytes += f.size
    bad = []
    for f in todo:
        why = file_problem(dest, f.locked())
        if why is not None:
            bad.append(why)
            (dest / f.name).unlink(missing_ok=True)  # never used as if whole
            (dest / ".cache" / "huggingface" / "download" / f"{f.name}.metadata").unlink(missing_ok=True)
    if bad:
        raise Refused(*(f"model pull: {b}; removed" for b in bad),
                      hint="pull again; a file that differs again is not what the hub records")
    result.lock = _lock(repo, asked, commit, where, todo)
    write_lock(dest, result.lock)
    return result


def _lock(repo: str, asked: str, commit: str, where: str, files: list[HubFile]) -> ModelLock:
    now = dt.datetime.now(dt.timezone.utc).replace(microsecond=0).isoformat()
    return ModelLock(repo=repo, revision=asked, commit=commit, endpoint=where, pulled_at=now,
                     files=[f.locked() for f in files])


def _download(repo: str, commit: str, dest: Path, f: HubFile, *, token: str | None, where: str,
              mask: Callable[[str], str], progress: bool) -> None:
    import errno

    from huggingface_hub import hf_hub_download

    try:
        if not progress:
            from huggingface_hub.utils import disable_progress_bars

            disable_progress_bars()
        hf_hub_download(repo, f.name, revision=commit, local_dir=dest, token=token or False, endpoint=where)
    except OSError as exc:
        if exc.errno in (errno.ENOSPC, errno.EDQUOT):
            raise Refused(f"model pull: {dest / f.name}: the disk filled while downloading it; the partial file "
                          "is kept and the next pull resumes it", hint="free space there, then pull again") from None
        raise _hub_error(exc, repo, commit, where, mask) from None
    except Exception as exc:
        raise _hub_error(exc, repo, commit, where, mask) from None


def _index_weights(repo: str, commit: str, dest: Path, f: HubFile, *, token: str | None, where: str,
                   mask: Callable[[str], str]) -> list[str]:
    """The shard names of the revision's ``model.safetensors.index.json`` (its ``weight_map``
    values), fetched first (a few kB)."""
    from escha_deploy.utils.jsonio import loads_json, read_regular

    dest.mkdir(parents=True, exist_ok=True)
    _download(repo, commit, dest, f, token=token, where=where, mask=mask, progress=False)
    p = dest / INDEX
    data = loads_json(read_regular(p, "a safetensors index"), p, "a safetensors index")
    wm = data.get("weight_map") if isinstance(data, dict) else None
    if not isinstance(wm, dict) or not all(isinstance(v, str) and "/" not in v for v in wm.values()):
        raise Refused(f"model pull: {p}: no weight_map of top-level shard names")
    return sorted(set(wm.values()))


def _offline(dest: Path, repo: str, rev: str | None, existing: ModelLock | None) -> PullResult:
    if existing is None:
        raise BadInput(f"model pull --offline: {dest} has no {LOCK_NAME}: nothing pulled to read there",
                       hint="pull it once online")
    if rev and rev not in (existing.revision, existing.commit) and not existing.commit.startswith(rev):
        raise Refused(f"model pull --offline: {dest} holds {existing.pin()}, not {repo}@{rev}")
    lock, problems = verify_folder(dest)
    if problems:
        raise Refused(*(f"model pull --offline: {p}" for p in problems), hint="pull again online to fetch them")
    return PullResult(dest, lock, present=[f.name for f in lock.files])
