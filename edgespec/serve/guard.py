"""Who may talk to the server: the checks every request passes before it reaches a route.

A model server on 127.0.0.1 is still reachable by every web page the user opens. A page
cannot read a cross-origin reply without CORS, but it can *send* a "simple" request (a
``text/plain`` or form POST needs no preflight), and a DNS-rebinding page (its name
re-pointed at 127.0.0.1) talks to the server as its own origin, reading every reply
(Ollama's CVE-2024-28224). So, before any route runs:

1. the ``Host`` header must name this server: the address it is bound to, a localhost
   name, or one of ``--allowed-hosts`` (a reverse proxy, a LAN name); a rebinding page's
   Host is its own domain, and is refused (403);
2. an ``Origin`` header, which browsers send on every cross-origin request and on
   same-origin POSTs, must be this server's own origin or one of ``--cors-origins``
   (403 otherwise): the chat page, served from here, passes; any other site's page does not;
3. a POST must say its body is JSON (415 otherwise): a page can send ``text/plain`` or a
   form without asking, never ``application/json``;
4. a body larger than :data:`MAX_BODY` is refused (413) before it is read whole.

CORS headers go out only for ``--cors-origins`` (Starlette's ``CORSMiddleware``): none by
default, unlike llama-server's ``*``. Clients that are not browsers (curl, the ``openai``
client, aider) send a localhost Host, no Origin and JSON, and see no difference.
"""

from __future__ import annotations

import ipaddress
import json
from dataclasses import dataclass
from typing import Awaitable, Callable
from urllib.parse import urlsplit

from starlette.middleware.cors import CORSMiddleware

MAX_BODY = 8 * 1024 * 1024  # bytes: a 128k-token conversation is well under 1 MiB of JSON
LOCAL_NAMES = ("localhost", "127.0.0.1", "::1")
# ``--cors-origins localhost``: a page served from this machine, on any port.
LOCAL_ORIGINS = r"https?://(localhost|127\.0\.0\.1|\[::1\])(:\d+)?"
WILDCARD_BINDS = ("0.0.0.0", "::", "")


@dataclass(frozen=True)
class Access:
    """The server's address and what it opens beyond it.

    ``allowed_hosts``: Host names answered besides the bound address and localhost
    (``*``: any; ``.example.com``: it and its subdomains). ``cors_origins``: web
    origins whose pages may call the API (``*``: any; ``localhost``: any page
    served from this machine)."""

    host: str = "127.0.0.1"
    allowed_hosts: tuple[str, ...] = ()
    cors_origins: tuple[str, ...] = ()
    max_body: int = MAX_BODY

    def host_allowed(self, host_header: str) -> bool:
        """Whether a request's ``Host`` header (``name[:port]``) names this server."""
        name = _host_name(host_header)
        if name in LOCAL_NAMES or name.endswith(".localhost") or name == self.host.lower():
            return True
        if self.host in WILDCARD_BINDS and _is_ip(name):
            return True  # bound to every address: reached by one of this machine's (rebinding needs a name)
        return any(allowed == "*" or name == allowed.lower().lstrip(".")
                   or (allowed.startswith(".") and name.endswith(allowed.lower()))
                   for allowed in self.allowed_hosts)


def split_list(text: str | None) -> tuple[str, ...]:
    """A comma-separated flag's values (``--allowed-hosts a,b``), stripped, empties dropped."""
    return tuple(part.strip() for part in (text or "").split(",") if part.strip())


def protect(app, access: Access, refused: Callable[[str], None] = lambda reason: None) -> None:
    """Put ``app`` (a FastAPI app) behind the checks above, and send CORS headers for
    ``access.cors_origins``. ``refused(code)`` counts each refusal (``/metrics``)."""
    allowed: Callable[[str], bool] = lambda origin: False  # noqa: E731 - none by default
    if access.cors_origins:
        options = dict(allow_origins=[o for o in access.cors_origins if o != "localhost"],
                       allow_origin_regex=LOCAL_ORIGINS if "localhost" in access.cors_origins else None,
                       allow_methods=["GET", "POST", "OPTIONS"],
                       allow_headers=["Authorization", "Content-Type", "X-Api-Key"])
        app.add_middleware(CORSMiddleware, **options)
        allowed = CORSMiddleware(None, **options).is_allowed_origin  # the same rule, asked here
    app.add_middleware(Guard, access=access, cors_allowed=allowed, refused=refused)  # outermost


