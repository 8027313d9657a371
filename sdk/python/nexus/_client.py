"""The synchronous client: stdlib http.client only."""

from __future__ import annotations

import http.client
from typing import Any, Callable, Dict, List, Mapping, Optional, Sequence, Union

from . import _ops
from ._ops import Env, ExecResult, FileInfo, Labels, Op, Timeout
from .errors import NotFoundError, UnavailableError

__all__ = ["Client", "Sandbox", "Files", "ExecResult", "FileInfo", "Snapshot"]

Output = Callable[[bytes], Any]


class Client(_ops.Endpoint):
    """A connection to a nexus API. ``url`` and ``token`` default to $NEXUS_API_URL and
    $NEXUS_API_TOKEN; ``ca_file`` trusts a private CA for https (else the system's)."""

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def send(self, op: Op) -> "_Response":
        """Sends op and returns its response once it is a success; an error answer raises its
        NexusError. The caller reads and closes the response."""
        headers, body = self._headers(op)
        conn = self._connect(self._deadline(op))
        try:
            conn.request(op.method, self._target(op), body=body, headers=headers)
            resp = _Response(conn, conn.getresponse())
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise self._unavailable(e) from e
        if resp.status >= 400:
            try:
                raw = resp.read(_ops.MAX_ERROR_BODY)
            except (OSError, http.client.HTTPException):
                raw = b""
            finally:
                resp.close()
            raise _ops.answer_error(resp.status, raw)
        return resp

    def body(self, op: Op) -> bytes:
        """op's whole answer."""
        resp = self.send(op)
        try:
            return resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise self._unavailable(e) from e
        finally:
            resp.close()

    def call(self, op: Op) -> Any:
        """op's JSON answer."""
        return _ops.parse_json(self.body(op))

    def request(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None,
                body: Optional[bytes] = None, json_body: Any = None, content_type: Optional[str] = None,
                timeout: Optional[float] = _ops.DEFAULT) -> Any:
        """One request of any route whose JSON answer it returns."""
        return self.call(Op(method, path, query, body, json_body, content_type, timeout))


class Snapshot(_ops.SnapshotInfo):
    """A snapshot of a sandbox; ``fork`` boots a new sandbox from it."""

    def __init__(self, name: str, sandbox: str, info: Optional[Dict[str, Any]] = None, client: Optional[Client] = None) -> None:
        super().__init__(name, sandbox, info or {})
        self.client = client or Client()

    def fork(self, name: str, labels: Optional[Mapping[str, str]] = None) -> "Sandbox":
        return Sandbox._of(self.client, _ops.fork(self.name, name, labels), name)

    def remove(self) -> None:
        self.client.call(_ops.remove_snapshot(self.name))


