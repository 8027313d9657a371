"""Python client of the nexus remote API (``nexus serve api``).

    from nexus import Sandbox

    with Sandbox.create("demo", image="nexus-mini", agent="codex") as sb:
        r = sb.exec(["sh", "-c", "echo hi"], on_stdout=lambda b: print(b.decode(), end=""))
        sb.files.write("/tmp/a.txt", "hello")
        print(r.exit_code, sb.files.read("/tmp/a.txt"))

The URL and token come from $NEXUS_API_URL and $NEXUS_API_TOKEN unless a Client is given.
``AsyncSandbox`` (with ``AsyncClient``) is the same surface for asyncio, on asyncio streams.
Only the standard library is used.
"""

from ._aio import AsyncClient, AsyncFiles, AsyncSandbox, AsyncSnapshot
from ._client import Client, ExecResult, FileInfo, Files, Sandbox, Snapshot
from .errors import (AuthenticationError, ConflictError, InternalError, InvalidError, NexusError,
                     NotFoundError, RefusedError, UnavailableError)

__version__ = "0.1.0"

__all__ = [
    "Client", "Sandbox", "Files", "Snapshot", "ExecResult", "FileInfo",
    "AsyncClient", "AsyncSandbox", "AsyncFiles", "AsyncSnapshot",
    "NexusError", "InvalidError", "NotFoundError", "ConflictError", "RefusedError",
    "AuthenticationError", "UnavailableError", "InternalError",
]