class Guard:
    """The ASGI middleware that applies the checks (outermost: nothing runs before it)."""

    def __init__(self, app, access: Access, cors_allowed: Callable[[str], bool],
                 refused: Callable[[str], None]):
        self.app, self.access, self.cors_allowed, self.refused = app, access, cors_allowed, refused

    async def __call__(self, scope, receive, send) -> None:
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope["headers"]}
        problem = self.check(scope["method"], headers)
        if problem is None and scope["method"] in ("POST", "PUT", "PATCH"):
            body, problem = await self.read_body(receive, headers)
            if problem is None:
                receive = _replay(body, receive)
        if problem is None:
            return await self.app(scope, receive, send)
        status, code, message = problem
        self.refused(code)
        await _send_error(send, status, code, message)

    def check(self, method: str, headers: dict[str, str]) -> tuple[int, str, str] | None:
        """What is wrong with a request's headers, as (status, code, message), or None."""
        host = headers.get("host")
        if host is not None and not self.access.host_allowed(host):
            return (403, "host_not_allowed",
                    f"Host {_host_name(host)!r} is not this server's: it answers to {self.access.host} "
                    f"and localhost. Behind a reverse proxy or under a LAN name, start it with "
                    f"--allowed-hosts {_host_name(host)}")
        origin = headers.get("origin")
        if origin is not None and not _same_origin(origin, host) and not self.cors_allowed(origin):
            return (403, "origin_not_allowed",
                    f"requests from the web page at {origin} are not allowed: to let that site's "
                    f"pages use this server, start it with --cors-origins {origin}")
        if method in ("POST", "PUT", "PATCH") and not _is_json(headers.get("content-type", "")):
            given = headers.get("content-type") or "none"
            return (415, "unsupported_media_type",
                    f"the request body must be JSON, sent with Content-Type: application/json "
                    f"(this one says {given}; curl: -H 'Content-Type: application/json')")
        length = headers.get("content-length", "")
        if length.isdigit() and int(length) > self.access.max_body:
            return self._too_large()
        return None

    async def read_body(self, receive, headers) -> tuple[bytes, tuple[int, str, str] | None]:
        """The whole body, read as it comes and refused once it passes the limit (a
        chunked body has no Content-Length to check first)."""
        parts, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                return b"", (400, "client_gone", "the client went away")
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > self.access.max_body:
                return b"", self._too_large()
            parts.append(chunk)
            if not message.get("more_body", False):
                return b"".join(parts), None

    def _too_large(self) -> tuple[int, str, str]:
        return (413, "body_too_large", f"the request body is over {self.access.max_body // 2**20} MiB: "
                                       f"send a shorter prompt")


def _host_name(host: str) -> str:
    """``name`` of a Host header's ``name[:port]`` (``::1`` of ``[::1]:8080``), lowercased."""
    host = host.strip().lower()
    if host.startswith("["):
        return host[1:].partition("]")[0]
    return host.rpartition(":")[0] if host.count(":") == 1 else host


def _is_ip(name: str) -> bool:
    try:
        ipaddress.ip_address(name)
    except ValueError:
        return False
    return True


def _same_origin(origin: str, host: str | None) -> bool:
    """Whether ``Origin`` is the server's own, as the browser addressed it (the page at
    ``/`` calls the API with the same scheme, name and port it was loaded from)."""
    parts = urlsplit(origin)
    return host is not None and parts.scheme in ("http", "https") and \
        parts.netloc.lower() == host.strip().lower()


def _is_json(content_type: str) -> bool:
    kind = content_type.partition(";")[0].strip().lower()
    return kind == "application/json" or (kind.startswith("application/") and kind.endswith("+json"))


def _replay(body: bytes, receive) -> Callable[[], Awaitable[dict]]:
    """A ``receive`` that gives the body read already, then listens as before (for
    the client going away during a streamed reply)."""
    sent = False

    async def again() -> dict:
        nonlocal sent
        if not sent:
            sent = True
            return {"type": "http.request", "body": body, "more_body": False}
        return await receive()
    return again


async def _send_error(send, status: int, code: str, message: str) -> None:
    body = json.dumps({"error": {"message": message, "type": "invalid_request_error",
                                 "param": None, "code": code}}).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json"),
                            (b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})
