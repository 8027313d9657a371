"""What the sync and the asyncio clients share: the API's requests as plain values (Op), the
error answer, the exec stream's frames and the result types. No I/O here."""

from __future__ import annotations

import json
import os
import ssl
import struct
import urllib.parse
from dataclasses import dataclass, field
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Sequence, Tuple, Union

from .errors import InvalidError, NexusError, UnavailableError, error_for

# The frames of POST …/exec/stream: a channel byte, a big-endian uint32 length, the bytes.
STDOUT, STDERR, EXIT = 1, 2, 3
MAX_FRAME = 16 << 20
MAX_ERROR_BODY = 64 << 10
DEFAULT_URL = "http://127.0.0.1:7477"

Timeout = Union[None, int, float, str]
Labels = Union[None, Mapping[str, str], Iterable[str]]
Env = Union[None, Mapping[str, str], Sequence[str]]

# The client's own deadline (Client.timeout) rather than none.
DEFAULT = -1.0


@dataclass
class Op:
    """One request of the API. timeout None: no deadline (creates, execs, file transfers)."""

    method: str
    path: str
    query: Optional[Mapping[str, Any]] = None
    body: Optional[bytes] = None
    json: Any = None
    content_type: Optional[str] = None
    timeout: Optional[float] = DEFAULT


class Endpoint:
    """Where the API is and how to authenticate: ``url`` and ``token`` default to
    $NEXUS_API_URL and $NEXUS_API_TOKEN; ``ca_file`` trusts a private CA for https."""

    def __init__(self, url: Optional[str] = None, token: Optional[str] = None, *,
                 timeout: float = 60.0, ca_file: Optional[str] = None,
                 ssl_context: Optional[ssl.SSLContext] = None) -> None:
        url = url or os.environ.get("NEXUS_API_URL") or DEFAULT_URL
        token = token if token is not None else os.environ.get("NEXUS_API_TOKEN", "")
        if any(not 0x21 <= ord(c) <= 0x7E for c in token):  # never echoed (http.client would)
            raise InvalidError("the API token has spaces or control characters: set NEXUS_API_TOKEN to the token alone")
        u = urllib.parse.urlsplit(url)
        if u.scheme not in ("http", "https") or not u.hostname:
            raise InvalidError("invalid API URL %r: use http://HOST:PORT or https://HOST:PORT" % url)
        self.url = url.rstrip("/")
        self._scheme = u.scheme
        self._host = u.hostname
        self._port = u.port or (443 if u.scheme == "https" else 80)
        self._netloc = u.netloc.rpartition("@")[2]
        self._prefix = u.path.rstrip("/")
        self._token = token
        self.timeout = timeout
        if u.scheme == "https" and ssl_context is None:
            ssl_context = ssl.create_default_context(cafile=ca_file)
        self._ssl = ssl_context

    def __repr__(self) -> str:  # never the token
        return "%s(%r)" % (type(self).__name__, self.url)

    def _deadline(self, op: Op) -> Optional[float]:
        return self.timeout if op.timeout == DEFAULT else op.timeout

    def _target(self, op: Op) -> str:
        path = self._prefix + op.path
        if op.query:
            pairs = []
            for k, v in op.query.items():
                for one in (v if isinstance(v, (list, tuple)) else [v]):
                    if one is None:
                        continue
                    pairs.append((k, str(one).lower() if isinstance(one, bool) else str(one)))
            if pairs:
                path += "?" + urllib.parse.urlencode(pairs)
        return path

    def _headers(self, op: Op) -> Tuple[Dict[str, str], Optional[bytes]]:
        # One request per connection: with Connection: close the response owns the socket.
        headers = {"Accept": "application/json", "Connection": "close"}
        if self._token:
            headers["Authorization"] = "Bearer " + self._token
        body, ctype = op.body, op.content_type
        if op.json is not None:
            body = json.dumps(op.json).encode()
            ctype = "application/json"
        if ctype:
            headers["Content-Type"] = ctype
        if body is not None:
            headers["Content-Length"] = str(len(body))
        return headers, body

    def _unavailable(self, e: BaseException) -> UnavailableError:
        return UnavailableError("nexus API at %s: %s" % (self.url, e or type(e).__name__))


def answer_error(status: int, raw: bytes) -> NexusError:
    """The exception of an error answer's status and (envelope) body."""
    code, message = "", "HTTP %d" % status
    try:
        e = json.loads(raw)["error"]
        code, message = e.get("code", ""), e.get("message", message)
    except (ValueError, KeyError, TypeError, AttributeError):
        pass
    return error_for(status, code, message)


def parse_json(raw: bytes) -> Any:
    return json.loads(raw) if raw.strip() else None


# --- result types ----------------------------------------------------------------------------


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
class SnapshotInfo:
    name: str
    sandbox: str
    info: Dict[str, Any] = field(default_factory=dict, repr=False)


class SandboxState:
    """What Sandbox and AsyncSandbox share: the name and the last record read."""

    name: str
    info: Dict[str, Any]

    def __repr__(self) -> str:
        return "%s(%r, state=%r)" % (type(self).__name__, self.name, self.info.get("state"))

    @property
    def state(self) -> str:
        return str(self.info.get("state", ""))

    @property
    def labels(self) -> Dict[str, str]:
        return dict(self.info.get("labels") or {})

    def _took(self, d: Any) -> None:
        """Keeps the state a lifecycle call answered."""
        if d and d.get("state"):
            self.info["state"] = d["state"]


# --- the requests ----------------------------------------------------------------------------


def sandbox_path(name: str) -> str:
    return "/v1/sandboxes/" + urllib.parse.quote(name, safe="")


