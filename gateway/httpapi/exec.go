package httpapi

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"
	"sync"
	"time"

	"github.com/gorilla/websocket"

	"github.com/IniZio/nexus/gateway/mcp"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// ExecBody is the body of POST /v1/sandboxes/{name}/exec. Stdin, when set, is written to the
// command's stdin, which is then closed.
type ExecBody struct {
	Argv    []string `json:"argv"`
	Env     []string `json:"env,omitempty"`
	Workdir string   `json:"workdir,omitempty"`
	Stdin   *string  `json:"stdin,omitempty"`
	Timeout string   `json:"timeout,omitempty"`
}

// execOnce runs a command and answers sandbox_exec's result: the command's own failure is a
// 200 with its exit_code; only nexus's failures are errors.
func execOnce(s *Service, w http.ResponseWriter, r *http.Request) error {
	var b ExecBody
	if err := decode(w, r, &b); err != nil {
		return err
	}
	c, err := s.client(r.Context())
	if err != nil {
		return err
	}
	res, err := mcp.RunCommand(r.Context(), c, api.ExecRequest{Name: r.PathValue("name"), Argv: b.Argv, Env: b.Env, Dir: b.Workdir}, b.Stdin, b.Timeout)
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, res)
	return nil
}

// The exec WebSocket's frames. Data travels in binary messages whose first byte is the
// channel; control in JSON text messages.
const (
	ChanStdin  = 0 // client → server
	ChanStdout = 1 // server → client
	ChanStderr = 2 // server → client
)

// WSControl is a JSON text message of the exec WebSocket. From the client: "resize" (rows,
// cols), "stdin_close", "kill". From the server, last: "exit" (exit_code, signal, error: why the
// command could not run) or "error" (code, message: nexus failed on the way).
type WSControl struct {
	Type     string `json:"type"`
	Rows     uint16 `json:"rows,omitempty"`
	Cols     uint16 `json:"cols,omitempty"`
	ExitCode int    `json:"exit_code"`
	Signal   int    `json:"signal,omitempty"`
	Error    string `json:"error,omitempty"`
	Code     string `json:"code,omitempty"`
	Message  string `json:"message,omitempty"`
}

const (
	wsMaxMessage = 1 << 20
	wsPingEvery  = 20 * time.Second
	wsPeerGone   = 60 * time.Second
)

// The guard checked Origin before the upgrade; gorilla's own check would refuse the
// non-browser clients that send none.
var upgrader = websocket.Upgrader{
	ReadBufferSize: 32 << 10, WriteBufferSize: 64 << 10,
	CheckOrigin: func(*http.Request) bool { return true },
}

// execRequestOf reads the exec WebSocket's query: argv and env repeated, workdir, tty, stdin,
// rows, cols, timeout.
func execRequestOf(r *http.Request) (api.ExecRequest, error) {
	q := r.URL.Query()
	req := api.ExecRequest{Name: r.PathValue("name"), Argv: q["argv"], Env: q["env"], Dir: q.Get("workdir"), Timeout: q.Get("timeout")}
	if len(req.Argv) == 0 || req.Argv[0] == "" {
		return req, errdefs.Invalid("argv is required: give the command and its arguments as repeated argv= parameters")
	}
	var err error
	if req.TTY, err = boolQuery(r, "tty", false); err != nil {
		return req, err
	}
	if req.Stdin, err = boolQuery(r, "stdin", false); err != nil {
		return req, err
	}
	for key, dst := range map[string]*uint16{"rows": &req.Rows, "cols": &req.Cols} {
		if v := q.Get(key); v != "" {
			n, err := strconv.ParseUint(v, 10, 16)
			if err != nil {
				return req, errdefs.Invalid("invalid %s %q", key, clip(v))
			}
			*dst = uint16(n)
		}
	}
	if req.Timeout != "" {
		if _, err := time.ParseDuration(req.Timeout); err != nil {
			return req, errdefs.Invalid("invalid timeout %q: use a duration like 30s", clip(req.Timeout))
		}
	}
	return req, nil
}

