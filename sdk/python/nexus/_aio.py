"""The asynchronous client: the synchronous one run in worker threads, its output callbacks
called back on the event loop."""

from __future__ import annotations

import asyncio
import inspect
from typing import Any, Awaitable, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from ._client import Client, ExecResult, FileInfo, Sandbox, Snapshot, Timeout

__all__ = ["AsyncSandbox", "AsyncFiles"]

AsyncOutput = Callable[[bytes], Union[None, Awaitable[None]]]


def _on_loop(loop: asyncio.AbstractEventLoop, fn: Optional[AsyncOutput]) -> Optional[Callable[[bytes], None]]:
    """fn called on loop from the worker thread, awaited when it is a coroutine function; the
    worker waits for it, so a slow callback slows the command down instead of queueing."""
    if fn is None:
        return None

    async def call(b: bytes) -> None:
        r = fn(b)
        if inspect.isawaitable(r):
            await r

    def cb(b: bytes) -> None:
        asyncio.run_coroutine_threadsafe(call(b), loop).result()

    return cb


class AsyncFiles:
    def __init__(self, sb: Sandbox) -> None:
        self._f = sb.files

    async def write(self, path: str, data: Union[bytes, str], mode: Optional[int] = None) -> FileInfo:
        return await asyncio.to_thread(self._f.write, path, data, mode)

    async def read(self, path: str) -> bytes:
        return await asyncio.to_thread(self._f.read, path)

    async def read_text(self, path: str) -> str:
        return await asyncio.to_thread(self._f.read_text, path)

    async def list(self, path: str) -> List[FileInfo]:
        return await asyncio.to_thread(self._f.list, path)

    async def stat(self, path: str) -> FileInfo:
        return await asyncio.to_thread(self._f.stat, path)

    async def exists(self, path: str) -> bool:
        return await asyncio.to_thread(self._f.exists, path)

    async def mkdir(self, path: str) -> FileInfo:
        return await asyncio.to_thread(self._f.mkdir, path)

    async def remove(self, path: str, recursive: bool = False) -> None:
        await asyncio.to_thread(self._f.remove, path, recursive)


class AsyncSandbox:
    """Sandbox for asyncio: ``async with await AsyncSandbox.create(...) as sb``."""

    def __init__(self, sb: Sandbox) -> None:
        self.sync = sb
        self.files = AsyncFiles(sb)

    @property
    def name(self) -> str:
        return self.sync.name

    @property
    def info(self) -> Dict[str, Any]:
        return self.sync.info

    def __repr__(self) -> str:
        return "Async" + repr(self.sync)

    async def __aenter__(self) -> "AsyncSandbox":
        return self

    async def __aexit__(self, *exc: Any) -> None:
        await self.remove()

    @classmethod
    async def create(cls, name: str, **kw: Any) -> "AsyncSandbox":
        return cls(await asyncio.to_thread(lambda: Sandbox.create(name, **kw)))

    @classmethod
    async def get(cls, name: str, client: Optional[Client] = None) -> "AsyncSandbox":
        return cls(await asyncio.to_thread(Sandbox.get, name, client))

    @classmethod
    async def list(cls, labels: Union[None, Mapping[str, str], Iterable[str]] = None, *, all: bool = False,
                   client: Optional[Client] = None) -> List["AsyncSandbox"]:
        l = await asyncio.to_thread(lambda: Sandbox.list(labels, all=all, client=client))
        return [cls(s) for s in l]

    async def exec(self, argv: Union[str, Sequence[str]], *, stdin: Union[None, str, bytes] = None,
                   env: Union[None, Mapping[str, str], Sequence[str]] = None, timeout: Timeout = None,
                   workdir: Optional[str] = None, on_stdout: Optional[AsyncOutput] = None,
                   on_stderr: Optional[AsyncOutput] = None, capture: bool = True) -> ExecResult:
        loop = asyncio.get_running_loop()
        return await asyncio.to_thread(lambda: self.sync.exec(
            argv, stdin=stdin, env=env, timeout=timeout, workdir=workdir,
            on_stdout=_on_loop(loop, on_stdout), on_stderr=_on_loop(loop, on_stderr), capture=capture))

    async def refresh(self) -> Dict[str, Any]:
        return await asyncio.to_thread(self.sync.refresh)

    async def start(self) -> None:
        await asyncio.to_thread(self.sync.start)

    async def stop(self, force: bool = False) -> None:
        await asyncio.to_thread(self.sync.stop, force)

    async def pause(self) -> None:
        await asyncio.to_thread(self.sync.pause)

    async def resume(self) -> None:
        await asyncio.to_thread(self.sync.resume)

    async def remove(self) -> None:
        await asyncio.to_thread(self.sync.remove)

    async def ports(self) -> List[Dict[str, Any]]:
        return await asyncio.to_thread(self.sync.ports)

    async def snapshot(self, name: Optional[str] = None) -> Snapshot:
        return await asyncio.to_thread(self.sync.snapshot, name)

    async def fork(self, name: str, labels: Optional[Mapping[str, str]] = None) -> "AsyncSandbox":
        return AsyncSandbox(await asyncio.to_thread(self.sync.fork, name, labels))
