"""huggingface_hub's exceptions as one line a user can act on, naming the config field and the repo."""
from __future__ import annotations

from .spec import HubSpec

TOKEN_HINT = ("set a Hugging Face token (a read token from https://huggingface.co/settings/tokens) as the secret "
              "named by model.hub_token_name (HF_TOKEN by default: the studio's Secrets panel, the environment or "
              "cloud.secrets_file)")
RETRY = "start again to resume the download where it stopped"


def _chain(error: BaseException):
    seen = set()
    while error is not None and id(error) not in seen:
        seen.add(id(error))
        yield error
        error = error.__cause__ or error.__context__


def _status(error: BaseException) -> int | None:
    response = getattr(error, "response", None)
    return getattr(response, "status_code", None)


def describe(error: BaseException, spec: HubSpec, key: str, endpoint: str, file: str = "") -> str:
    """`<key>: <what happened to which repo or file>; <what to do>` in one line."""
    from huggingface_hub import errors as hub
    import httpx2
    page = f"{endpoint.rstrip('/')}/{spec.repo_id}"
    where = f"{spec.repo_id}/{file}" if file else spec.repo_id
    for e in _chain(error):
        if isinstance(e, hub.GatedRepoError) or (isinstance(e, hub.HfHubHTTPError) and _status(e) in (401, 403)):
            refused = "refused the token" if _status(e) == 403 else "needs a token"
            return (f"{key}: {spec.repo_id} is a gated or private repo and the hub {refused} (HTTP {_status(e)}): "
                    f"accept its licence on {page} with your account, then {TOKEN_HINT}")
        if isinstance(e, hub.RevisionNotFoundError):
            return f"{key}: {spec.repo_id} has no revision {spec.revision!r} (a branch, tag or commit on {page})"
        if isinstance(e, hub.RepositoryNotFoundError):
            return (f"{key}: {spec.repo_id} is neither a local folder or file nor a repo on the hub ({endpoint}, "
                    f"HTTP 404); check the spelling (org/name)")
        if isinstance(e, hub.RemoteEntryNotFoundError):
            return f"{key}: {spec.repo_id} has no file {spec.filename or file!r} at revision {spec.revision!r}"
        if isinstance(e, hub.OfflineModeIsEnabled) or (isinstance(e, hub.LocalEntryNotFoundError)
                                                       and "HF_HUB_OFFLINE" in str(e)):
            return offline_message(spec, key)
        if isinstance(e, httpx2.TimeoutException):
            return (f"{key}: the hub ({endpoint}) stopped answering while downloading {where} (no data for "
                    f"HF_HUB_DOWNLOAD_TIMEOUT seconds, retried); {RETRY}")
        if isinstance(e, (httpx2.ConnectError, ConnectionError)):
            return f"{key}: cannot reach the hub ({endpoint}) to download {where}: network down? {RETRY}"
        if isinstance(e, httpx2.RemoteProtocolError):
            return f"{key}: the connection to the hub broke while downloading {where}; {RETRY}"
        if isinstance(e, OSError) and "Consistency check failed" in str(e):
            return (f"{key}: {where} arrived truncated (fewer bytes than the hub announced); {RETRY} "
                    f"(the partial file is kept)")
        if isinstance(e, hub.HfHubHTTPError) and _status(e):
            return f"{key}: the hub answered HTTP {_status(e)} for {where}; {RETRY}"
    return f"{key}: downloading {where} failed: {type(error).__name__}: {str(error).splitlines()[0] if str(error) else ''}"


def offline_message(spec: HubSpec, key: str) -> str:
    return (f"{key}: {spec} is not (completely) in the Hugging Face cache and downloads are off (HF_HUB_OFFLINE=1 "
            f"or model.hub_download = false); download it once with network access, or give a local path")