class Files:
    """A sandbox's files (absolute guest paths)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _call(self, op: Op) -> Any:
        return self._sb.client.call(op)

    def write(self, path: str, data: Union[bytes, str], mode: Optional[int] = None) -> FileInfo:
        """Writes data to path (str as UTF-8), replacing the file; mode is its permission bits."""
        return FileInfo.of(self._call(_ops.write_file(self._sb.name, path, data, mode)))

    def read(self, path: str) -> bytes:
        return self._sb.client.body(_ops.read_file(self._sb.name, path))

    def read_text(self, path: str) -> str:
        return self.read(path).decode("utf-8", "replace")

    def list(self, path: str) -> List[FileInfo]:
        return _ops.entries(self._call(_ops.files(self._sb.name, "", "GET", path)))

    def stat(self, path: str) -> FileInfo:
        return FileInfo.of(self._call(_ops.files(self._sb.name, "/stat", "GET", path)))

    def exists(self, path: str) -> bool:
        try:
            self.stat(path)
            return True
        except NotFoundError:
            return False

    def mkdir(self, path: str) -> FileInfo:
        return FileInfo.of(self._call(_ops.files(self._sb.name, "/mkdir", "POST", path)))

    def remove(self, path: str, recursive: bool = False) -> None:
        self._call(_ops.files(self._sb.name, "", "DELETE", path, recursive=recursive or None))


class Sandbox(_ops.SandboxState):
    """One sandbox. ``Sandbox.create(...)`` boots one; as a context manager it is removed at the
    end of the block."""

    def __init__(self, name: str, client: Optional[Client] = None, info: Optional[Dict[str, Any]] = None) -> None:
        self.name = name
        self.client = client or Client()
        self.info: Dict[str, Any] = info or {}
        self.files = Files(self)

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    @classmethod
    def _of(cls, c: Client, op: Op, name: str) -> "Sandbox":
        info = c.call(op)
        return cls(info.get("name", name), c, info)

    # --- the sandboxes -------------------------------------------------------------------

    @classmethod
    def create(cls, name: str, *, image: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
               agent: Optional[str] = None, memory_mib: Optional[int] = None, vcpus: Optional[int] = None,
               client: Optional[Client] = None, **options: Any) -> "Sandbox":
        """Creates and boots a sandbox. options are the API's other create fields
        (egress_mode, allow_hosts, ttl, ephemeral, …, see /openapi.json CreateRequest)."""
        return cls._of(client or Client(), _ops.create(name, image, labels, agent, memory_mib, vcpus, options), name)

    @classmethod
    def get(cls, name: str, client: Optional[Client] = None) -> "Sandbox":
        return cls._of(client or Client(), _ops.get(name), name)

    @classmethod
    def list(cls, labels: Labels = None, *, all: bool = False, client: Optional[Client] = None) -> List["Sandbox"]:
        """The sandboxes whose labels match (a dict of equalities, or selector strings such as
        "k=v", "k!=v", "k"); all: stopped and failed ones too."""
        c = client or Client()
        d = c.call(_ops.list_sandboxes(labels, all))
        return [cls(info.get("name", ""), c, info) for info in d.get("sandboxes") or []]

    def refresh(self) -> Dict[str, Any]:
        self.info = self.client.call(_ops.get(self.name))
        return self.info

    def _verb(self, verb: str, force: Optional[bool] = None) -> None:
        self._took(self.client.call(_ops.verb(self.name, verb, force)))

    def start(self) -> None:
        self._verb("start")

    def stop(self, force: bool = False) -> None:
        self._verb("stop", force or None)

    def pause(self) -> None:
        self._verb("pause")

    def resume(self) -> None:
        self._verb("resume")

    def remove(self) -> None:
        """Removes the sandbox and everything it owns, running or not."""
        self.client.call(_ops.remove(self.name))

    # --- commands ------------------------------------------------------------------------

    def exec(self, argv: Union[str, Sequence[str]], *, stdin: Union[None, str, bytes] = None,
             env: Env = None, timeout: Timeout = None, workdir: Optional[str] = None,
             on_stdout: Optional[Output] = None, on_stderr: Optional[Output] = None,
             capture: bool = True) -> ExecResult:
        """Runs argv (a string runs under sh -c) and waits for it. Output streams to
        on_stdout/on_stderr as it comes; with capture (the default) it is also collected in the
        result. timeout (seconds, or "5m") kills the command, which then exits 124. A command
        that fails is no exception: look at exit_code."""
        resp = self.client.send(_ops.exec_stream(self.name, argv, stdin, env, timeout, workdir))
        got = _ops.ExecOutput(capture)
        try:
            while True:
                ch, n = _ops.frame_header(_read_full(resp, 5))
                data = _read_full(resp, n) if n else b""
                res = got.take(ch, data)
                if res is not None:
                    return res
                cb = _ops.callback_for(ch, on_stdout, on_stderr)
                if cb and data:
                    cb(data)
        except (OSError, http.client.HTTPException) as e:
            raise UnavailableError("exec: %s" % e) from e
        finally:
            resp.close()

    # --- ports, snapshots, forks ---------------------------------------------------------

    def ports(self) -> List[Dict[str, Any]]:
        """The sandbox's port forwards: port (guest), host_addr (127.0.0.1:PORT on the host), state."""
        return list(self.client.call(_ops.ports(self.name)).get("ports") or [])

    def snapshot(self, name: Optional[str] = None) -> Snapshot:
        """Snapshots the running sandbox (memory and disk); the name defaults to the server's."""
        d = self.client.call(_ops.snapshot(self.name, name))
        return Snapshot(*_ops.snapshot_of(d, name, self.name), client=self.client)

    def fork(self, name: str, labels: Optional[Mapping[str, str]] = None) -> "Sandbox":
        """Boots a new sandbox from this one's current state."""
        return Sandbox._of(self.client, _ops.fork(self.name, name, labels), name)


class _Response:
    """An answer, whose close also closes its connection."""

    def __init__(self, conn: http.client.HTTPConnection, resp: http.client.HTTPResponse) -> None:
        self._conn, self._resp = conn, resp
        self.status = resp.status

    def read(self, n: Optional[int] = None) -> bytes:
        return self._resp.read(n)

    def close(self) -> None:
        self._resp.close()
        self._conn.close()


def _read_full(resp: _Response, n: int) -> Optional[bytes]:
    """Exactly n bytes, or None at the end of the stream."""
    buf = b""
    while len(buf) < n:
        chunk = resp.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf
