"""The asyncio client: HTTP/1.1 on asyncio streams, no threads. The same surface as the
synchronous one, every call a coroutine; output callbacks may be coroutine functions (awaited,
so a slow one slows the command down through TCP back-pressure instead of queueing)."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Awaitable, Callable, Dict, List, Mapping, Optional, Sequence, Tuple, Union

from . import _ops
from ._ops import Env, ExecResult, FileInfo, Labels, Op, Timeout
from .errors import NexusError, NotFoundError, UnavailableError

__all__ = ["AsyncClient", "AsyncSandbox", "AsyncFiles", "AsyncSnapshot"]

AsyncOutput = Callable[[bytes], Union[None, Awaitable[None]]]

_MAX_HEAD = 64 << 10


class _Response:
    """A response's status, headers and body (Content-Length, chunked, or to the close)."""

    def __init__(self, reader: asyncio.StreamReader, writer: asyncio.StreamWriter, status: int,
                 headers: Dict[str, str]) -> None:
        self._r, self._w = reader, writer
        self.status = status
        self.headers = headers
        self._chunked = "chunked" in headers.get("transfer-encoding", "").lower()
        cl = headers.get("content-length")
        self._left: Optional[int] = None if self._chunked or cl is None else int(cl)
        self._chunk = 0  # bytes left in the current chunk
        self._done = self._left == 0

    async def _next_chunk(self) -> None:
        line = await self._r.readuntil(b"\r\n")
        self._chunk = int(line.split(b";", 1)[0].strip() or b"x", 16)
        if self._chunk == 0:
            while (await self._r.readuntil(b"\r\n")) != b"\r\n":  # trailers
                pass
            self._done = True

    async def read(self, n: int) -> bytes:
        """Up to n bytes of the body, b"" at its end."""
        if self._done:
            return b""
        if self._chunked:
            if self._chunk == 0:
                await self._next_chunk()
                if self._done:
                    return b""
            b = await self._r.read(min(n, self._chunk))
            if not b:
                raise asyncio.IncompleteReadError(b"", self._chunk)
            self._chunk -= len(b)
            if self._chunk == 0:
                await self._r.readexactly(2)
            return b
        if self._left is not None:
            n = min(n, self._left)
        b = await self._r.read(n)
        if self._left is not None:
            if not b:
                raise asyncio.IncompleteReadError(b"", self._left)
            self._left -= len(b)
            self._done = self._left == 0
        elif not b:
            self._done = True
        return b

    async def read_exactly(self, n: int) -> Optional[bytes]:
        """Exactly n bytes, or None at the end of the body."""
        parts: List[bytes] = []
        got = 0
        while got < n:  # pieces joined once: a 1 MiB frame comes in many small reads
            b = await self.read(n - got)
            if not b:
                return None
            parts.append(b)
            got += len(b)
        return b"".join(parts)

    async def read_all(self, limit: int = -1) -> bytes:
        parts: List[bytes] = []
        got = 0
        while limit < 0 or got < limit:
            b = await self.read(1 << 20 if limit < 0 else min(1 << 20, limit - got))
            if not b:
                break
            parts.append(b)
            got += len(b)
        return b"".join(parts)

    def close(self) -> None:
        self._w.close()


