"""``dilu deploy``'s side of weight artifacts: the file model.yaml names, uploaded once per digest."""

from __future__ import annotations

import re
from pathlib import Path

import yaml

from cli.client import CliError, GatewayClient
from dilu.artifacts import ArtifactError, check_safetensors, digest_of_file, file_chunks
from dilu.bundles import is_digest

UPLOAD_TIMEOUT_S = 3600.0   # a multi-GB file over a slow link


def upload_weights(client: GatewayClient, text: str, folder: Path) -> tuple[str, Path | None]:
    """(the spec's text with its ``weights`` path replaced by the file's digest, the file) after
    uploading the file unless the gateway has it; the text unchanged and None when the spec
    names no file (no weights, or a digest already)."""
    text, path, digest = weights_digested(text, folder)
    if path is None:
        return text, None
    if client.request("HEAD", f"/v1/artifacts/{digest}", allow_status=(404,)).status_code != 200:
        client.request("PUT", f"/v1/artifacts/{digest}", content=file_chunks(path),
                       headers={"content-type": "application/octet-stream",
                                "content-length": str(path.stat().st_size)},
                       timeout=UPLOAD_TIMEOUT_S)
    return text, path


def weights_digested(text: str, folder: Path) -> tuple[str, Path | None, str | None]:
    """(the spec's text with its ``weights`` path replaced by the file's digest, the file, the
    digest), the file checked to be safetensors; nothing is sent (``dilu spec check`` stops
    here). The text unchanged, None and None when the spec names no file."""
    try:
        document = yaml.safe_load(text)
    except yaml.YAMLError:
        return text, None, None   # the spec's own check names what is malformed
    named = document.get("weights") if isinstance(document, dict) else None
    if not isinstance(named, str) or is_digest(named):
        return text, None, None
    path = (folder / named).resolve()
    if not path.is_file():
        raise CliError(f"weights: {named!r} is not a file (looked for {path})")
    try:
        check_safetensors(path)
    except ArtifactError as exc:
        raise CliError(f"weights: {named}: {exc} (save it with safetensors.torch.save_file)") from None
    digest = digest_of_file(path)
    return _with_digest(text, document, digest), path, digest


def _with_digest(text: str, document: dict, digest: str) -> str:
    # The line replaced in place keeps the user's comments and line numbers (the gateway's
    # errors name lines); a spec written in another style is written out again.
    replaced, count = re.subn(r"""(?m)^weights:[ \t]*("[^"\n]*"|'[^'\n]*'|[^\s#]+)""", f"weights: {digest}", text)
    if count == 1:
        return replaced
    return yaml.safe_dump({**document, "weights": digest}, sort_keys=False)