// execWebSocket starts the command, and only once the gateway has accepted it upgrades the
// connection: a missing sandbox or a bad request is an HTTP error, never a half-open socket.
func execWebSocket(s *Service, w http.ResponseWriter, r *http.Request) error {
	req, err := execRequestOf(r)
	if err != nil {
		return err
	}
	c, err := s.client(r.Context())
	if err != nil {
		return err
	}
	ctx, cancel := context.WithCancel(context.WithoutCancel(r.Context()))
	defer cancel()
	ws := &wsSession{}
	stdinR, stdinW := io.Pipe()
	resize := make(chan vmmapi.Resize, 4)
	pipes := api.IO{Stdin: stdinR, Stdout: ws.writer(ChanStdout), Stderr: ws.writer(ChanStderr), Resize: resize}
	var conn *websocket.Conn
	exec := func(ectx context.Context, req api.ExecRequest) (api.Started, error) {
		started, err := c.Exec(ectx, req)
		if err != nil {
			return started, err
		}
		if conn, err = upgrader.Upgrade(w, r, nil); err != nil {
			return started, err
		}
		ws.set(conn)
		go ws.readLoop(conn, stdinW, req.Stdin, resize, cancel)
		return started, nil
	}
	exit, err := api.RunSession(ctx, c.Conn(), req, exec, pipes)
	stdinR.Close()
	if conn == nil {
		return err // nothing upgraded: an HTTP error
	}
	ws.finish(exitControl(exit, err))
	return nil
}

// wsSession serialises the writes of one exec socket (gorilla allows one writer at a time).
type wsSession struct {
	mu   sync.Mutex
	conn *websocket.Conn
	done bool
}

func (ws *wsSession) set(c *websocket.Conn) {
	ws.mu.Lock()
	ws.conn = c
	ws.mu.Unlock()
	c.SetReadLimit(wsMaxMessage)
	go ws.ping()
}

type chanWriter struct {
	ws *wsSession
	ch byte
}

func (ws *wsSession) writer(ch byte) io.Writer { return chanWriter{ws, ch} }

func (cw chanWriter) Write(p []byte) (int, error) {
	ws := cw.ws
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.conn == nil || ws.done {
		return 0, errors.New("exec socket closed")
	}
	frame := make([]byte, 1+len(p))
	frame[0] = cw.ch
	copy(frame[1:], p)
	ws.conn.SetWriteDeadline(time.Now().Add(wsPeerGone))
	if err := ws.conn.WriteMessage(websocket.BinaryMessage, frame); err != nil {
		return 0, err
	}
	return len(p), nil
}

func (ws *wsSession) ping() {
	t := time.NewTicker(wsPingEvery)
	defer t.Stop()
	for range t.C {
		ws.mu.Lock()
		if ws.done {
			ws.mu.Unlock()
			return
		}
		err := ws.conn.WriteControl(websocket.PingMessage, nil, time.Now().Add(10*time.Second))
		ws.mu.Unlock()
		if err != nil {
			return
		}
	}
}

// finish sends the last control message and closes the socket normally.
func (ws *wsSession) finish(msg WSControl) {
	ws.mu.Lock()
	defer ws.mu.Unlock()
	if ws.done {
		return
	}
	ws.done = true
	b, _ := json.Marshal(msg)
	ws.conn.SetWriteDeadline(time.Now().Add(10 * time.Second))
	ws.conn.WriteMessage(websocket.TextMessage, b)
	ws.conn.WriteControl(websocket.CloseMessage, websocket.FormatCloseMessage(websocket.CloseNormalClosure, msg.Type), time.Now().Add(5*time.Second))
	ws.conn.Close()
}

// readLoop forwards the client's stdin (when the command reads it: forward) and control messages until the socket ends; a client
// gone before the command exits kills it (cancel), as a killed CLI does.
func (ws *wsSession) readLoop(conn *websocket.Conn, stdin *io.PipeWriter, forward bool, resize chan<- vmmapi.Resize, cancel context.CancelFunc) {
	defer stdin.Close()
	conn.SetReadDeadline(time.Now().Add(wsPeerGone))
	conn.SetPongHandler(func(string) error { return conn.SetReadDeadline(time.Now().Add(wsPeerGone)) })
	for {
		kind, data, err := conn.ReadMessage()
		if err != nil {
			cancel()
			return
		}
		conn.SetReadDeadline(time.Now().Add(wsPeerGone))
		switch kind {
		case websocket.BinaryMessage:
			if !forward || len(data) == 0 || data[0] != ChanStdin {
				continue
			}
			if _, err := stdin.Write(data[1:]); err != nil {
				continue // stdin closed: the rest is dropped, control still flows
			}
		case websocket.TextMessage:
			var m WSControl
			if json.Unmarshal(data, &m) != nil {
				continue
			}
			switch m.Type {
			case "stdin_close":
				stdin.Close()
			case "resize":
				select {
				case resize <- vmmapi.Resize{Rows: m.Rows, Cols: m.Cols}:
				default:
				}
			case "kill":
				cancel()
			}
		}
	}
}
