// The SDK against a live nexus API (run by e2e/api's TestAPI/sdks, or by hand):
//   NEXUS_API_URL=… NEXUS_API_TOKEN=… NEXUS_SDK_SANDBOX=api/box node --test test/
// NEXUS_SDK_SANDBOX names a running sandbox the tests share; NEXUS_SDK_CREATE=1 also runs the
// create/remove flow (one more boot); NEXUS_SDK_FORK=1 snapshots and forks (another boot).
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";

import { Sandbox, Client, NotFoundError, AuthenticationError, InvalidError, NexusError } from "nexus-sandbox";

const BOX = process.env.NEXUS_SDK_SANDBOX || "";
const IMAGE = process.env.NEXUS_SDK_IMAGE || "nexus-mini";
const FIFTY_MB = 50 << 20;
const dec = (b) => new TextDecoder().decode(b);
const shared = { skip: BOX ? false : "NEXUS_SDK_SANDBOX names no sandbox" };

test("exec streams and exits", shared, async () => {
  const sb = await Sandbox.get(BOX);
  const chunks = [];
  const r = await sb.exec(["sh", "-c", 'echo "$GREETING"; cat >&2; exit 3'], {
    stdin: "to stderr\n", env: { GREETING: "hello" }, onStdout: (c) => { chunks.push(dec(c)); },
  });
  assert.equal(r.exitCode, 3);
  assert.equal(r.text, "hello\n");
  assert.equal(chunks.join(""), "hello\n");
  assert.equal(r.stderrText, "to stderr\n");
  assert.equal((await sb.exec("pwd", { workdir: "/tmp" })).text, "/tmp\n");
  assert.equal((await sb.exec(["sleep", "30"], { timeout: 1 })).exitCode, 124);
});

test("50 MB of output to a stalled reader", shared, async () => {
  // The reader stops for 3 s on the first chunk: the command waits (TCP back-pressure, nothing
  // piles up in the API) and every byte still arrives.
  const sb = await Sandbox.get(BOX);
  const h = createHash("sha256");
  let n = 0;
  let stalled = false;
  const r = await sb.exec(["head", "-c", String(FIFTY_MB), "/dev/zero"], {
    capture: false,
    onStdout: async (c) => {
      if (!stalled) { stalled = true; await sleep(3000); }
      h.update(c);
      n += c.length;
    },
  });
  assert.equal(r.exitCode, 0);
  assert.equal(n, FIFTY_MB);
  assert.equal(h.digest("hex"), createHash("sha256").update(Buffer.alloc(FIFTY_MB)).digest("hex"));
  assert.equal(r.stdout.length, 0);
});

test("output in order", shared, async () => {
  const sb = await Sandbox.get(BOX);
  const chunks = [];
  const r = await sb.exec(["seq", "1", "20000"], { onStdout: (c) => { chunks.push(Buffer.from(c)); } });
  let want = "";
  for (let i = 1; i <= 20000; i++) want += i + "\n";
  assert.equal(r.exitCode, 0);
  assert.equal(Buffer.concat(chunks).toString(), want);
  assert.equal(r.text, want);
});

test("files", shared, async () => {
  const sb = await Sandbox.get(BOX);
  const d = "/tmp/sdk-ts";
  await sb.exec(["rm", "-rf", d]);
  await sb.files.mkdir(d);
  const data = new Uint8Array(256 * 1000).map((_, i) => i % 256);
  const info = await sb.files.write(d + "/blob", data, { mode: 0o600 });
  assert.equal(info.size, data.length);
  assert.equal(info.mode, 0o600);
  assert.deepEqual(await sb.files.read(d + "/blob"), data);
  await sb.files.write(d + "/note.txt", "héllo");
  assert.equal(await sb.files.readText(d + "/note.txt"), "héllo");
  assert.deepEqual((await sb.files.list(d)).map((f) => f.name).sort(), ["blob", "note.txt"]);
  assert.equal((await sb.files.stat(d)).type, "dir");
  await sb.files.remove(d, { recursive: true });
  assert.equal(await sb.files.exists(d), false);
  await assert.rejects(sb.files.read(d + "/blob"), NotFoundError);
});

test("list by labels, ports", shared, async () => {
  const sb = await Sandbox.get(BOX);
  assert.ok(Object.keys(sb.labels).length > 0, "the shared sandbox has labels");
  assert.ok((await Sandbox.list({ labels: sb.labels })).some((s) => s.name === sb.name));
  assert.ok(!(await Sandbox.list({ labels: { "no-such-label": "x" } })).some((s) => s.name === sb.name));
  assert.ok(Array.isArray(await sb.ports()));
});

test("errors", shared, async () => {
  await assert.rejects(Sandbox.get("sdk-no-such-sandbox"), (e) => e instanceof NotFoundError && e.status === 404);
  await assert.rejects(Sandbox.list({ client: new Client({ token: "nexus_" + "00".repeat(32) }) }), AuthenticationError);
  const sb = await Sandbox.get(BOX);
  await assert.rejects(sb.exec([]), InvalidError);
  await assert.rejects(new Sandbox("sdk-no-such-sandbox").exec(["true"]), NotFoundError);
  assert.ok(new NotFoundError("x") instanceof NexusError);
});

test("snapshot and fork", { skip: BOX && process.env.NEXUS_SDK_FORK ? false : "NEXUS_SDK_FORK is not set" }, async () => {
  const sb = await Sandbox.get(BOX);
  await sb.files.write("/tmp/before-snapshot", "kept");
  const snap = await sb.snapshot("sdk-ts-snap");
  try {
    assert.equal(snap.name, "sdk-ts-snap");
    const fork = await snap.fork("sdk-ts-fork", { labels: { sdk: "fork" } });
    try {
      assert.equal(await fork.files.readText("/tmp/before-snapshot"), "kept");
      assert.equal((await fork.exec("echo forked")).text, "forked\n");
    } finally {
      await fork.remove();
    }
  } finally {
    await snap.remove();
  }
});

test("the ten-line flow", { skip: process.env.NEXUS_SDK_CREATE ? false : "NEXUS_SDK_CREATE is not set" }, async () => {
  const out = [];
  let r;
  {
    const sb = await Sandbox.create({ name: "sdk-ts", image: IMAGE, agent: "codex", labels: { sdk: "ts" } });
    try {
      r = await sb.exec(["sh", "-c", "echo hi; echo there"], { onStdout: (c) => { out.push(dec(c)); } });
      await sb.files.write("/tmp/hello.txt", "hello");
      assert.equal(await sb.files.readText("/tmp/hello.txt"), "hello");
    } finally {
      await sb[Symbol.asyncDispose]();
    }
  }
  assert.equal(r.exitCode, 0);
  assert.equal(out.join(""), "hi\nthere\n");
  await assert.rejects(Sandbox.get("sdk-ts"), NotFoundError);
});
