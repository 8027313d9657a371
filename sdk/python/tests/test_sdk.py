"""The SDK against a live nexus API (run by e2e/api's TestAPI/sdks, or by hand):

    NEXUS_API_URL=… NEXUS_API_TOKEN=… NEXUS_SDK_SANDBOX=api/box python3 -m unittest discover -s sdk/python/tests

NEXUS_SDK_SANDBOX names a running sandbox the tests share; NEXUS_SDK_CREATE=1 also runs the
create/remove flow (one more boot); NEXUS_SDK_FORK=1 snapshots and forks (another boot).
"""

import asyncio
import hashlib
import os
import time
import unittest

import nexus
from nexus import AsyncSandbox, Client, Sandbox

BOX = os.environ.get("NEXUS_SDK_SANDBOX", "")
IMAGE = os.environ.get("NEXUS_SDK_IMAGE", "nexus-mini")
FIFTY_MB = 50 << 20


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
        with self.assertRaises(nexus.NotFoundError) as e:
            Sandbox.get("sdk-no-such-sandbox")
        self.assertEqual(e.exception.status, 404)
        with self.assertRaises(nexus.AuthenticationError):
            Sandbox.list(client=Client(token="nexus_" + "00" * 32))
        with self.assertRaises(nexus.InvalidError):
            self.sb.exec([])
        with self.assertRaises(nexus.NotFoundError):
            Sandbox("sdk-no-such-sandbox").exec(["true"])
        self.assertIsInstance(nexus.NotFoundError("x"), LookupError)

    def test_async(self) -> None:
        async def run() -> None:
            sb = await AsyncSandbox.get(BOX)
            seen = []

            async def on_out(b: bytes) -> None:
                await asyncio.sleep(0)
                seen.append(b)

            r, r2 = await asyncio.gather(sb.exec(["sh", "-c", "echo one"], on_stdout=on_out), sb.exec("echo two"))
            self.assertEqual((r.exit_code, r.text, r2.text), (0, "one\n", "two\n"))
            self.assertEqual(b"".join(seen), b"one\n")
            await sb.files.write("/tmp/sdk-async.txt", b"async")
            self.assertEqual(await sb.files.read("/tmp/sdk-async.txt"), b"async")
            self.assertIn(BOX, [s.name for s in await AsyncSandbox.list(labels=sb.info.get("labels"))])

        asyncio.run(run())

    @unittest.skipUnless(os.environ.get("NEXUS_SDK_FORK"), "NEXUS_SDK_FORK is not set")
    def test_snapshot_and_fork(self) -> None:
        self.sb.files.write("/tmp/before-snapshot", "kept")
        snap = self.sb.snapshot("sdk-py-snap")
        try:
            self.assertEqual(snap.name, "sdk-py-snap")
            fork = snap.fork("sdk-py-fork", labels={"sdk": "fork"})
            try:
                self.assertEqual(fork.files.read("/tmp/before-snapshot"), b"kept")
                self.assertEqual(fork.exec("echo forked").text, "forked\n")
            finally:
                fork.remove()
        finally:
            snap.remove()


@unittest.skipUnless(os.environ.get("NEXUS_SDK_CREATE"), "NEXUS_SDK_CREATE is not set")
class CreateTest(unittest.TestCase):
    def test_ten_lines(self) -> None:
        out = []
        with Sandbox.create("sdk-py", image=IMAGE, agent="codex", labels={"sdk": "py"}) as sb:
            r = sb.exec(["sh", "-c", "echo hi; echo there"], on_stdout=out.append)
            sb.files.write("/tmp/hello.txt", "hello")
            self.assertEqual(sb.files.read("/tmp/hello.txt"), b"hello")
        self.assertEqual((r.exit_code, b"".join(out)), (0, b"hi\nthere\n"))
        with self.assertRaises(nexus.NotFoundError):
            Sandbox.get("sdk-py")


if __name__ == "__main__":
    unittest.main()
