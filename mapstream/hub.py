"""Checkpoint downloads from the Hugging Face hub (cached, offline-aware).

    path = download_checkpoint("robbyant/lingbot-map", "lingbot-map-long.pt")

Files are cached by `huggingface_hub` (default `~/.cache/huggingface/hub`, or `HF_HUB_CACHE`,
or `cache_dir=`); a cached file is used without network access. `HF_HUB_OFFLINE=1` is read
when the download is attempted (not only when `huggingface_hub` is imported), so it can be
set at any time. Every failure raises a `HubDownloadError` naming the repository, the file
and how to provide the file by hand.

Without network, huggingface_hub retries a file it does not have cached for about half a
minute before it gives up. `download_checkpoint(..., probe_timeout=s)` first tries to open a
connection to the hub (or to the HTTPS proxy the environment names) for at most `s` seconds,
and when that fails reads only the cache: a machine without network is told at once.
"""
from __future__ import annotations

import logging
import os
import re
import socket
import threading
import urllib.request
from pathlib import Path
from urllib.parse import urlsplit

from huggingface_hub import constants, hf_hub_download
from huggingface_hub.utils import (
    EntryNotFoundError,
    GatedRepoError,
    LocalEntryNotFoundError,
    RepositoryNotFoundError,
    RevisionNotFoundError,
)

__all__ = [
    "CHECKPOINT_SUFFIXES",
    "DEFAULT_FILENAME",
    "DEFAULT_REPO",
    "HubDownloadError",
    "download_checkpoint",
    "hub_cache_dir",
    "hub_unreachable",
    "looks_like_repo_id",
]

log = logging.getLogger(__name__)

DEFAULT_REPO = "robbyant/lingbot-map"
DEFAULT_FILENAME = "lingbot-map-long.pt"

# File name endings that mark a string as a local checkpoint path, never a repo id.
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


class HubDownloadError(OSError):
    """A checkpoint could not be fetched from the hub (nor found in its cache).

    `reason`: why, in a few words (the message adds how to provide the file by hand)."""

    def __init__(self, message: str, *, reason: str = "") -> None:
        super().__init__(message)
        self.reason = reason


def looks_like_repo_id(text: str) -> bool:
    """True for strings shaped like a hub repo id, "owner/name".

    Exactly one slash, no leading "." "/" "~", and no checkpoint file suffix, so that
    "robbyant/lingbot-map" is a repo id while "ckpt/model.pt" and "./a/b" are paths.
    """
    if not _REPO_ID.fullmatch(text) or ".." in text:
        return False
    return not text.lower().endswith(CHECKPOINT_SUFFIXES)


def hub_cache_dir(cache_dir: str | os.PathLike | None = None) -> Path:
    """The hub cache folder used for a download: `cache_dir`, else `$HF_HUB_CACHE` (read
    now), else huggingface_hub's default."""
    if cache_dir is not None:
        return Path(cache_dir).expanduser()
    return Path(os.environ.get("HF_HUB_CACHE") or constants.HF_HUB_CACHE).expanduser()


def _offline() -> bool:
    value = os.environ.get("HF_HUB_OFFLINE", "")
    return bool(constants.HF_HUB_OFFLINE) or value.strip().lower() in ("1", "true", "yes", "on")


def _hub_address() -> tuple[str, int]:
    """(host, port) a download connects to first: the HTTPS proxy of the environment, if one
    applies to the hub, else the hub itself."""
    hub = urlsplit(constants.ENDPOINT)
    host = hub.hostname or "huggingface.co"
    proxy = urllib.request.getproxies().get("https" if hub.scheme == "https" else "http")
    if proxy and not urllib.request.proxy_bypass(host):
        address = urlsplit(proxy if "://" in proxy else f"http://{proxy}")
        return address.hostname or proxy, address.port or 8080
    return host, hub.port or (443 if hub.scheme == "https" else 80)