class AsyncClient(_ops.Endpoint):
    """A connection to a nexus API for asyncio: the same arguments and defaults as Client."""

    async def _open(self, op: Op) -> _Response:
        headers, body = self._headers(op)
        reader, writer = await asyncio.open_connection(
            self._host, self._port, ssl=self._ssl, server_hostname=self._host if self._ssl else None, limit=_MAX_HEAD)
        try:
            head = "%s %s HTTP/1.1\r\nHost: %s\r\n" % (op.method, self._target(op), self._netloc)
            head += "".join("%s: %s\r\n" % kv for kv in headers.items()) + "\r\n"
            writer.write(head.encode("latin-1") + (body or b""))
            await writer.drain()
            status, hdrs = _parse_head(await reader.readuntil(b"\r\n\r\n"))
            return _Response(reader, writer, status, hdrs)
        except BaseException:
            writer.close()
            raise

    async def send(self, op: Op) -> _Response:
        """Sends op and returns its response once it is a success; an error answer raises its
        NexusError. The caller reads and closes the response."""
        try:
            resp = await asyncio.wait_for(self._open(op), self._deadline(op))
        except (OSError, EOFError, ValueError, asyncio.LimitOverrunError, asyncio.TimeoutError) as e:
            raise self._unavailable(e) from e
        if resp.status >= 400:
            try:
                raw = await asyncio.wait_for(resp.read_all(_ops.MAX_ERROR_BODY), self._deadline(op))
            except (OSError, EOFError, ValueError, asyncio.LimitOverrunError, asyncio.TimeoutError):
                raw = b""
            finally:
                resp.close()
            raise _ops.answer_error(resp.status, raw)
        return resp

    async def body(self, op: Op) -> bytes:
        """op's whole answer."""
        async def whole() -> bytes:
            resp = await self.send(op)
            try:
                return await resp.read_all()
            finally:
                resp.close()
        try:
            return await asyncio.wait_for(whole(), self._deadline(op))
        except NexusError:  # UnavailableError is an OSError too
            raise
        except (OSError, EOFError, ValueError, asyncio.LimitOverrunError, asyncio.TimeoutError) as e:
            raise self._unavailable(e) from e

    async def call(self, op: Op) -> Any:
        """op's JSON answer."""
        return _ops.parse_json(await self.body(op))

    async def request(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None,
                      body: Optional[bytes] = None, json_body: Any = None, content_type: Optional[str] = None,
                      timeout: Optional[float] = _ops.DEFAULT) -> Any:
        """One request of any route whose JSON answer it returns."""
        return await self.call(Op(method, path, query, body, json_body, content_type, timeout))


def _parse_head(raw: bytes) -> Tuple[int, Dict[str, str]]:
    lines = raw.decode("latin-1").split("\r\n")
    parts = lines[0].split(" ", 2)
    if len(parts) < 2 or not parts[0].startswith("HTTP/1."):
        raise ValueError("not an HTTP/1.1 answer: %r" % lines[0][:80])
    headers: Dict[str, str] = {}
    for line in lines[1:]:
        if ":" in line:
            k, v = line.split(":", 1)
            headers[k.strip().lower()] = v.strip()
    return int(parts[1]), headers


async def _called(cb: Optional[AsyncOutput], data: bytes) -> None:
    if cb is not None:
        r = cb(data)
        if inspect.isawaitable(r):
            await r


class AsyncSnapshot(_ops.SnapshotInfo):
    """A snapshot of a sandbox; ``await snap.fork(name)`` boots a new sandbox from it."""

    def __init__(self, name: str, sandbox: str, info: Optional[Dict[str, Any]] = None, client: Optional[AsyncClient] = None) -> None:
        super().__init__(name, sandbox, info or {})
        self.client = client or AsyncClient()

    async def fork(self, name: str, labels: Optional[Mapping[str, str]] = None) -> "AsyncSandbox":
        return await AsyncSandbox._of(self.client, _ops.fork(self.name, name, labels), name)

    async def remove(self) -> None:
        await self.client.call(_ops.remove_snapshot(self.name))


class AsyncFiles:
    """A sandbox's files (absolute guest paths)."""

    def __init__(self, sandbox: "AsyncSandbox") -> None:
        self._sb = sandbox

    async def _call(self, op: Op) -> Any:
        return await self._sb.client.call(op)

    async def write(self, path: str, data: Union[bytes, str], mode: Optional[int] = None) -> FileInfo:
        return FileInfo.of(await self._call(_ops.write_file(self._sb.name, path, data, mode)))

    async def read(self, path: str) -> bytes:
        return await self._sb.client.body(_ops.read_file(self._sb.name, path))

    async def read_text(self, path: str) -> str:
        return (await self.read(path)).decode("utf-8", "replace")

    async def list(self, path: str) -> List[FileInfo]:
        return _ops.entries(await self._call(_ops.files(self._sb.name, "", "GET", path)))

    async def stat(self, path: str) -> FileInfo:
        return FileInfo.of(await self._call(_ops.files(self._sb.name, "/stat", "GET", path)))

    async def exists(self, path: str) -> bool:
        try:
            await self.stat(path)
            return True
        except NotFoundError:
            return False

    async def mkdir(self, path: str) -> FileInfo:
        return FileInfo.of(await self._call(_ops.files(self._sb.name, "/mkdir", "POST", path)))

    async def remove(self, path: str, recursive: bool = False) -> None:
        await self._call(_ops.files(self._sb.name, "", "DELETE", path, recursive=recursive or None))