def duration(t: Timeout) -> Optional[str]:
    """A timeout in seconds (or a Go duration string such as "5m") as the API's duration."""
    if t is None:
        return None
    if isinstance(t, str):
        return t
    if t <= 0:
        raise InvalidError("timeout must be positive")
    return "%dms" % max(1, round(t * 1000))


def selector(labels: Labels) -> List[str]:
    if isinstance(labels, Mapping):
        return ["%s=%s" % (k, v) for k, v in labels.items()]
    return list(labels) if labels is not None else []


def create(name: str, image: Optional[str], labels: Optional[Mapping[str, str]], agent: Optional[str],
           memory_mib: Optional[int], vcpus: Optional[int], options: Mapping[str, Any]) -> Op:
    body: Dict[str, Any] = {"name": name}
    for k, v in (("image", image), ("labels", dict(labels) if labels else None), ("agent", agent),
                 ("memory_mib", memory_mib), ("vcpus", vcpus)):
        if v is not None:
            body[k] = v
    body.update({k: v for k, v in options.items() if v is not None})
    return Op("POST", "/v1/sandboxes", json=body, timeout=None)


def get(name: str) -> Op:
    return Op("GET", sandbox_path(name))


def list_sandboxes(labels: Labels, all: bool) -> Op:
    return Op("GET", "/v1/sandboxes", query={"selector": selector(labels), "all": all or None})


def verb(name: str, verb: str, force: Optional[bool] = None) -> Op:
    return Op("POST", sandbox_path(name) + "/" + verb, query={"force": force}, timeout=None)


def remove(name: str) -> Op:
    return Op("DELETE", sandbox_path(name), timeout=None)


def ports(name: str) -> Op:
    return Op("GET", sandbox_path(name) + "/ports")


def snapshot(name: str, snap: Optional[str]) -> Op:
    return Op("POST", sandbox_path(name) + "/snapshots", json={"snapshot": snap} if snap else {}, timeout=None)


def snapshot_of(d: Mapping[str, Any], snap: Optional[str], sandbox: str) -> Tuple[str, str, Dict[str, Any]]:
    return d.get("name", snap or ""), d.get("sandbox", sandbox), dict(d)


def remove_snapshot(name: str) -> Op:
    return Op("DELETE", "/v1/snapshots/" + urllib.parse.quote(name, safe=""))


def fork(source: str, name: str, labels: Optional[Mapping[str, str]]) -> Op:
    body: Dict[str, Any] = {"source": source, "name": name}
    if labels:
        body["labels"] = dict(labels)
    return Op("POST", "/v1/forks", json=body, timeout=None)


def files(sandbox: str, suffix: str, method: str, path: str, **query: Any) -> Op:
    return Op(method, sandbox_path(sandbox) + "/files" + suffix, query={"path": path, **query})


def write_file(sandbox: str, path: str, data: Union[bytes, str], mode: Optional[int]) -> Op:
    op = files(sandbox, "/content", "PUT", path, mode="%o" % mode if mode is not None else None)
    op.body = data.encode() if isinstance(data, str) else bytes(data)
    op.content_type = "application/octet-stream"
    op.timeout = None
    return op


def read_file(sandbox: str, path: str) -> Op:
    op = files(sandbox, "/content", "GET", path)
    op.timeout = None
    return op


def entries(d: Optional[Mapping[str, Any]]) -> List[FileInfo]:
    return [FileInfo.of(e) for e in (d or {}).get("entries") or []]


def exec_stream(name: str, argv: Union[str, Sequence[str]], stdin: Union[None, str, bytes], env: Env,
                timeout: Timeout, workdir: Optional[str]) -> Op:
    """POST …/exec/stream: argv (a string runs under sh -c) and its options."""
    if isinstance(argv, str):
        argv = ["sh", "-c", argv]
    body: Dict[str, Any] = {"argv": list(argv)}
    if stdin is not None:
        body["stdin"] = stdin.decode() if isinstance(stdin, bytes) else stdin
    if env is not None:
        body["env"] = ["%s=%s" % (k, v) for k, v in env.items()] if isinstance(env, Mapping) else list(env)
    if workdir:
        body["workdir"] = workdir
    t = duration(timeout)
    if t:
        body["timeout"] = t
    return Op("POST", sandbox_path(name) + "/exec/stream", json=body, timeout=None)


def frame_header(hdr: Optional[bytes]) -> Tuple[int, int]:
    """The channel and length of a frame's 5-byte header (None: the stream ended)."""
    if hdr is None:
        raise UnavailableError("exec: the stream ended before the command exited")
    n = struct.unpack(">I", hdr[1:])[0]
    if n > MAX_FRAME:
        raise UnavailableError("exec: a frame of %d bytes" % n)
    return hdr[0], n


class ExecOutput:
    """Collects an exec stream's frames: output kept when capture is on, the result at exit."""

    def __init__(self, capture: bool) -> None:
        self.capture = capture
        self.out: List[bytes] = []
        self.err: List[bytes] = []

    def take(self, ch: int, data: Optional[bytes]) -> Optional[ExecResult]:
        if data is None:
            raise UnavailableError("exec: the stream ended inside a frame")
        if ch == EXIT:
            m = json.loads(data)
            if m.get("type") == "error":
                raise error_for(0, m.get("code", ""), m.get("message", "exec failed"))
            return ExecResult(m.get("exit_code", 0), b"".join(self.out), b"".join(self.err), m.get("signal", 0), m.get("error", ""))
        if self.capture and ch in (STDOUT, STDERR):
            (self.out if ch == STDOUT else self.err).append(data)
        return None


def callback_for(ch: int, on_stdout: Optional[Callable[[bytes], Any]],
                 on_stderr: Optional[Callable[[bytes], Any]]) -> Optional[Callable[[bytes], Any]]:
    return on_stdout if ch == STDOUT else on_stderr if ch == STDERR else None
