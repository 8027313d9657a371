"""Exceptions of the nexus API: one per error code of the API's envelope."""

from __future__ import annotations

from typing import Dict, Optional, Type


class NexusError(Exception):
    """A request the API refused or failed. ``code`` is the envelope's code (invalid,
    not_found, conflict, refused, unavailable, internal), ``status`` the HTTP status."""

    code = "internal"

    def __init__(self, message: str, status: int = 0, code: Optional[str] = None) -> None:
        super().__init__(message)
        self.message = message
        self.status = status
        if code:
            self.code = code


class InvalidError(NexusError, ValueError):
    """400: the request is malformed (a bad argument, an unknown field)."""

    code = "invalid"


class NotFoundError(NexusError, LookupError):
    """404: no such sandbox, snapshot, file or route."""

    code = "not_found"


class ConflictError(NexusError):
    """409: the sandbox is not in a state that allows it, or the name is taken."""

    code = "conflict"


class RefusedError(NexusError, PermissionError):
    """403: the token's scope or the host's policy refuses it."""

    code = "refused"


class AuthenticationError(RefusedError):
    """401: no token, or one the server does not know (set NEXUS_API_TOKEN)."""


class UnavailableError(NexusError, ConnectionError):
    """503 or no answer: the API or the service behind it cannot be reached."""

    code = "unavailable"


class InternalError(NexusError):
    """500: nexus failed."""

    code = "internal"


_BY_CODE: Dict[str, Type[NexusError]] = {
    c.code: c for c in (InvalidError, NotFoundError, ConflictError, RefusedError, UnavailableError, InternalError)
}


def error_for(status: int, code: str, message: str) -> NexusError:
    """The exception of an API error answer."""
    if status == 401:
        return AuthenticationError(message, status, "refused")
    cls = _BY_CODE.get(code)
    if cls is None:
        cls = {400: InvalidError, 403: RefusedError, 404: NotFoundError, 409: ConflictError, 503: UnavailableError}.get(status, InternalError)
    return cls(message, status, code or None)
