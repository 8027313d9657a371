// Types of nexus-sandbox (index.js): a client of the nexus remote API.

export type ErrorCode = "invalid" | "not_found" | "conflict" | "refused" | "unavailable" | "internal";

/** A request the API refused or failed. */
export class NexusError extends Error {
  constructor(message: string, status?: number, code?: ErrorCode | string);
  /** The HTTP status (0 when the error came inside an exec stream or from the client). */
  readonly status: number;
  readonly code: ErrorCode | string;
}
/** 400: a bad argument or an unknown field. */
export class InvalidError extends NexusError {}
/** 404: no such sandbox, snapshot, file or route. */
export class NotFoundError extends NexusError {}
/** 409: the sandbox's state does not allow it, or the name is taken. */
export class ConflictError extends NexusError {}
/** 403: the token's scope or the host's policy refuses it. */
export class RefusedError extends NexusError {}
/** 401: no token, or one the server does not know (set NEXUS_API_TOKEN). */
export class AuthenticationError extends RefusedError {}
/** 503 or no answer. */
export class UnavailableError extends NexusError {}
/** 500. */
export class InternalError extends NexusError {}

export function errorFor(status: number, code: string, message: string): NexusError;

export interface ClientOptions {
  /** Default $NEXUS_API_URL, else http://127.0.0.1:7477. For https with a private CA set NODE_EXTRA_CA_CERTS. */
  url?: string;
  /** Default $NEXUS_API_TOKEN. */
  token?: string;
  /** Deadline of ordinary requests (create, exec and file transfers have none); default 60000. */
  timeoutMs?: number;
}

export interface RequestOptions {
  query?: Record<string, string | number | boolean | undefined | Array<string | number | boolean>>;
  /** What fetch takes as a body (a string, bytes, a stream…). */
  body?: NonNullable<RequestInit["body"]>;
  json?: unknown;
  contentType?: string;
  /** 0: no deadline. */
  timeoutMs?: number;
}

export class Client {
  constructor(opts?: ClientOptions);
  readonly url: string;
  timeoutMs: number;
  open(method: string, path: string, opts?: RequestOptions): Promise<Response>;
  request<T = any>(method: string, path: string, opts?: RequestOptions): Promise<T>;
}

/** A sandbox's record (GET /v1/sandboxes/{name}; see /openapi.json Sandbox). */
export interface SandboxInfo {
  id?: string;
  name: string;
  image?: string;
  state?: string;
  labels?: Record<string, string>;
  agent?: string;
  memory_mib?: number;
  vcpus?: number;
  created_at?: string;
  [key: string]: unknown;
}

/** The body of POST /v1/sandboxes (see /openapi.json CreateRequest). */
export interface CreateOptions {
  name: string;
  image?: string;
  labels?: Record<string, string>;
  agent?: string;
  memory_mib?: number;
  vcpus?: number;
  egress_mode?: string;
  allow_hosts?: string[];
  ttl?: string;
  idle_timeout?: string;
  ephemeral?: boolean;
  client?: Client;
  [key: string]: unknown;
}

export interface FileInfo {
  name: string;
  path: string;
  size: number;
  mode: number;
  type: "file" | "dir" | "symlink" | "other" | string;
  mod_time: string;
}

export interface PortForward {
  id: string;
  sandbox: string;
  port: number;
  host_addr: string;
  state: string;
  [key: string]: unknown;
}

/** Called with each chunk as it comes; a returned promise is awaited before the next (back-pressure). */
export type Output = (chunk: Uint8Array) => unknown;

export interface ExecOptions {
  /** Written to the command's stdin, which is then closed. */
  stdin?: string | Uint8Array;
  env?: Record<string, string> | string[];
  /** Seconds, or a duration such as "5m": the command is killed and exits 124. */
  timeout?: number | string;
  workdir?: string;
  onStdout?: Output;
  onStderr?: Output;
  /** Collect the output in the result (default true). */
  capture?: boolean;
  signal?: AbortSignal;
}

export class ExecResult {
  readonly exitCode: number;
  readonly stdout: Uint8Array;
  readonly stderr: Uint8Array;
  readonly signal: number;
  /** Why the command did not run or finish, if so. */
  readonly error: string;
  /** stdout as UTF-8. */
  readonly text: string;
  readonly stderrText: string;
}

export class Files {
  write(path: string, data: string | Uint8Array, opts?: { mode?: number }): Promise<FileInfo>;
  read(path: string): Promise<Uint8Array>;
  readText(path: string): Promise<string>;
  list(path: string): Promise<FileInfo[]>;
  stat(path: string): Promise<FileInfo>;
  exists(path: string): Promise<boolean>;
  mkdir(path: string): Promise<FileInfo>;
  remove(path: string, opts?: { recursive?: boolean }): Promise<void>;
}

export class Snapshot {
  readonly name: string;
  /** The sandbox it was taken of. */
  readonly sandbox: string;
  readonly info: Record<string, unknown>;
  fork(name: string, opts?: { labels?: Record<string, string> }): Promise<Sandbox>;
  remove(): Promise<void>;
}

export class Sandbox implements AsyncDisposable {
  constructor(name: string, client?: Client, info?: SandboxInfo);
  readonly name: string;
  readonly client: Client;
  info: SandboxInfo;
  readonly files: Files;
  readonly state: string;
  readonly labels: Record<string, string>;

  static create(opts: CreateOptions): Promise<Sandbox>;
  static get(name: string, opts?: { client?: Client }): Promise<Sandbox>;
  static list(opts?: { labels?: Record<string, string> | string[]; all?: boolean; client?: Client }): Promise<Sandbox[]>;
  static fork(source: string, name: string, opts?: { labels?: Record<string, string>; client?: Client }): Promise<Sandbox>;

  refresh(): Promise<SandboxInfo>;
  start(): Promise<void>;
  stop(opts?: { force?: boolean }): Promise<void>;
  pause(): Promise<void>;
  resume(): Promise<void>;
  remove(): Promise<void>;
  [Symbol.asyncDispose](): Promise<void>;

  exec(argv: string | string[], opts?: ExecOptions): Promise<ExecResult>;
  ports(): Promise<PortForward[]>;
  snapshot(name?: string): Promise<Snapshot>;
  fork(name: string, opts?: { labels?: Record<string, string> }): Promise<Sandbox>;
}