def hub_unreachable(timeout: float = 3.0) -> str | None:
    """Why the hub cannot be reached (no name resolution, connection refused, no answer within
    `timeout` seconds), or None when a connection opens. The name lookup runs in a thread, as
    a resolver without network can itself hang for a long time."""
    host, port = _hub_address()
    outcome: list[str | None] = []

    def connect() -> None:
        try:
            socket.create_connection((host, port), timeout=timeout).close()
            outcome.append(None)
        except OSError as exc:
            outcome.append(f"connecting to {host}:{port} failed ({exc.strerror or exc})")

    worker = threading.Thread(target=connect, name="mapstream-hub-probe", daemon=True)
    worker.start()
    worker.join(timeout)
    return outcome[0] if outcome else f"{host}:{port} gave no answer within {timeout:g} s"


def download_checkpoint(
    repo_id: str,
    filename: str = DEFAULT_FILENAME,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
    probe_timeout: float | None = None,
) -> Path:
    """Return the local path of `filename` from hub repo `repo_id`, downloading it into the
    hub cache unless it is already there.

    probe_timeout: when given (seconds), the hub is tried first (:func:`hub_unreachable`);
        if it cannot be reached, only the cache is read, so an offline machine fails at once
        instead of after huggingface_hub's retries.

    Raises:
        HubDownloadError: offline and not cached, no network, no such repo/revision/file,
            gated repo, ...; the message says where to put the file by hand.
    """
    cache = hub_cache_dir(cache_dir)
    offline = _offline()
    unreachable = None if offline or probe_timeout is None else hub_unreachable(probe_timeout)
    if unreachable:
        log.info("the hub cannot be reached (%s): reading only the hub cache", unreachable)
    log.debug("hub checkpoint %s/%s (revision %s, cache %s, offline %s)", repo_id, filename, revision, cache, offline)
    try:
        path = hf_hub_download(
            repo_id,
            filename,
            revision=revision,
            cache_dir=cache,
            local_files_only=offline or bool(unreachable),
            library_name="mapstream",
        )
    except Exception as exc:  # every hub failure becomes one clear error
        reason = _reason(exc, filename, revision, offline, unreachable)
        raise HubDownloadError(_unavailable_message(repo_id, filename, revision, cache, reason), reason=reason) from exc
    return Path(path)


def _reason(exc: Exception, filename: str, revision: str | None, offline: bool, unreachable: str | None) -> str:
    if isinstance(exc, LocalEntryNotFoundError):
        if offline:
            return "offline mode is on (HF_HUB_OFFLINE=1) and the file is not in the hub cache"
        if unreachable:
            return f"the hub could not be reached ({unreachable}) and the file is not in the hub cache"
        return "the hub could not be reached and the file is not in the hub cache"
    if isinstance(exc, GatedRepoError):
        return "the repository is gated: accept its terms on the hub and log in (`hf auth login`)"
    if isinstance(exc, RepositoryNotFoundError):
        return "no such repository (or it is private: log in with `hf auth login`)"
    if isinstance(exc, RevisionNotFoundError):
        return f"the repository has no revision {revision!r}"
    if isinstance(exc, EntryNotFoundError):
        return f"the repository has no file {filename!r}"
    return f"{type(exc).__name__}: {exc}"


def _unavailable_message(repo_id: str, filename: str, revision: str | None, cache: Path, reason: str) -> str:
    rev = revision or "main"
    url = f"{constants.ENDPOINT}/{repo_id}/resolve/{rev}/{filename}"
    repo_folder = cache / f"models--{repo_id.replace('/', '--')}"
    return (
        f"Could not get checkpoint {filename!r} from Hugging Face hub repo {repo_id!r} "
        f"(revision {rev}): {reason}.\n"
        f"To use it without network access, either\n"
        f"  - download {url} by other means and pass its local path, "
        f"e.g. mapstream.load_model('/path/to/{filename}'), or\n"
        f"  - fill the hub cache on a machine with network access "
        f"(`hf download {repo_id} {filename}`) and copy {repo_folder.name} into {cache} "
        f"(the cache used here; set HF_HUB_CACHE or cache_dir= to use another)."
    )
