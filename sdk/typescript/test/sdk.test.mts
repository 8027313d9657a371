// The SDK against a live nexus API, in TypeScript so that tsc --strict checks index.d.ts against
// how a program uses it, and node then runs the compiled suite against index.js (e2e/api's
// TestAPI/sdks does both; see test/tsconfig.json). By hand:
//   NEXUS_API_URL=… NEXUS_API_TOKEN=… NEXUS_SDK_SANDBOX=api/box tsc -p test && node --test test/out/
// NEXUS_SDK_SANDBOX names a running sandbox the tests share (the fork test snapshots and forks
// it); NEXUS_SDK_READ_TOKEN, a read-scope token, checks RefusedError; NEXUS_SDK_ERROR_CODES lists
// the envelope's codes, each of which must have its own error class.
import { test } from "node:test";
import assert from "node:assert/strict";
import { createHash } from "node:crypto";
import { setTimeout as sleep } from "node:timers/promises";

import {
  Sandbox, Client, Snapshot, ExecResult, NexusError, InvalidError, NotFoundError, ConflictError,
  RefusedError, AuthenticationError, UnavailableError, InternalError, errorFor,
} from "nexus-sandbox";
import type { ErrorCode, FileInfo, PortForward, SandboxInfo, ExecOptions, Output, CreateOptions } from "nexus-sandbox";

const BOX = process.env.NEXUS_SDK_SANDBOX || "";
const FIFTY_MB = 50 << 20;
const dec = (b: Uint8Array): string => new TextDecoder().decode(b);
// assert.equal takes anything: these make tsc check that a value has the type the test expects
// of it, so a wrong type in index.d.ts fails the compile.
const eq = <T,>(actual: T, expected: NoInfer<T>, msg?: string): void => assert.equal(actual, expected, msg);
const deq = <T,>(actual: T, expected: NoInfer<T>): void => assert.deepEqual(actual, expected);
const shared = { skip: BOX ? false : "NEXUS_SDK_SANDBOX names no sandbox" };

test("exec streams and exits", shared, async () => {
  const sb = await Sandbox.get(BOX);
  const chunks: string[] = [];
  const opts: ExecOptions = {
    stdin: "to stderr\n", env: { GREETING: "hello" }, onStdout: (c) => { chunks.push(dec(c)); },
  };
  const r: ExecResult = await sb.exec(["sh", "-c", 'echo "$GREETING"; cat >&2; exit 3'], opts);
  eq(r.exitCode, 3);
  eq(r.text, "hello\n");
  eq(chunks.join(""), "hello\n");
  eq(r.stderrText, "to stderr\n");
  eq(dec(r.stderr), "to stderr\n");
  eq(r.signal, 0);
  eq(r.error, "");
  const errs: Uint8Array[] = [];
  const r2 = await sb.exec("pwd; echo e >&2", { workdir: "/tmp", env: ["A=1"], stdin: new TextEncoder().encode(""), onStderr: async (c) => { errs.push(c); } });
  eq(r2.text, "/tmp\n");
  eq(dec(errs[0]), "e\n");
  eq((await sb.exec(["sleep", "30"], { timeout: 1 })).exitCode, 124);
  eq((await sb.exec(["sleep", "30"], { timeout: "500ms" })).exitCode, 124);
});

test("50 MB of output to a stalled reader", shared, async () => {
  // The reader stops for 3 s on the first chunk: the command waits (TCP back-pressure, nothing
  // piles up in the API) and every byte still arrives.
  const sb = await Sandbox.get(BOX);
  const h = createHash("sha256");
  let n = 0;
  let stalled = false;
  const take: Output = async (c) => {
    if (!stalled) { stalled = true; await sleep(3000); }
    h.update(c);
    n += c.length;
  };
  const r = await sb.exec(["head", "-c", String(FIFTY_MB), "/dev/zero"], { capture: false, onStdout: take });
  eq(r.exitCode, 0);
  eq(n, FIFTY_MB);
  eq(h.digest("hex"), createHash("sha256").update(Buffer.alloc(FIFTY_MB)).digest("hex"));
  eq(r.stdout.length, 0);
});

test("output in order", shared, async () => {
  const sb = await Sandbox.get(BOX);
  const chunks: Buffer[] = [];
  const r = await sb.exec(["seq", "1", "20000"], { onStdout: (c) => { chunks.push(Buffer.from(c)); } });
  let want = "";
  for (let i = 1; i <= 20000; i++) want += i + "\n";
  eq(r.exitCode, 0);
  eq(Buffer.concat(chunks).toString(), want);
  eq(r.text, want);
});

