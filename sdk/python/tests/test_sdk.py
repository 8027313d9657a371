"""The SDK against a live nexus API (run by e2e/api's TestAPI/sdks, or by hand):

    NEXUS_API_URL=… NEXUS_API_TOKEN=… NEXUS_SDK_SANDBOX=api/box python3 -m unittest discover -s sdk/python/tests

NEXUS_SDK_SANDBOX names a running sandbox the tests share (the snapshot tests snapshot and fork
it); NEXUS_SDK_READ_TOKEN, a read-scope token, checks RefusedError; NEXUS_SDK_ERROR_CODES lists
the envelope's codes, each of which must have its own exception type. The README's example is
run by e2e/api too, so it is not repeated here.
"""

import asyncio
import hashlib
import os
import threading
import time
import unittest

import nexus
from nexus import AsyncClient, AsyncSandbox, Client, Sandbox

BOX = os.environ.get("NEXUS_SDK_SANDBOX", "")
IMAGE = os.environ.get("NEXUS_SDK_IMAGE", "nexus-mini")
FIFTY_MB = 50 << 20
READ_TOKEN = os.environ.get("NEXUS_SDK_READ_TOKEN", "")


@unittest.skipUnless(BOX, "NEXUS_SDK_SANDBOX names no sandbox")
class SandboxTest(unittest.TestCase):
    sb: Sandbox

    @classmethod
    def setUpClass(cls) -> None:
        cls.sb = Sandbox.get(BOX)

    def test_exec_streams_and_exits(self) -> None:
        chunks = []
        r = self.sb.exec(["sh", "-c", 'echo "$GREETING"; cat >&2; exit 3'], stdin="to stderr\n",
                         env={"GREETING": "hello"}, on_stdout=chunks.append)
        self.assertEqual(r.exit_code, 3)
        self.assertEqual(r.stdout, b"hello\n")
        self.assertEqual(b"".join(chunks), b"hello\n")
        self.assertEqual(r.stderr, b"to stderr\n")
        self.assertEqual(self.sb.exec("pwd", workdir="/tmp").text, "/tmp\n")

    def test_exec_timeout(self) -> None:
        r = self.sb.exec(["sleep", "30"], timeout=1)
        self.assertEqual(r.exit_code, 124)

    def test_50mb_output_to_a_stalled_reader(self) -> None:
        # 50 MB, and the reader stops for 3 s on the first chunk: the command waits (TCP
        # back-pressure, nothing piles up in the API) and every byte still arrives.
        h, n = hashlib.sha256(), 0
        stalled = []

        def take(b: bytes) -> None:
            nonlocal n
            if not stalled:
                stalled.append(True)
                time.sleep(3)
            h.update(b)
            n += len(b)

        r = self.sb.exec(["head", "-c", str(FIFTY_MB), "/dev/zero"], on_stdout=take, capture=False)
        self.assertEqual(r.exit_code, 0)
        self.assertEqual(n, FIFTY_MB)
        self.assertEqual(h.hexdigest(), hashlib.sha256(bytes(FIFTY_MB)).hexdigest())
        self.assertEqual(r.stdout, b"")

    def test_output_in_order(self) -> None:
        chunks = []
        r = self.sb.exec(["seq", "1", "20000"], on_stdout=chunks.append)
        want = "".join("%d\n" % i for i in range(1, 20001)).encode()
        self.assertEqual((r.exit_code, b"".join(chunks), r.stdout), (0, want, want))

    def test_files(self) -> None:
        d = "/tmp/sdk-py"
        self.sb.exec(["rm", "-rf", d])
        self.sb.files.mkdir(d)
        data = bytes(range(256)) * 1000
        info = self.sb.files.write(d + "/blob", data, mode=0o600)
        self.assertEqual(info.size, len(data))
        self.assertEqual(info.mode, 0o600)
        self.assertEqual(self.sb.files.read(d + "/blob"), data)
        self.sb.files.write(d + "/note.txt", "héllo")
        self.assertEqual(self.sb.files.read_text(d + "/note.txt"), "héllo")
        self.assertEqual(sorted(f.name for f in self.sb.files.list(d)), ["blob", "note.txt"])
        self.assertEqual(self.sb.files.stat(d).type, "dir")
        self.sb.files.remove(d, recursive=True)
        self.assertFalse(self.sb.files.exists(d))
        with self.assertRaises(nexus.NotFoundError):
            self.sb.files.read(d + "/blob")

    def test_list_by_labels(self) -> None:
        labels = self.sb.labels
        self.assertTrue(labels, "the shared sandbox has labels")
        names = [s.name for s in Sandbox.list(labels=labels)]
        self.assertIn(self.sb.name, names)
        self.assertNotIn(self.sb.name, [s.name for s in Sandbox.list(labels={"no-such-label": "x"})])

    def test_ports(self) -> None:
        self.assertIsInstance(self.sb.ports(), list)

    def test_errors(self) -> None:
        # Every code of the API's envelope has its own exception type.
        for code in filter(None, os.environ.get("NEXUS_SDK_ERROR_CODES", "").split(",")):
            e = nexus.errors.error_for(0, code, "m")
            self.assertIsNot(type(e), nexus.NexusError, "the envelope's code %s has no exception type" % code)
            self.assertEqual((e.code, e.message), (code, "m"))
        self.assertIsInstance(nexus.errors.error_for(401, "refused", "who"), nexus.AuthenticationError)
        with self.assertRaises(nexus.NotFoundError) as e:
            Sandbox.get("sdk-no-such-sandbox")
        self.assertEqual(e.exception.status, 404)
        with self.assertRaises(nexus.AuthenticationError):
            Sandbox.list(client=Client(token="nexus_" + "00" * 32))
        with self.assertRaises(nexus.InvalidError) as e:
            self.sb.exec([])
        self.assertEqual((e.exception.code, e.exception.status), ("invalid", 400))
        with self.assertRaises(nexus.NotFoundError):
            Sandbox("sdk-no-such-sandbox").exec(["true"])
        with self.assertRaises(nexus.ConflictError) as e:
            Sandbox.create(BOX, image=IMAGE, agent="codex")
        self.assertEqual(e.exception.status, 409)
        if READ_TOKEN:
            with self.assertRaises(nexus.RefusedError) as e:
                Sandbox(BOX, Client(token=READ_TOKEN)).exec(["true"])
            self.assertNotIsInstance(e.exception, nexus.AuthenticationError)
            self.assertEqual(e.exception.status, 403)
        with self.assertRaises(nexus.UnavailableError):  # nothing listens on port 1
            Sandbox.list(client=Client("http://127.0.0.1:1"))
        with self.assertRaises(nexus.InvalidError):
            Client("ftp://x")
        with self.assertRaises(nexus.InvalidError) as e:
            Client(token="nexus_x\ncreated")
        self.assertNotIn("nexus_x", str(e.exception))
        self.assertIsInstance(nexus.NotFoundError("x"), LookupError)

    def test_defaults_from_the_environment(self) -> None:
        # Every test here reaches the API through these two variables alone.
        c = Client()
        self.assertEqual(c.url, os.environ["NEXUS_API_URL"])
        self.assertNotIn(os.environ["NEXUS_API_TOKEN"], repr(c) + repr(self.sb))

    def test_snapshot_and_fork(self) -> None:
        # The fork boots from the snapshot: it has the parent's file and runs commands.
        self.sb.files.write("/tmp/before-snapshot", "kept by py")
        snap = self.sb.snapshot("sdk-py-snap")
        try:
            self.assertEqual((snap.name, snap.sandbox), ("sdk-py-snap", BOX))
            with self.assertRaises(nexus.ConflictError):
                self.sb.snapshot("sdk-py-snap")
            with snap.fork("api/sdk-py-fork", labels={"sdk": "py-fork"}) as fork:
                self.assertEqual(fork.files.read("/tmp/before-snapshot"), b"kept by py")
                self.assertEqual(fork.exec("echo forked").text, "forked\n")
                self.assertEqual([s.name for s in Sandbox.list(labels={"sdk": "py-fork"})], ["api/sdk-py-fork"])
                with self.assertRaises(nexus.RefusedError):  # a live sandbox runs from it
                    snap.remove()
                fork.pause()
                self.assertEqual(fork.refresh()["state"], "paused")
                fork.resume()
                self.assertEqual(fork.exec("echo resumed").text, "resumed\n")
            with self.assertRaises(nexus.NotFoundError):
                Sandbox.get("api/sdk-py-fork")
        finally:
            snap.remove()


