package agentproto

import (
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// MaxMessage bounds one Request or Response (its JSON body).
const MaxMessage = 64 << 10

// Op names an operation; it is the first thing on every stream.
type Op string

const (
	OpPing      Op = "ping"
	OpConfigure Op = "configure"
	OpExec      Op = "exec"
	OpCopyIn    Op = "copy-in"
	OpCopyOut   Op = "copy-out"
	OpConnect   Op = "connect"
	OpDialHost  Op = "dial-host" // opened by the agent towards the host
	OpListeners Op = "listeners"
	// OpWatchListeners keeps its stream open: the agent answers with the guest's listeners at
	// once and again each time that set changes, until the host closes the stream. Agents older
	// than it refuse it as an unknown op; the host then asks with OpListeners now and again.
	OpWatchListeners Op = "watch-listeners"
	OpShutdown       Op = "shutdown"
	OpLogs           Op = "logs"
	// OpExecKill kills the process of the exec on another stream of the same session (Stream):
	// it reaches the agent while that exec's own stream is held back by a stdin the process
	// does not read. Agents older than it refuse it as an unknown op.
	OpExecKill Op = "exec-kill"
)

// Request opens a stream. Exactly the field matching Op is set.
type Request struct {
	Op        Op                `json:"op"`
	Configure *ConfigureRequest `json:"configure,omitempty"`
	Exec      *ExecRequest      `json:"exec,omitempty"`
	CopyIn    *CopyInRequest    `json:"copy_in,omitempty"`
	CopyOut   *CopyOutRequest   `json:"copy_out,omitempty"`
	// Port is the TCP port for connect (a guest port) and dial-host (a host port).
	Port int `json:"port,omitempty"`
	// Stream is the yamux stream id of the exec that exec-kill kills.
	Stream uint32 `json:"stream,omitempty"`
}

// Response answers a Request. A non-empty Error means the op failed; Code is its errdefs class.
type Response struct {
	Error     string     `json:"error,omitempty"`
	Code      string     `json:"code,omitempty"`
	Pong      *Pong      `json:"pong,omitempty"`
	Listeners []Listener `json:"listeners,omitempty"`
	File      *FileInfo  `json:"file,omitempty"`
}

// Err turns an error Response back into a classified error (nil when Error is empty).
func (r *Response) Err() error {
	if r.Error == "" {
		return nil
	}
	return errdefs.FromCode(r.Code, r.Error)
}

// ErrorResponse builds the Response reporting err.
func ErrorResponse(err error) Response {
	return Response{Error: err.Error(), Code: errdefs.Code(err)}
}

// Pong answers ping: readiness and heartbeat.
type Pong struct {
	Version  string    `json:"version"`
	BootTime time.Time `json:"boot_time"`
	// Uptime is the agent's uptime in milliseconds when it answered.
	UptimeMS int64  `json:"uptime_ms"`
	Hostname string `json:"hostname,omitempty"`
	Kernel   string `json:"kernel,omitempty"`
	// Vsock is true when the agent also serves the protocol on AF_VSOCK.
	Vsock bool `json:"vsock,omitempty"`
	// BootErrors lists the boot steps that failed ("root: mount ext4 on /newroot: …"); a guest
	// with any is not usable and the host fails the boot with them.
	BootErrors []string `json:"boot_errors,omitempty"`
	// CPUBusy and CPUTotal are the guest kernel's CPU time over all its CPUs, busy (everything
	// but idle and iowait) and in all, in USER_HZ ticks since boot (/proc/stat): the guest's own
	// load, whatever its emulation costs the host. Zero from an agent that predates them.
	CPUBusy  uint64 `json:"cpu_busy,omitempty"`
	CPUTotal uint64 `json:"cpu_total,omitempty"`
	// MemUsed and MemTotal are the guest's memory in bytes, in use (MemTotal - MemAvailable of
	// /proc/meminfo) and in all. Zero from an agent that predates them.
	MemUsed  uint64 `json:"mem_used,omitempty"`
	MemTotal uint64 `json:"mem_total,omitempty"`
}

// ConfigureRequest updates the guest; empty fields are left alone.
type ConfigureRequest struct {
	Hostname string `json:"hostname,omitempty"`
	// Env is added to the environment of every later exec (a request's own env wins).
	Env map[string]string `json:"env,omitempty"`
	// Time sets the guest clock (after a snapshot restore the guest clock is stale).
	Time    *time.Time     `json:"time,omitempty"`
	Network *NetworkConfig `json:"network,omitempty"`
	// TrustCA installs a CA certificate the guest's TLS clients must trust.
	TrustCA *TrustCA `json:"trust_ca,omitempty"`
	// Seed is fresh host randomness mixed into the guest kernel's pool, which is then reseeded:
	// guests restored from one template start with the same RNG state (MaxSeedBytes at most).
	Seed []byte `json:"seed,omitempty"`
	// MachineID, 32 lowercase hex digits, is written to /etc/machine-id (one per sandbox, not
	// the image's or a template's).
	MachineID string `json:"machine_id,omitempty"`
}

// MaxSeedBytes bounds ConfigureRequest.Seed.
const MaxSeedBytes = 512

// MaxTrustCABytes bounds TrustCA.PEM.
const MaxTrustCABytes = 64 << 10

// TrustCA is a PEM certificate written to Path and appended, once, to the system bundle
// (SystemCABundle) so curl, git and OpenSSL-based tools trust it.
type TrustCA struct {
	Path string `json:"path"`
	PEM  []byte `json:"pem"`
}

// SystemCABundle is the guest's system certificate bundle (Debian's layout).
const SystemCABundle = "/etc/ssl/certs/ca-certificates.crt"

// NetworkConfig is the static configuration of eth0.
type NetworkConfig struct {
	Address string   `json:"address"` // CIDR, e.g. 192.168.127.2/24
	Gateway string   `json:"gateway,omitempty"`
	DNS     []string `json:"dns,omitempty"`
	// MAC, when set, is given to eth0 first (aa:bb:cc:dd:ee:ff, unicast): a guest restored from
	// a template or snapshot has the MAC of the VM it was saved from until then.
	MAC string `json:"mac,omitempty"`
}

// ExecRequest starts a process in the guest.
type ExecRequest struct {
	Argv []string `json:"argv"`
	// Env entries are "KEY=VALUE"; they override the configured and default environment.
	Env []string `json:"env,omitempty"`
	// Dir is the working directory ("/" when empty).
	Dir string `json:"dir,omitempty"`
	// TTY runs the process on a new pty of Rows×Cols; stderr is merged into stdout.
	TTY  bool   `json:"tty,omitempty"`
	Rows uint16 `json:"rows,omitempty"`
	Cols uint16 `json:"cols,omitempty"`
	// Stdin forwards Stdin frames to the process; otherwise its stdin is /dev/null.
	Stdin bool `json:"stdin,omitempty"`
	// User is a user name or uid[:gid]; root when empty.
	User string `json:"user,omitempty"`
}

// CopyInRequest writes a file in the guest. Data frames totalling exactly Size bytes follow,
// then End. The file appears at Path atomically (temporary file + rename) or not at all.
type CopyInRequest struct {
	Path string `json:"path"`
	Mode uint32 `json:"mode"` // permission bits; 0644 when 0
	Size int64  `json:"size"`
	// MkdirAll creates missing parent directories.
	MkdirAll bool `json:"mkdir_all,omitempty"`
}

// CopyOutRequest reads a regular file from the guest.
type CopyOutRequest struct {
	Path string `json:"path"`
}

// FileInfo describes the file whose content follows a copy-out Response.
type FileInfo struct {
	Size int64  `json:"size"`
	Mode uint32 `json:"mode"`
}

// Listener is one listening TCP socket in the guest.
type Listener struct {
	Proto string `json:"proto"` // "tcp" or "tcp6"
	IP    string `json:"ip"`
	Port  uint16 `json:"port"`
}

// WriteMessage writes v as a 4-byte big-endian length and its JSON encoding, in one Write.
func WriteMessage(w io.Writer, v any) error {
	body, err := json.Marshal(v)
	if err != nil {
		return fmt.Errorf("write message: %w", err)
	}
	if len(body) > MaxMessage {
		return fmt.Errorf("write message: %d bytes exceeds the %d byte limit", len(body), MaxMessage)
	}
	buf := make([]byte, 4+len(body))
	binary.BigEndian.PutUint32(buf, uint32(len(body)))
	copy(buf[4:], body)
	_, err = w.Write(buf)
	return err
}

// ErrMessageTooLarge is returned when a peer announces a message above MaxMessage.
var ErrMessageTooLarge = errors.New("message exceeds the size limit")

// ReadMessage reads one length-prefixed JSON message into v. It never reads past the message and
// never allocates more than MaxMessage bytes.
func ReadMessage(r io.Reader, v any) error {
	var hdr [4]byte
	if _, err := io.ReadFull(r, hdr[:]); err != nil {
		return err
	}
	n := binary.BigEndian.Uint32(hdr[:])
	if n > MaxMessage {
		return fmt.Errorf("read message: %d bytes: %w", n, ErrMessageTooLarge)
	}
	body := make([]byte, n)
	if _, err := io.ReadFull(r, body); err != nil {
		return fmt.Errorf("read message: %w", noEOF(err))
	}
	if err := json.Unmarshal(body, v); err != nil {
		return fmt.Errorf("read message: %w", err)
	}
	return nil
}

// ReadRequest reads a stream's opening Request and checks it names a known op.
func ReadRequest(r io.Reader) (*Request, error) {
	var req Request
	if err := ReadMessage(r, &req); err != nil {
		return nil, err
	}
	switch req.Op {
	case OpPing, OpConfigure, OpListeners, OpWatchListeners, OpShutdown, OpLogs:
	case OpExec:
		if req.Exec == nil {
			return nil, errdefs.Invalid("exec: missing request body")
		}
	case OpCopyIn:
		if req.CopyIn == nil {
			return nil, errdefs.Invalid("copy-in: missing request body")
		}
	case OpCopyOut:
		if req.CopyOut == nil {
			return nil, errdefs.Invalid("copy-out: missing request body")
		}
	case OpExecKill:
		if req.Stream == 0 {
			return nil, errdefs.Invalid("exec-kill: missing stream id")
		}
	case OpConnect, OpDialHost:
		if req.Port < 1 || req.Port > 65535 {
			return nil, errdefs.Invalid("%s: port %d out of range", req.Op, req.Port)
		}
	default:
		return nil, errdefs.Invalid("unknown op %.40q", string(req.Op))
	}
	return &req, nil
}

// ReadResponse reads a Response; a failed op comes back as its classified error.
func ReadResponse(r io.Reader) (*Response, error) {
	var resp Response
	if err := ReadMessage(r, &resp); err != nil {
		return nil, err
	}
	if err := resp.Err(); err != nil {
		return &resp, err
	}
	return &resp, nil
}

func noEOF(err error) error {
	if err == io.EOF {
		return io.ErrUnexpectedEOF
	}
	return err
}
