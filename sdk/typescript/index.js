// nexus-sandbox: a client of the nexus remote API (docs/api.md) for Node 18+ (global fetch),
// with no dependencies. Types are in index.d.ts.

const STDOUT = 1, STDERR = 2, EXIT = 3;
const MAX_FRAME = 16 << 20;
const MAX_ERROR_BODY = 64 << 10;
const DEFAULT_URL = "http://127.0.0.1:7477";

if (!Symbol.asyncDispose) Object.defineProperty(Symbol, "asyncDispose", { value: Symbol.for("nodejs.asyncDispose") });

/** A request the API refused or failed: code is the envelope's code, status the HTTP status. */
export class NexusError extends Error {
  constructor(message, status = 0, code = "internal") {
    super(message);
    this.name = new.target.name;
    this.status = status;
    this.code = code;
  }
}
export class InvalidError extends NexusError {}
export class NotFoundError extends NexusError {}
export class ConflictError extends NexusError {}
export class RefusedError extends NexusError {}
export class AuthenticationError extends RefusedError {}
export class UnavailableError extends NexusError {}
export class InternalError extends NexusError {}

const byCode = { invalid: InvalidError, not_found: NotFoundError, conflict: ConflictError, refused: RefusedError, unavailable: UnavailableError, internal: InternalError };
const byStatus = { 400: InvalidError, 403: RefusedError, 404: NotFoundError, 409: ConflictError, 503: UnavailableError };

/** The error of an API error answer. */
export function errorFor(status, code, message) {
  if (status === 401) return new AuthenticationError(message, status, "refused");
  const E = byCode[code] || byStatus[status] || InternalError;
  return new E(message, status, code || "internal");
}

function env(name) {
  return typeof process !== "undefined" ? process.env[name] : undefined;
}

/** A connection to a nexus API; url and token default to $NEXUS_API_URL and $NEXUS_API_TOKEN. */
export class Client {
  constructor(opts = {}) {
    const url = opts.url || env("NEXUS_API_URL") || DEFAULT_URL;
    let u;
    try { u = new URL(url); } catch { u = null; }
    if (!u || (u.protocol !== "http:" && u.protocol !== "https:")) throw new InvalidError(`invalid API URL ${JSON.stringify(url)}: use http://HOST:PORT or https://HOST:PORT`, 0, "invalid");
    this.url = url.replace(/\/+$/, "");
    const token = opts.token ?? env("NEXUS_API_TOKEN") ?? "";
    // Never echoed: fetch's own error would quote the header, secret and all.
    if (!/^[\x21-\x7e]*$/.test(token)) throw new InvalidError("the API token has spaces or control characters: set NEXUS_API_TOKEN to the token alone", 0, "invalid");
    Object.defineProperty(this, "token", { value: token, enumerable: false });
    this.timeoutMs = opts.timeoutMs ?? 60_000;
  }

  toJSON() { return { url: this.url }; }

  /** Sends one request; an error answer throws its NexusError. Returns the Response. */
  async open(method, path, { query, body, json, contentType, timeoutMs } = {}) {
    let target = this.url + path;
    if (query) {
      const q = new URLSearchParams();
      for (const [k, v] of Object.entries(query)) {
        for (const one of Array.isArray(v) ? v : [v]) if (one !== undefined && one !== null) q.append(k, String(one));
      }
      const s = q.toString();
      if (s) target += "?" + s;
    }
    const headers = { Accept: "application/json" };
    if (this.token) headers.Authorization = "Bearer " + this.token;
    if (json !== undefined) { body = JSON.stringify(json); contentType = "application/json"; }
    if (contentType) headers["Content-Type"] = contentType;
    const t = timeoutMs === undefined ? this.timeoutMs : timeoutMs;
    let resp;
    try {
      resp = await fetch(target, { method, headers, body, signal: t ? AbortSignal.timeout(t) : undefined });
    } catch (e) {
      throw new UnavailableError(`nexus API at ${this.url}: ${e.cause?.message || e.message}`, 0, "unavailable");
    }
    if (resp.status >= 400) {
      let code = "", message = `HTTP ${resp.status}`;
      try {
        const text = (await resp.text()).slice(0, MAX_ERROR_BODY);
        const e = JSON.parse(text).error;
        code = e.code || ""; message = e.message || message;
      } catch { /* not the envelope */ }
      throw errorFor(resp.status, code, message);
    }
    return resp;
  }

  /** One request whose JSON answer it returns. */
  async request(method, path, opts) {
    const resp = await this.open(method, path, opts);
    const text = await resp.text();
    return text.trim() ? JSON.parse(text) : null;
  }
}