class AsyncSandbox(_ops.SandboxState):
    """Sandbox for asyncio: ``async with await AsyncSandbox.create(...) as sb`` removes it at
    the end of the block."""

    def __init__(self, name: str, client: Optional[AsyncClient] = None, info: Optional[Dict[str, Any]] = None) -> None:
        self.name = name
        self.client = client or AsyncClient()
        self.info: Dict[str, Any] = info or {}
        self.files = AsyncFiles(self)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.remove()

    @classmethod
    async def _of(cls, c: AsyncClient, op: Op, name: str) -> "AsyncSandbox":
        info = await c.call(op)
        return cls(info.get("name", name), c, info)

    @classmethod
    async def create(cls, name: str, *, image: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
                     agent: Optional[str] = None, memory_mib: Optional[int] = None, vcpus: Optional[int] = None,
                     client: Optional[AsyncClient] = None, **options: Any) -> "AsyncSandbox":
        return await cls._of(client or AsyncClient(), _ops.create(name, image, labels, agent, memory_mib, vcpus, options), name)

    @classmethod
    async def get(cls, name: str, client: Optional[AsyncClient] = None) -> "AsyncSandbox":
        return await cls._of(client or AsyncClient(), _ops.get(name), name)

    @classmethod
    async def list(cls, labels: Labels = None, *, all: bool = False,
                   client: Optional[AsyncClient] = None) -> List["AsyncSandbox"]:
        c = client or AsyncClient()
        d = await c.call(_ops.list_sandboxes(labels, all))
        return [cls(info.get("name", ""), c, info) for info in d.get("sandboxes") or []]

    async def refresh(self) -> Dict[str, Any]:
        self.info = await self.client.call(_ops.get(self.name))
        return self.info

    async def _verb(self, verb: str, force: Optional[bool] = None) -> None:
        self._took(await self.client.call(_ops.verb(self.name, verb, force)))

    async def start(self) -> None:
        await self._verb("start")

    async def stop(self, force: bool = False) -> None:
        await self._verb("stop", force or None)

    async def pause(self) -> None:
        await self._verb("pause")

    async def resume(self) -> None:
        await self._verb("resume")

    async def remove(self) -> None:
        await self.client.call(_ops.remove(self.name))

    async def exec(self, argv: Union[str, Sequence[str]], *, stdin: Union[None, str, bytes] = None,
                   env: Env = None, timeout: Timeout = None, workdir: Optional[str] = None,
                   on_stdout: Optional[AsyncOutput] = None, on_stderr: Optional[AsyncOutput] = None,
                   capture: bool = True) -> ExecResult:
        """As Sandbox.exec; a callback that is a coroutine function is awaited before the next
        bytes are read."""
        resp = await self.client.send(_ops.exec_stream(self.name, argv, stdin, env, timeout, workdir))
        got = _ops.ExecOutput(capture)
        try:
            while True:
                ch, n = _ops.frame_header(await resp.read_exactly(5))
                data = await resp.read_exactly(n) if n else b""
                res = got.take(ch, data)
                if res is not None:
                    return res
                if data:
                    await _called(_ops.callback_for(ch, on_stdout, on_stderr), data)
        except NexusError:
            raise
        except (OSError, EOFError, ValueError, asyncio.LimitOverrunError) as e:
            raise UnavailableError("exec: %s" % (e or type(e).__name__)) from e
        finally:
            resp.close()

    async def ports(self) -> List[Dict[str, Any]]:
        return list((await self.client.call(_ops.ports(self.name))).get("ports") or [])

    async def snapshot(self, name: Optional[str] = None) -> AsyncSnapshot:
        d = await self.client.call(_ops.snapshot(self.name, name))
        return AsyncSnapshot(*_ops.snapshot_of(d, name, self.name), client=self.client)

    async def fork(self, name: str, labels: Optional[Mapping[str, str]] = None) -> "AsyncSandbox":
        return await AsyncSandbox._of(self.client, _ops.fork(self.name, name, labels), name)