test("files", shared, async () => {
  const sb = await Sandbox.get(BOX);
  const d = "/tmp/sdk-ts";
  await sb.exec(["rm", "-rf", d]);
  const made: FileInfo = await sb.files.mkdir(d);
  eq(made.type, "dir");
  const data = new Uint8Array(256 * 1000).map((_, i) => i % 256);
  const info = await sb.files.write(d + "/blob", data, { mode: 0o600 });
  eq(info.size, data.length);
  eq(info.mode, 0o600);
  eq(info.path, d + "/blob");
  deq(await sb.files.read(d + "/blob"), data);
  await sb.files.write(d + "/note.txt", "héllo");
  eq(await sb.files.readText(d + "/note.txt"), "héllo");
  const names: string[] = (await sb.files.list(d)).map((f: FileInfo) => f.name).sort();
  deq(names, ["blob", "note.txt"]);
  eq((await sb.files.stat(d)).type, "dir");
  await sb.files.remove(d + "/note.txt");
  await sb.files.remove(d, { recursive: true });
  eq(await sb.files.exists(d), false);
  await assert.rejects(sb.files.read(d + "/blob"), NotFoundError);
});

test("list by labels, ports, refresh", shared, async () => {
  const sb = await Sandbox.get(BOX);
  const labels: Record<string, string> = sb.labels;
  assert.ok(Object.keys(labels).length > 0, "the shared sandbox has labels");
  assert.ok((await Sandbox.list({ labels })).some((s) => s.name === sb.name));
  const [k, v] = Object.entries(labels)[0];
  assert.ok((await Sandbox.list({ labels: [`${k}=${v}`], all: true })).some((s) => s.name === sb.name));
  assert.ok(!(await Sandbox.list({ labels: { "no-such-label": "x" } })).some((s) => s.name === sb.name));
  const ports: PortForward[] = await sb.ports();
  assert.ok(ports.every((p) => p.sandbox === sb.name));
  const info: SandboxInfo = await sb.refresh();
  eq(info.name, sb.name);
  eq(sb.state, "running");
  // The defaults come from $NEXUS_API_URL and $NEXUS_API_TOKEN: every call above used them.
  eq(new Client().url, process.env.NEXUS_API_URL ?? "");
  assert.ok(!JSON.stringify(new Client()).includes(process.env.NEXUS_API_TOKEN || "-"), "the token is not serialised");
  const raw = await new Client({ timeoutMs: 5000 }).request<{ sandboxes: SandboxInfo[] }>("GET", "/v1/sandboxes", { query: { selector: [`${k}=${v}`] } });
  assert.ok(raw.sandboxes.some((s) => s.name === sb.name));
});

test("errors", shared, async () => {
  // Every code of the API's envelope has its own class.
  const classes: Record<ErrorCode, typeof NexusError> = {
    invalid: InvalidError, not_found: NotFoundError, conflict: ConflictError, refused: RefusedError,
    unavailable: UnavailableError, internal: InternalError,
  };
  for (const code of (process.env.NEXUS_SDK_ERROR_CODES || "").split(",").filter(Boolean)) {
    assert.ok(code in classes, `the envelope's code ${code} has no error class`);
    const e = errorFor(0, code, "m");
    assert.ok(e instanceof classes[code as ErrorCode] && e.code === code && e.message === "m", code);
  }
  assert.ok(errorFor(401, "refused", "who") instanceof AuthenticationError);
  assert.ok(errorFor(503, "", "x") instanceof UnavailableError);

  await assert.rejects(Sandbox.get("sdk-no-such-sandbox"), (e: unknown) => e instanceof NotFoundError && e.status === 404);
  await assert.rejects(Sandbox.list({ client: new Client({ token: "nexus_" + "00".repeat(32) }) }),
    (e: unknown) => e instanceof AuthenticationError && e instanceof RefusedError && e.status === 401);
  const sb = await Sandbox.get(BOX);
  await assert.rejects(sb.exec([]), (e: unknown) => e instanceof InvalidError && e.code === "invalid" && e.status === 400);
  await assert.rejects(new Sandbox("sdk-no-such-sandbox").exec(["true"]), NotFoundError);
  await assert.rejects(Sandbox.create({ name: BOX, image: "nexus-mini", agent: "codex" }), (e: unknown) => e instanceof ConflictError && e.status === 409);
  const read = process.env.NEXUS_SDK_READ_TOKEN;
  if (read) {
    const ro = new Sandbox(BOX, new Client({ token: read }));
    await assert.rejects(ro.exec(["true"]), (e: unknown) => e instanceof RefusedError && !(e instanceof AuthenticationError) && e.status === 403);
  }
  // Nothing listens on port 1 of loopback.
  await assert.rejects(Sandbox.list({ client: new Client({ url: "http://127.0.0.1:1" }) }), UnavailableError);
  assert.throws(() => new Client({ url: "ftp://x" }), InvalidError);
  assert.throws(() => new Client({ token: "nexus_x\ncreated" }), (e: unknown) => e instanceof InvalidError && !e.message.includes("nexus_x"));
  assert.ok(new NotFoundError("x") instanceof NexusError);
});