const sandboxPath = (name) => "/v1/sandboxes/" + encodeURIComponent(name);

function duration(t) {
  if (t === undefined || t === null) return undefined;
  if (typeof t === "string") return t;
  if (!(t > 0)) throw new InvalidError("timeout must be positive", 0, "invalid");
  return `${Math.max(1, Math.round(t * 1000))}ms`;
}

/** Reads frames (channel, uint32 length, bytes) from a byte stream. */
async function* frames(body) {
  const reader = body.getReader();
  let buf = new Uint8Array(0);
  const concat = (a, b) => { const c = new Uint8Array(a.length + b.length); c.set(a); c.set(b, a.length); return c; };
  try {
    for (;;) {
      while (buf.length >= 5) {
        const n = new DataView(buf.buffer, buf.byteOffset + 1, 4).getUint32(0);
        if (n > MAX_FRAME) throw new UnavailableError(`exec: a frame of ${n} bytes`, 0, "unavailable");
        if (buf.length < 5 + n) break;
        const ch = buf[0];
        const data = buf.slice(5, 5 + n);
        buf = buf.subarray(5 + n);
        yield [ch, data];
      }
      const { value, done } = await reader.read();
      if (done) {
        throw new UnavailableError(buf.length ? "exec: the stream ended inside a frame" : "exec: the stream ended before the command exited", 0, "unavailable");
      }
      buf = buf.length ? concat(buf, value) : value;
    }
  } finally {
    reader.releaseLock();
    body.cancel().catch(() => {});
  }
}

const joinBytes = (parts) => {
  let n = 0;
  for (const p of parts) n += p.length;
  const out = new Uint8Array(n);
  let off = 0;
  for (const p of parts) { out.set(p, off); off += p.length; }
  return out;
};

/** How a command ended. */
export class ExecResult {
  constructor(exitCode, stdout, stderr, signal = 0, error = "") {
    this.exitCode = exitCode; this.stdout = stdout; this.stderr = stderr; this.signal = signal; this.error = error;
  }
  /** stdout decoded as UTF-8. */
  get text() { return new TextDecoder().decode(this.stdout); }
  get stderrText() { return new TextDecoder().decode(this.stderr); }
}

/** A sandbox's files (absolute guest paths). */
export class Files {
  constructor(sandbox) { this.sandbox = sandbox; }
  #path(suffix) { return sandboxPath(this.sandbox.name) + "/files" + suffix; }

