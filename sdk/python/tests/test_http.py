"""Both clients' HTTP against a fake API on loopback (no stack needed): chunked exec frames split
anywhere, a Content-Length body, an answer read to the close, and error envelopes."""

import asyncio
import json
import socket
import struct
import threading
import unittest
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import nexus
from nexus import AsyncClient, AsyncSandbox, Client, Sandbox

BLOB = bytes(range(256)) * 12000  # 3 MB


def frame(ch: int, data: bytes) -> bytes:
    return bytes([ch]) + struct.pack(">I", len(data)) + data


class Fake(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a: object) -> None:
        pass

    def answer(self, status: int, body: bytes, close_delimited: bool = False) -> None:
        self.send_response(status)
        if close_delimited:
            self.send_header("Connection", "close")
            self.end_headers()
            self.wfile.write(body)
            self.close_connection = True
            return
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/v1/sandboxes/box/files/content"):
            return self.answer(200, BLOB, close_delimited=True)
        if self.path.startswith("/v1/sandboxes/box/files/stat"):
            return self.answer(200, json.dumps({"name": "f", "size": len(BLOB), "type": "file"}).encode())
        if self.path.startswith("/v1/sandboxes/box"):
            return self.answer(200, json.dumps({"name": "box", "state": "running", "labels": {"a": "b"}}).encode())
        codes = {"/v1/sandboxes/conflict": (409, "conflict"), "/v1/sandboxes/internal": (500, "internal"),
                 "/v1/sandboxes/busy": (503, "unavailable"), "/v1/sandboxes/scope": (403, "refused")}
        status, code = codes.get(self.path, (404, "not_found"))
        self.answer(status, json.dumps({"error": {"code": code, "message": "no: " + self.path}}).encode())

    def do_POST(self) -> None:
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        self.send_response(200)
        self.send_header("Transfer-Encoding", "chunked")
        self.end_headers()
        stream = b"".join(frame(1 + i % 2, ("%s %d\n" % (body["argv"][-1], i)).encode()) for i in range(200))
        stream += frame(3, json.dumps({"type": "exit", "exit_code": 7, "signal": 0}).encode())
        # Chunks of odd sizes, so frame headers and bodies straddle them.
        for i in range(0, len(stream), 7):
            part = stream[i:i + 7]
            self.wfile.write(b"%x;ext=1\r\n" % len(part) + part + b"\r\n")
        self.wfile.write(b"0\r\nX-Trailer: y\r\n\r\n")


class HTTPTest(unittest.TestCase):
    @classmethod
    def setUpClass(cls) -> None:
        cls.srv = ThreadingHTTPServer(("127.0.0.1", 0), Fake)
        threading.Thread(target=cls.srv.serve_forever, daemon=True).start()
        cls.url = "http://127.0.0.1:%d" % cls.srv.server_port
        want_out = b"".join(b"go %d\n" % i for i in range(0, 200, 2))
        want_err = b"".join(b"go %d\n" % i for i in range(1, 200, 2))
        cls.want = (7, want_out, want_err)

    @classmethod
    def tearDownClass(cls) -> None:
        cls.srv.shutdown()
        cls.srv.server_close()

    def test_sync(self) -> None:
        sb = Sandbox.get("box", Client(self.url, "t"))
        out = []
        r = sb.exec(["go"], on_stdout=out.append)
        self.assertEqual((r.exit_code, r.stdout, r.stderr), self.want)
        self.assertEqual(b"".join(out), r.stdout)
        self.assertEqual(sb.files.read("/f"), BLOB)

    def test_async(self) -> None:
        async def run() -> None:
            sb = await AsyncSandbox.get("box", AsyncClient(self.url, "t"))
            self.assertEqual((sb.state, sb.labels), ("running", {"a": "b"}))
            out = []
            r = await sb.exec(["go"], on_stdout=out.append)
            self.assertEqual((r.exit_code, r.stdout, r.stderr), self.want)
            self.assertEqual(b"".join(out), r.stdout)
            self.assertEqual(await sb.files.read("/f"), BLOB)
            self.assertEqual((await sb.files.stat("/f")).size, len(BLOB))

        asyncio.run(run())

    def test_errors(self) -> None:
        cases = [("nothere", nexus.NotFoundError), ("conflict", nexus.ConflictError), ("internal", nexus.InternalError),
                 ("busy", nexus.UnavailableError), ("scope", nexus.RefusedError)]
        for name, cls in cases:
            with self.assertRaises(cls) as e:
                Sandbox.get(name, Client(self.url))
            self.assertIn("no: /v1/sandboxes/" + name, str(e.exception))

            async def get() -> None:
                await AsyncSandbox.get(name, AsyncClient(self.url))
            with self.assertRaises(cls):
                asyncio.run(get())

    def test_async_deadline(self) -> None:
        # A server that accepts and never answers: the client's deadline ends the call.
        s = socket.socket()
        s.bind(("127.0.0.1", 0))
        s.listen(1)
        try:
            async def get() -> None:
                await AsyncSandbox.get("box", AsyncClient("http://127.0.0.1:%d" % s.getsockname()[1], timeout=0.5))
            with self.assertRaises(nexus.UnavailableError):
                asyncio.run(get())
        finally:
            s.close()


if __name__ == "__main__":
    unittest.main()
