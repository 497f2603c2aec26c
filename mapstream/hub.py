"""Checkpoint downloads from the Hugging Face hub (cached, offline-aware).

    path = download_checkpoint("robbyant/lingbot-map", "lingbot-map-long.pt")

Files are cached by `huggingface_hub` (default `~/.cache/huggingface/hub`, or `HF_HUB_CACHE`,
or `cache_dir=`); a cached file is used without network access. `HF_HUB_OFFLINE=1` is read
when the download is attempted (not only when `huggingface_hub` is imported), so it can be
set at any time. Every failure raises a `HubDownloadError` naming the repository, the file
and how to provide the file by hand.
"""
from __future__ import annotations

import logging
import os
import re
from pathlib import Path

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
    "looks_like_repo_id",
]

log = logging.getLogger(__name__)

DEFAULT_REPO = "robbyant/lingbot-map"
DEFAULT_FILENAME = "lingbot-map-long.pt"

# File name endings that mark a string as a local checkpoint path, never a repo id.
CHECKPOINT_SUFFIXES = (".pt", ".pth", ".bin", ".ckpt", ".safetensors")
_REPO_ID = re.compile(r"[A-Za-z0-9][A-Za-z0-9._-]*/[A-Za-z0-9][A-Za-z0-9._-]*")


class HubDownloadError(OSError):
    """A checkpoint could not be fetched from the hub (nor found in its cache)."""


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


def download_checkpoint(
    repo_id: str,
    filename: str = DEFAULT_FILENAME,
    *,
    revision: str | None = None,
    cache_dir: str | os.PathLike | None = None,
) -> Path:
    """Return the local path of `filename` from hub repo `repo_id`, downloading it into the
    hub cache unless it is already there.

    Raises:
        HubDownloadError: offline and not cached, no network, no such repo/revision/file,
            gated repo, ...; the message says where to put the file by hand.
    """
    cache = hub_cache_dir(cache_dir)
    offline = _offline()
    log.debug("hub checkpoint %s/%s (revision %s, cache %s, offline %s)", repo_id, filename, revision, cache, offline)
    try:
        path = hf_hub_download(
            repo_id,
            filename,
            revision=revision,
            cache_dir=cache,
            local_files_only=offline,
            library_name="mapstream",
        )
    except Exception as exc:  # every hub failure becomes one clear error
        raise HubDownloadError(_unavailable_message(repo_id, filename, revision, cache, offline, exc)) from exc
    return Path(path)


def _reason(exc: Exception, filename: str, revision: str | None, offline: bool) -> str:
    if isinstance(exc, LocalEntryNotFoundError):
        if offline:
            return "offline mode is on (HF_HUB_OFFLINE=1) and the file is not in the hub cache"
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


def _unavailable_message(
    repo_id: str, filename: str, revision: str | None, cache: Path, offline: bool, exc: Exception
) -> str:
    rev = revision or "main"
    url = f"{constants.ENDPOINT}/{repo_id}/resolve/{rev}/{filename}"
    repo_folder = cache / f"models--{repo_id.replace('/', '--')}"
    return (
        f"Could not get checkpoint {filename!r} from Hugging Face hub repo {repo_id!r} "
        f"(revision {rev}): {_reason(exc, filename, revision, offline)}.\n"
        f"To use it without network access, either\n"
        f"  - download {url} by other means and pass its local path, "
        f"e.g. mapstream.load_model('/path/to/{filename}'), or\n"
        f"  - fill the hub cache on a machine with network access "
        f"(`hf download {repo_id} {filename}`) and copy {repo_folder.name} into {cache} "
        f"(the cache used here; set HF_HUB_CACHE or cache_dir= to use another)."
    )
