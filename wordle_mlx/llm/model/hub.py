"""Downloads from the Hugging Face Hub, and its refusals as one line that says what to do.

`download(repo_id, spec)` fetches the files mlx-lm's loader reads (`allow_patterns`) with `snapshot_download`, or
finds them in the Hugging Face cache. A failure becomes a `UserError` naming the model spec and its fix, read
from huggingface_hub's public error types (`huggingface_hub.errors`) and the HTTP status they carry: a gated
repo (accept its conditions on its page, then `hf auth login` or HF_TOKEN), a repo that does not exist or is
private (check the repo id; for a private one, log in), a missing revision, a disabled repo, a token refused
(401 or 403) and no connection with nothing cached (HF_HUB_OFFLINE=1, or offline). Without this the user saw
"401 Client Error. (Request ID: ...)" and no hint.
"""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

from huggingface_hub import snapshot_download
from huggingface_hub.errors import (DisabledRepoError, GatedRepoError, HfHubHTTPError, LocalEntryNotFoundError,
                                    OfflineModeIsEnabled, RepositoryNotFoundError, RevisionNotFoundError)

from ...errors import UserError

LOGIN = "log in with `hf auth login` or set HF_TOKEN"


def download(repo_id: str, spec: str, allow_patterns: Sequence[str] | None = None) -> Path:
    """The local snapshot folder of Hub repo `repo_id` (model spec `spec`), downloaded if not cached."""
    try:
        return Path(snapshot_download(repo_id, allow_patterns=list(allow_patterns) if allow_patterns else None))
    except (HfHubHTTPError, LocalEntryNotFoundError, OfflineModeIsEnabled) as exc:
        raise UserError(hub_error_message(exc, repo_id, spec)) from None


def hub_error_message(exc: Exception, repo_id: str, spec: str) -> str:
    """One line for a huggingface_hub error met while fetching `repo_id`: what happened and how to fix it."""
    where = f"model {spec!r}: Hugging Face repo {repo_id}"
    status = getattr(getattr(exc, "response", None), "status_code", None)
    if isinstance(exc, GatedRepoError):          # before RepositoryNotFoundError, its parent class
        return (f"{where} is gated: accept its conditions at https://huggingface.co/{repo_id}, then {LOGIN} "
                "with a token of that account")
    if isinstance(exc, RevisionNotFoundError):
        return f"{where}: revision not found; check the repo id and the revision"
    if isinstance(exc, RepositoryNotFoundError):
        return f"{where} not found: check the repo id (owner/name); if the repo is private, {LOGIN}"
    if isinstance(exc, DisabledRepoError):
        return f"{where} has been disabled by its owner; use another repo"
    if isinstance(exc, (LocalEntryNotFoundError, OfflineModeIsEnabled)):
        return (f"{where} is not in the Hugging Face cache and the Hub cannot be reached: connect to the internet "
                "(and unset HF_HUB_OFFLINE), or pass a local model folder")
    if status == 401:
        return f"{where}: the Hub refused the token (401 unauthorised): {LOGIN} with a valid token"
    if status == 403:
        return (f"{where}: access denied (403): {LOGIN} with a token that may read this repo "
                f"(for a gated repo, accept its conditions at https://huggingface.co/{repo_id} first)")
    first = " ".join(str(exc).split("\n")[0].split())[:200]
    return f"{where}: download failed ({first}); try again later, or check https://status.huggingface.co"