test("snapshot and fork", shared, async () => {
  // The fork boots from the snapshot: it has the parent's file and runs commands; the parent
  // is left running.
  const sb = await Sandbox.get(BOX);
  await sb.files.write("/tmp/before-snapshot", "kept by ts");
  const snap: Snapshot = await sb.snapshot("sdk-ts-snap");
  try {
    eq(snap.name, "sdk-ts-snap");
    eq(snap.sandbox, BOX);
    await assert.rejects(sb.snapshot("sdk-ts-snap"), ConflictError);
    const fork = await snap.fork("api/sdk-ts-fork", { labels: { sdk: "ts-fork" } });
    try {
      eq(fork.name, "api/sdk-ts-fork");
      eq(await fork.files.readText("/tmp/before-snapshot"), "kept by ts");
      eq((await fork.exec("echo forked; cat /tmp/before-snapshot")).text, "forked\nkept by ts");
      deq((await Sandbox.list({ labels: { sdk: "ts-fork" } })).map((s) => s.name), ["api/sdk-ts-fork"]);
      // A snapshot a live sandbox runs from cannot go.
      await assert.rejects(snap.remove(), RefusedError);
      await fork.pause();
      eq((await fork.refresh()).state, "paused");
      await fork.resume();
      eq((await fork.exec("echo resumed")).text, "resumed\n");
    } finally {
      await fork.remove();
    }
    await assert.rejects(Sandbox.get("api/sdk-ts-fork"), NotFoundError);
    eq((await sb.exec("cat /tmp/before-snapshot")).text, "kept by ts");
  } finally {
    await snap.remove();
  }
});

// Type-only: the rest of the public surface, compiled (so its types are checked) but never
// called, and calls index.d.ts must refuse.
export async function typesOnly(sb: Sandbox, c: Client): Promise<void> {
  const opts: CreateOptions = { name: "x", image: "nexus-mini", labels: { a: "b" }, memory_mib: 512, vcpus: 1, ttl: "1h", ephemeral: true, client: c };
  await using made = await Sandbox.create(opts);
  const forked: Sandbox = await Sandbox.fork(made.name, "y", { labels: { a: "b" }, client: c });
  await forked.stop({ force: true });
  await forked.start();
  await forked.stop();
  const again: Sandbox = await sb.fork("z");
  await again[Symbol.asyncDispose]();
  const s2: Snapshot = await sb.snapshot();
  const resp: Response = await c.open("GET", "/v1/sandboxes", { query: { all: true, n: 1 }, timeoutMs: 0 });
  await c.open("PUT", "/x", { body: new Uint8Array(1), contentType: "application/octet-stream" });
  const n: number = c.timeoutMs + resp.status + s2.name.length;
  const e: NexusError = new ConflictError("m", 409, "conflict");
  const code: string = e.code;
  // @ts-expect-error argv is a string or a string array
  await sb.exec(42);
  // @ts-expect-error onStdout takes bytes, not a string
  await sb.exec("true", { onStdout: (s: number) => s });
  // @ts-expect-error a timeout is seconds or a duration string
  await sb.exec("true", { timeout: true });
  // @ts-expect-error name is required
  await Sandbox.create({ image: "nexus-mini" });
  // @ts-expect-error files.read gives bytes
  const t: string = await sb.files.read("/x");
  // @ts-expect-error labels are strings
  await Sandbox.list({ labels: { a: 1 } });
  // @ts-expect-error the exit code is read-only
  (await sb.exec("true")).exitCode = 1;
  void [n, code, t];
}