  async write(path, data, { mode } = {}) {
    const body = typeof data === "string" ? new TextEncoder().encode(data) : data;
    const query = { path };
    if (mode !== undefined) query.mode = mode.toString(8);
    return this.sandbox.client.request("PUT", this.#path("/content"), { query, body, contentType: "application/octet-stream", timeoutMs: 0 });
  }
  async read(path) {
    const resp = await this.sandbox.client.open("GET", this.#path("/content"), { query: { path }, timeoutMs: 0 });
    return new Uint8Array(await resp.arrayBuffer());
  }
  async readText(path) { return new TextDecoder().decode(await this.read(path)); }
  async list(path) { return (await this.sandbox.client.request("GET", this.#path(""), { query: { path } })).entries || []; }
  async stat(path) { return this.sandbox.client.request("GET", this.#path("/stat"), { query: { path } }); }
  async exists(path) {
    try { await this.stat(path); return true; } catch (e) { if (e instanceof NotFoundError) return false; throw e; }
  }
  async mkdir(path) { return this.sandbox.client.request("POST", this.#path("/mkdir"), { query: { path } }); }
  async remove(path, { recursive = false } = {}) {
    await this.sandbox.client.request("DELETE", this.#path(""), { query: { path, recursive: recursive || undefined } });
  }
}

/** A snapshot of a sandbox; fork boots a new sandbox from it. */
export class Snapshot {
  constructor(info, client) { this.name = info.name; this.sandbox = info.sandbox; this.info = info; this.client = client; }
  fork(name, opts = {}) { return Sandbox.fork(this.name, name, { ...opts, client: this.client }); }
  async remove() { await this.client.request("DELETE", "/v1/snapshots/" + encodeURIComponent(this.name)); }
}

/** One sandbox. `await using sb = await Sandbox.create(...)` removes it at the end of the block. */
export class Sandbox {
  constructor(name, client = new Client(), info = {}) {
    this.name = name; this.client = client; this.info = info; this.files = new Files(this);
  }

  get state() { return this.info.state || ""; }
  get labels() { return { ...(this.info.labels || {}) }; }

  static async create(opts) {
    const { client = new Client(), ...body } = opts || {};
    if (!body.name) throw new InvalidError("name is required", 0, "invalid");
    const info = await client.request("POST", "/v1/sandboxes", { json: body, timeoutMs: 0 });
    return new Sandbox(info.name || body.name, client, info);
  }

  static async get(name, { client = new Client() } = {}) {
    const info = await client.request("GET", sandboxPath(name));
    return new Sandbox(info.name || name, client, info);
  }

  /** Sandboxes whose labels match (an object of equalities, or selector strings k=v, k!=v, k). */
  static async list({ labels, all = false, client = new Client() } = {}) {
    const selector = Array.isArray(labels) ? labels : Object.entries(labels || {}).map(([k, v]) => `${k}=${v}`);
    const d = await client.request("GET", "/v1/sandboxes", { query: { selector, all: all || undefined } });
    return (d.sandboxes || []).map((info) => new Sandbox(info.name, client, info));
  }

  static async fork(source, name, { labels, client = new Client() } = {}) {
    const json = { source, name };
    if (labels) json.labels = labels;
    const info = await client.request("POST", "/v1/forks", { json, timeoutMs: 0 });
    return new Sandbox(info.name || name, client, info);
  }

  async refresh() { this.info = await this.client.request("GET", sandboxPath(this.name)); return this.info; }

  async #verb(verb, force) {
    const d = await this.client.request("POST", sandboxPath(this.name) + "/" + verb, { query: { force }, timeoutMs: 0 });
    if (d && d.state) this.info.state = d.state;
  }
  start() { return this.#verb("start"); }
  stop({ force = false } = {}) { return this.#verb("stop", force || undefined); }
  pause() { return this.#verb("pause"); }
  resume() { return this.#verb("resume"); }

  /** Removes the sandbox and everything it owns, running or not. */
  async remove() { await this.client.request("DELETE", sandboxPath(this.name), { timeoutMs: 0 }); }
  async [Symbol.asyncDispose]() { await this.remove(); }

  /**
   * Runs argv (a string runs under sh -c) and waits for it. Output streams to onStdout/onStderr
   * as it comes (an async callback is awaited, slowing the command instead of queueing); with
   * capture (the default) it is also collected. timeout (seconds or "5m") kills it: exit 124.
   */
  async exec(argv, opts = {}) {
    const { stdin, env: vars, timeout, workdir, onStdout, onStderr, capture = true, signal } = opts;
    if (typeof argv === "string") argv = ["sh", "-c", argv];
    const json = { argv };
    if (stdin !== undefined) json.stdin = typeof stdin === "string" ? stdin : new TextDecoder().decode(stdin);
    if (vars) json.env = Array.isArray(vars) ? vars : Object.entries(vars).map(([k, v]) => `${k}=${v}`);
    if (workdir) json.workdir = workdir;
    const t = duration(timeout);
    if (t) json.timeout = t;
    const resp = await this.client.open("POST", sandboxPath(this.name) + "/exec/stream", { json, timeoutMs: 0 });
    const out = [], err = [];
    try {
      for await (const [ch, data] of frames(resp.body)) {
        if (signal?.aborted) throw new NexusError("exec aborted", 0, "internal");
        if (ch === STDOUT) {
          if (capture) out.push(data);
          if (onStdout) await onStdout(data);
        } else if (ch === STDERR) {
          if (capture) err.push(data);
          if (onStderr) await onStderr(data);
        } else if (ch === EXIT) {
          const m = JSON.parse(new TextDecoder().decode(data));
          if (m.type === "error") throw errorFor(0, m.code || "", m.message || "exec failed");
          return new ExecResult(m.exit_code ?? 0, joinBytes(out), joinBytes(err), m.signal || 0, m.error || "");
        }
      }
    } catch (e) {
      if (e instanceof NexusError) throw e;
      throw new UnavailableError(`exec: ${e.message}`, 0, "unavailable");
    }
    throw new UnavailableError("exec: the stream ended before the command exited", 0, "unavailable");
  }

  /** The sandbox's port forwards: port (guest), host_addr (127.0.0.1:PORT on the host), state. */
  async ports() { return (await this.client.request("GET", sandboxPath(this.name) + "/ports")).ports || []; }

  /** Snapshots the running sandbox; name defaults to the server's. */
  async snapshot(name) {
    const info = await this.client.request("POST", sandboxPath(this.name) + "/snapshots", { json: name ? { snapshot: name } : {}, timeoutMs: 0 });
    return new Snapshot(info, this.client);
  }

  /** Boots a new sandbox from this one's current state. */
  fork(name, opts = {}) { return Sandbox.fork(this.name, name, { ...opts, client: this.client }); }
}
