"""The synchronous client: stdlib http.client only."""

from __future__ import annotations

import http.client
import json
import os
import socket
import ssl
import struct
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Union

from .errors import InvalidError, NexusError, UnavailableError, error_for

__all__ = ["Client", "Sandbox", "Files", "ExecResult", "FileInfo", "Snapshot"]

# The frames of POST …/exec/stream: a channel byte, a big-endian uint32 length, the bytes.
_STDOUT, _STDERR, _EXIT = 1, 2, 3
_MAX_FRAME = 16 << 20
_MAX_ERROR_BODY = 64 << 10

Output = Callable[[bytes], Any]
Timeout = Union[None, int, float, str]


def _duration(t: Timeout) -> Optional[str]:
    """A timeout in seconds (or a Go duration string such as "5m") as the API's duration."""
    if t is None:
        return None
    if isinstance(t, str):
        return t
    if t <= 0:
        raise InvalidError("timeout must be positive")
    return "%dms" % max(1, round(t * 1000))


def _env_list(env: Union[None, Mapping[str, str], Sequence[str]]) -> Optional[List[str]]:
    if env is None:
        return None
    if isinstance(env, Mapping):
        return ["%s=%s" % (k, v) for k, v in env.items()]
    return list(env)


class Client:
    """A connection to a nexus API. ``url`` and ``token`` default to $NEXUS_API_URL and
    $NEXUS_API_TOKEN; ``ca_file`` trusts a private CA for https (else the system's)."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 timeout: float = 60.0, ca_file: Optional[str] = None,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        url = url or os.environ.get("NEXUS_API_URL") or "http://127.0.0.1:7477"
        token = token if token is not None else os.environ.get("NEXUS_API_TOKEN", "")
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise InvalidError("invalid API URL %r: use http://HOST:PORT or https://HOST:PORT" % url)
        self.url = url.rstrip("/")
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port or (443 if u.scheme == "https" else 80)
        self._prefix = u.path.rstrip("/")
        self._token = token
        self.timeout = timeout
        if u.scheme == "https" and ssl_context is None:
            ssl_context = ssl.create_default_context(cafile=ca_file)
        self._ssl = ssl_context

    def __repr__(self) -> str:  # never the token
        return "Client(%r)" % self.url

    def _connect(self, timeout: Optional[float]) -> http.client.HTTPConnection:
        if self._scheme == "https":
            return http.client.HTTPSConnection(self._host, self._port, timeout=timeout, context=self._ssl)
        return http.client.HTTPConnection(self._host, self._port, timeout=timeout)

    def open(self, method: str, path: str, *, query: Optional[Mapping[str, Any]] = None,
             body: Union[None, bytes] = None, json_body: Any = None,
             content_type: Optional[str] = None, timeout: Optional[float] = -1.0) -> http.client.HTTPResponse:
        """Sends one request and returns its response once it is a success; an error answer
        raises its NexusError. The caller reads and closes the response."""
        if query:
            pairs = []
            for k, v in query.items():
                for one in (v if isinstance(v, (list, tuple)) else [v]):
                    if one is None:
                        continue
                    pairs.append((k, str(one).lower() if isinstance(one, bool) else str(one)))
            if pairs:
                path += "?" + urllib.parse.urlencode(pairs)
        # One request per connection: with Connection: close the response owns the socket and
        # closing the response closes it.
        headers = {"Accept": "application/json", "Connection": "close"}
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        if json_body is not None:
            body = json.dumps(json_body).encode()
            content_type = "application/json"
        if content_type:
            headers["Content-Type"] = content_type
        if body is not None:
            headers["Content-Length"] = str(len(body))
        conn = self._connect(self.timeout if timeout == -1.0 else timeout)
        try:
            conn.request(method, self._prefix + path, body=body, headers=headers)
            resp = conn.getresponse()
        except (OSError, http.client.HTTPException) as e:
            conn.close()
            raise UnavailableError("nexus API at %s: %s" % (self.url, e)) from e
        if resp.status >= 400:
            try:
                raw = resp.read(_MAX_ERROR_BODY)
            finally:
                resp.close()
            code, message = "", "HTTP %d" % resp.status
            try:
                e = json.loads(raw)["error"]
                code, message = e.get("code", ""), e.get("message", message)
            except (ValueError, KeyError, TypeError):
                pass
            raise error_for(resp.status, code, message)
        return resp

    def request(self, method: str, path: str, **kw: Any) -> Any:
        """One request whose JSON answer it returns."""
        resp = self.open(method, path, **kw)
        try:
            raw = resp.read()
        except (OSError, http.client.HTTPException) as e:
            raise UnavailableError("nexus API at %s: %s" % (self.url, e)) from e
        finally:
            resp.close()
        return json.loads(raw) if raw.strip() else None


def _sandbox_path(name: str) -> str:
    return "/v1/sandboxes/" + urllib.parse.quote(name, safe="")


@dataclass
class ExecResult:
    """How a command ended. ``stdout``/``stderr`` are empty when capture was off."""

    exit_code: int
    stdout: bytes = b""
    stderr: bytes = b""
    signal: int = 0
    error: str = ""

    @property
    def text(self) -> str:
        """stdout decoded as UTF-8."""
        return self.stdout.decode("utf-8", "replace")


@dataclass
class FileInfo:
    name: str
    path: str
    size: int
    mode: int
    type: str
    mod_time: str

    @classmethod
    def of(cls, d: Mapping[str, Any]) -> "FileInfo":
        return cls(d.get("name", ""), d.get("path", ""), d.get("size", 0), d.get("mode", 0), d.get("type", ""), d.get("mod_time", ""))


@dataclass
class Snapshot:
    """A snapshot of a sandbox; ``fork`` boots a new sandbox from it."""

    name: str
    sandbox: str
    info: Dict[str, Any] = field(default_factory=dict, repr=False)
    client: Optional[Client] = field(default=None, repr=False, compare=False)

    def fork(self, name: str, labels: Optional[Mapping[str, str]] = None) -> "Sandbox":
        return Sandbox._fork(self.client or Client(), self.name, name, labels)

    def remove(self) -> None:
        (self.client or Client()).request("DELETE", "/v1/snapshots/" + urllib.parse.quote(self.name, safe=""))


class Files:
    """A sandbox's files (absolute guest paths)."""

    def __init__(self, sandbox: "Sandbox") -> None:
        self._sb = sandbox

    def _path(self, suffix: str) -> str:
        return _sandbox_path(self._sb.name) + "/files" + suffix

    def write(self, path: str, data: Union[bytes, str], mode: Optional[int] = None) -> FileInfo:
        """Writes data to path (str as UTF-8), replacing the file; mode is its permission bits."""
        if isinstance(data, str):
            data = data.encode()
        q: Dict[str, Any] = {"path": path}
        if mode is not None:
            q["mode"] = "%o" % mode
        return FileInfo.of(self._sb.client.request("PUT", self._path("/content"), query=q, body=bytes(data),
                                                    content_type="application/octet-stream", timeout=None))

    def read(self, path: str) -> bytes:
        resp = self._sb.client.open("GET", self._path("/content"), query={"path": path}, timeout=None)
        try:
            return resp.read()
        finally:
            resp.close()

    def read_text(self, path: str) -> str:
        return self.read(path).decode("utf-8", "replace")

    def list(self, path: str) -> List[FileInfo]:
        d = self._sb.client.request("GET", self._path(""), query={"path": path})
        return [FileInfo.of(e) for e in d.get("entries") or []]

    def stat(self, path: str) -> FileInfo:
        return FileInfo.of(self._sb.client.request("GET", self._path("/stat"), query={"path": path}))

    def exists(self, path: str) -> bool:
        from .errors import NotFoundError
        try:
            self.stat(path)
            return True
        except NotFoundError:
            return False

    def mkdir(self, path: str) -> FileInfo:
        return FileInfo.of(self._sb.client.request("POST", self._path("/mkdir"), query={"path": path}))

    def remove(self, path: str, recursive: bool = False) -> None:
        self._sb.client.request("DELETE", self._path(""), query={"path": path, "recursive": recursive or None})