@unittest.skipUnless(BOX, "NEXUS_SDK_SANDBOX names no sandbox")
class AsyncSandboxTest(unittest.IsolatedAsyncioTestCase):
    """The asyncio client on the same sandbox, and that it runs on the event loop alone."""

    def setUp(self) -> None:
        self.threads = threading.active_count()

    def tearDown(self) -> None:
        # asyncio.to_thread or an executor would leave worker threads behind.
        self.assertEqual(threading.active_count(), self.threads, "the asyncio client started threads")

    async def test_exec_streams_and_exits(self) -> None:
        sb = await AsyncSandbox.get(BOX)
        seen = []

        async def on_out(b: bytes) -> None:
            await asyncio.sleep(0)
            seen.append(b)

        errs = []
        r, r2 = await asyncio.gather(
            sb.exec(["sh", "-c", 'echo "$GREETING"; cat >&2; exit 3'], stdin=b"to stderr\n", env={"GREETING": "one"},
                    on_stdout=on_out, on_stderr=errs.append),
            sb.exec("pwd", workdir="/tmp"))
        self.assertEqual((r.exit_code, r.text, r.stderr, r2.text), (3, "one\n", b"to stderr\n", "/tmp\n"))
        self.assertEqual((b"".join(seen), b"".join(errs)), (b"one\n", b"to stderr\n"))
        self.assertEqual((await sb.exec(["sleep", "30"], timeout=1)).exit_code, 124)
        chunks = []
        r = await sb.exec(["seq", "1", "20000"], on_stdout=chunks.append)
        want = "".join("%d\n" % i for i in range(1, 20001)).encode()
        self.assertEqual((r.exit_code, b"".join(chunks), r.stdout), (0, want, want))

    async def test_50mb_output_to_a_stalled_reader(self) -> None:
        # The callback stalls 3 s on the first chunk: the command waits, every byte arrives,
        # and the event loop runs other work meanwhile (another exec ends during the stall).
        sb = await AsyncSandbox.get(BOX)
        h, n = hashlib.sha256(), 0
        stall = asyncio.Event()
        other_done = asyncio.Event()

        async def take(b: bytes) -> None:
            nonlocal n
            if not stall.is_set():
                stall.set()
                await asyncio.wait_for(other_done.wait(), 60)
                await asyncio.sleep(3)
            h.update(b)
            n += len(b)

        async def other() -> str:
            await stall.wait()
            r = await sb.exec("echo meanwhile")
            other_done.set()
            return r.text

        r, meanwhile = await asyncio.gather(
            sb.exec(["head", "-c", str(FIFTY_MB), "/dev/zero"], on_stdout=take, capture=False), other())
        self.assertEqual((r.exit_code, n, r.stdout, meanwhile), (0, FIFTY_MB, b"", "meanwhile\n"))
        self.assertEqual(h.hexdigest(), hashlib.sha256(bytes(FIFTY_MB)).hexdigest())

    async def test_files_labels_ports(self) -> None:
        sb = await AsyncSandbox.get(BOX)
        d = "/tmp/sdk-py-async"
        await sb.exec(["rm", "-rf", d])
        self.assertEqual((await sb.files.mkdir(d)).type, "dir")
        data = bytes(range(256)) * 4000  # 1 MB: read back over several chunks
        self.assertEqual((await sb.files.write(d + "/blob", data, mode=0o640)).mode, 0o640)
        self.assertEqual(await sb.files.read(d + "/blob"), data)
        await sb.files.write(d + "/note.txt", "héllo")
        self.assertEqual(await sb.files.read_text(d + "/note.txt"), "héllo")
        self.assertEqual(sorted(f.name for f in await sb.files.list(d)), ["blob", "note.txt"])
        self.assertEqual((await sb.files.stat(d + "/blob")).size, len(data))
        await sb.files.remove(d, recursive=True)
        self.assertFalse(await sb.files.exists(d))
        self.assertIn(BOX, [s.name for s in await AsyncSandbox.list(labels=sb.labels)])
        self.assertNotIn(BOX, [s.name for s in await AsyncSandbox.list(labels={"no-such-label": "x"}, all=True)])
        self.assertIsInstance(await sb.ports(), list)
        self.assertEqual((await sb.refresh())["name"], BOX)

    async def test_errors(self) -> None:
        with self.assertRaises(nexus.NotFoundError):
            await AsyncSandbox.get("sdk-no-such-sandbox")
        with self.assertRaises(nexus.AuthenticationError):
            await AsyncSandbox.list(client=AsyncClient(token="nexus_" + "00" * 32))
        with self.assertRaises(nexus.InvalidError):
            await (await AsyncSandbox.get(BOX)).exec([])
        with self.assertRaises(nexus.NotFoundError):
            await AsyncSandbox("sdk-no-such-sandbox").files.read("/etc/hostname")
        with self.assertRaises(nexus.ConflictError):
            await AsyncSandbox.create(BOX, image=IMAGE, agent="codex")
        if READ_TOKEN:
            with self.assertRaises(nexus.RefusedError):
                await AsyncSandbox(BOX, AsyncClient(token=READ_TOKEN)).exec(["true"])
        with self.assertRaises(nexus.UnavailableError):
            await AsyncSandbox.list(client=AsyncClient("http://127.0.0.1:1"))

    async def test_snapshot(self) -> None:
        # The fork itself is SandboxTest's (one boot per suite); this is the asyncio path.
        sb = await AsyncSandbox.get(BOX)
        snap = await sb.snapshot("sdk-py-async-snap")
        self.assertEqual((snap.name, snap.sandbox), ("sdk-py-async-snap", BOX))
        with self.assertRaises(nexus.ConflictError):
            await sb.snapshot("sdk-py-async-snap")
        await snap.remove()
        with self.assertRaises(nexus.NotFoundError):
            await snap.remove()


if __name__ == "__main__":
    unittest.main()
