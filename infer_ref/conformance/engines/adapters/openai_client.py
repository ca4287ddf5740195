"""JSON over HTTP to an OpenAI-compatible server, with one-line errors naming the endpoint (stdlib only)."""

from __future__ import annotations

import json
import urllib.error
import urllib.request
from typing import Any

from infer_ref.errors import InferRefError


class EndpointError(InferRefError, RuntimeError):
    """The endpoint cannot be judged (down, another model, no logprobs) or refused a request."""


class HttpClient:
    """JSON over HTTP with one-line errors naming the endpoint."""

    def __init__(self, endpoint: str, timeout: float) -> None:
        self.endpoint = endpoint.rstrip("/")
        self.root = self.endpoint.removesuffix("/v1")
        self.timeout = timeout

    def get(self, path: str, *, root: bool = False) -> Any:
        """GET ``path`` under the endpoint (``…/v1``), or under the server's root with ``root``."""
        return self._send(urllib.request.Request((self.root if root else self.endpoint) + path))

    def post(self, path: str, body: dict[str, Any] | None, *, root: bool = False) -> Any:
        data = json.dumps(body or {}).encode()
        url = (self.root if root else self.endpoint) + path
        return self._send(
            urllib.request.Request(url, data=data, headers={"Content-Type": "application/json"})
        )

    def _send(self, request: urllib.request.Request) -> Any:
        try:
            with urllib.request.urlopen(request, timeout=self.timeout) as answer:
                raw = answer.read()
        except urllib.error.HTTPError as err:
            raise ServerRefused(request.full_url, err.code, _server_message(err)) from None
        except (urllib.error.URLError, OSError) as err:
            reason = getattr(err, "reason", err)
            raise EndpointError(
                f"no OpenAI-compatible server answers at {self.endpoint} ({reason}): start it, "
                "or pass the URL it listens on, ending in /v1"
            ) from None
        try:
            return json.loads(raw)
        except ValueError:
            raise EndpointError(
                f"{request.full_url} answered something that is not JSON ({raw[:80]!r}): is "
                f"{self.endpoint} an OpenAI-compatible endpoint (…/v1)?"
            ) from None


class ServerRefused(EndpointError):
    """The server answered with an HTTP error status."""

    def __init__(self, url: str, status: int, message: str) -> None:
        super().__init__(f"{url} answered HTTP {status}: {message}")
        self.status = status
        self.server_message = message


def _server_message(err: urllib.error.HTTPError) -> str:
    try:
        body = json.loads(err.read())
        message = body.get("error", body) if isinstance(body, dict) else body
        if isinstance(message, dict):
            message = message.get("message", message)
    except (ValueError, OSError):
        message = err.reason
    return " ".join(str(message).split())[:300]