class Sandbox:
    """One sandbox. ``Sandbox.create(...)`` boots one; as a context manager it is removed at the
    end of the block."""

    def __init__(self, name: str, client: Optional[Client] = None, info: Optional[Dict[str, Any]] = None) -> None:
        self.name = name
        self.client = client or Client()
        self.info: Dict[str, Any] = info or {}
        self.files = Files(self)

    def __repr__(self) -> str:
        return "Sandbox(%r, state=%r)" % (self.name, self.info.get("state"))

    def __enter__(self) -> "Sandbox":
        return self

    def __exit__(self, *exc: Any) -> None:
        self.remove()

    # --- the sandboxes -------------------------------------------------------------------

    @classmethod
    def create(cls, name: str, *, image: Optional[str] = None, labels: Optional[Mapping[str, str]] = None,
               agent: Optional[str] = None, memory_mib: Optional[int] = None, vcpus: Optional[int] = None,
               client: Optional[Client] = None, **options: Any) -> "Sandbox":
        """Creates and boots a sandbox. options are the API's other create fields
        (egress_mode, allow_hosts, ttl, ephemeral, …, see /openapi.json CreateRequest)."""
        body: Dict[str, Any] = {"name": name}
        for k, v in (("image", image), ("labels", dict(labels) if labels else None), ("agent", agent),
                     ("memory_mib", memory_mib), ("vcpus", vcpus)):
            if v is not None:
                body[k] = v
        body.update({k: v for k, v in options.items() if v is not None})
        c = client or Client()
        info = c.request("POST", "/v1/sandboxes", json_body=body, timeout=None)
        return cls(info.get("name", name), c, info)

    @classmethod
    def get(cls, name: str, client: Optional[Client] = None) -> "Sandbox":
        c = client or Client()
        info = c.request("GET", _sandbox_path(name))
        return cls(info.get("name", name), c, info)

    @classmethod
    def list(cls, labels: Union[None, Mapping[str, str], Iterable[str]] = None, *, all: bool = False,
             client: Optional[Client] = None) -> List["Sandbox"]:
        """The sandboxes whose labels match (a dict of equalities, or selector strings such as
        "k=v", "k!=v", "k"); all: stopped and failed ones too."""
        sel: List[str] = []
        if isinstance(labels, Mapping):
            sel = ["%s=%s" % (k, v) for k, v in labels.items()]
        elif labels is not None:
            sel = list(labels)
        c = client or Client()
        d = c.request("GET", "/v1/sandboxes", query={"selector": sel, "all": all or None})
        out = []
        for info in d.get("sandboxes") or []:
            out.append(cls(info.get("name", ""), c, info))
        return out

    def refresh(self) -> Dict[str, Any]:
        self.info = self.client.request("GET", _sandbox_path(self.name))
        return self.info

    @property
    def state(self) -> str:
        return str(self.info.get("state", ""))

    @property
    def labels(self) -> Dict[str, str]:
        return dict(self.info.get("labels") or {})

    def _verb(self, verb: str, force: Optional[bool] = None) -> Dict[str, Any]:
        d = self.client.request("POST", _sandbox_path(self.name) + "/" + verb, query={"force": force}, timeout=None)
        if d and d.get("state"):
            self.info["state"] = d["state"]
        return d

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
        self.client.request("DELETE", _sandbox_path(self.name), timeout=None)

    # --- commands ------------------------------------------------------------------------

    def exec(self, argv: Union[str, Sequence[str]], *, stdin: Union[None, str, bytes] = None,
             env: Union[None, Mapping[str, str], Sequence[str]] = None, timeout: Timeout = None,
             workdir: Optional[str] = None, on_stdout: Optional[Output] = None,
             on_stderr: Optional[Output] = None, capture: bool = True) -> ExecResult:
        """Runs argv (a string runs under sh -c) and waits for it. Output streams to
        on_stdout/on_stderr as it comes; with capture (the default) it is also collected in the
        result. timeout (seconds, or "5m") kills the command, which then exits 124. A command
        that fails is no exception: look at exit_code."""
        if isinstance(argv, str):
            argv = ["sh", "-c", argv]
        body: Dict[str, Any] = {"argv": list(argv)}
        if stdin is not None:
            body["stdin"] = stdin.decode() if isinstance(stdin, bytes) else stdin
        if env is not None:
            body["env"] = _env_list(env)
        if workdir:
            body["workdir"] = workdir
        t = _duration(timeout)
        if t:
            body["timeout"] = t
        resp = self.client.open("POST", _sandbox_path(self.name) + "/exec/stream", json_body=body, timeout=None)
        out: List[bytes] = []
        err: List[bytes] = []
        try:
            while True:
                hdr = _read_full(resp, 5)
                if hdr is None:
                    raise UnavailableError("exec: the stream ended before the command exited")
                ch, n = hdr[0], struct.unpack(">I", hdr[1:])[0]
                if n > _MAX_FRAME:
                    raise UnavailableError("exec: a frame of %d bytes" % n)
                data = _read_full(resp, n) if n else b""
                if data is None:
                    raise UnavailableError("exec: the stream ended inside a frame")
                if ch == _STDOUT:
                    if capture:
                        out.append(data)
                    if on_stdout:
                        on_stdout(data)
                elif ch == _STDERR:
                    if capture:
                        err.append(data)
                    if on_stderr:
                        on_stderr(data)
                elif ch == _EXIT:
                    m = json.loads(data)
                    if m.get("type") == "error":
                        raise error_for(0, m.get("code", ""), m.get("message", "exec failed"))
                    return ExecResult(m.get("exit_code", 0), b"".join(out), b"".join(err), m.get("signal", 0), m.get("error", ""))
        except (OSError, http.client.HTTPException) as e:
            raise UnavailableError("exec: %s" % e) from e
        finally:
            resp.close()

    # --- ports, snapshots, forks ---------------------------------------------------------

    def ports(self) -> List[Dict[str, Any]]:
        """The sandbox's port forwards: port (guest), host_addr (127.0.0.1:PORT on the host), state."""
        return list(self.client.request("GET", _sandbox_path(self.name) + "/ports").get("ports") or [])

    def snapshot(self, name: Optional[str] = None) -> Snapshot:
        """Snapshots the running sandbox (memory and disk); the name defaults to the server's."""
        body = {"snapshot": name} if name else {}
        d = self.client.request("POST", _sandbox_path(self.name) + "/snapshots", json_body=body, timeout=None)
        return Snapshot(d.get("name", name or ""), d.get("sandbox", self.name), d, self.client)

    def fork(self, name: str, labels: Optional[Mapping[str, str]] = None) -> "Sandbox":
        """Boots a new sandbox from this one's current state."""
        return Sandbox._fork(self.client, self.name, name, labels)

    @classmethod
    def _fork(cls, c: Client, source: str, name: str, labels: Optional[Mapping[str, str]]) -> "Sandbox":
        body: Dict[str, Any] = {"source": source, "name": name}
        if labels:
            body["labels"] = dict(labels)
        info = c.request("POST", "/v1/forks", json_body=body, timeout=None)
        return cls(info.get("name", name), c, info)


def _read_full(resp: http.client.HTTPResponse, n: int) -> Optional[bytes]:
    """Exactly n bytes, or None at the end of the stream."""
    buf = b""
    while len(buf) < n:
        chunk = resp.read(n - len(buf))
        if not chunk:
            return None
        buf += chunk
    return buf
