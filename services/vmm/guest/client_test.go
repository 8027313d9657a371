package guest_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/agent"
	"github.com/IniZio/nexus/services/vmm/guest"
)

// shortTemp returns a short temp dir (unix socket paths are limited to 108 bytes).
func shortTemp(t testing.TB) string {
	d, err := os.MkdirTemp("", "nx")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(d) })
	return d
}

type harness struct {
	dir    string
	sock   string
	server *agent.Server
	client *guest.Client
}

// startAgent runs an agent server on a unix socket and connects a client to it.
func startAgent(t testing.TB, cfg agent.Config) *harness {
	t.Helper()
	dir := shortTemp(t)
	sock := filepath.Join(dir, "agent.sock")
	cfg.Logger = zerolog.Nop()
	if cfg.Env == nil {
		cfg.Env = []string{"PATH=" + os.Getenv("PATH"), "HOME=" + dir}
	}
	srv, err := agent.New(cfg)
	if err != nil {
		t.Fatal(err)
	}
	l, err := net.Listen("unix", sock)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go srv.Serve(ctx, l)
	dctx, dcancel := context.WithTimeout(ctx, 10*time.Second)
	defer dcancel()
	c, err := guest.Dial(dctx, sock)
	if err != nil {
		t.Fatalf("dial: %v", err)
	}
	t.Cleanup(func() { c.Close() })
	return &harness{dir: dir, sock: sock, server: srv, client: c}
}

func ctxT(t testing.TB) context.Context {
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	t.Cleanup(cancel)
	return ctx
}

func run(t *testing.T, c *guest.Client, req guest.ExecRequest, stdin io.Reader) (string, string, guest.ExitStatus) {
	t.Helper()
	var out, errb bytes.Buffer
	st, err := c.Exec(ctxT(t), req, stdin, &out, &errb, nil)
	if err != nil {
		t.Fatalf("exec %v: %v", req.Argv, err)
	}
	return out.String(), errb.String(), st
}

func TestPing(t *testing.T) {
	h := startAgent(t, agent.Config{})
	p, err := h.client.Ping(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	if p.Version != agentproto.Version || p.BootTime.IsZero() {
		t.Fatalf("pong %+v", p)
	}
}

func TestExecBasics(t *testing.T) {
	h := startAgent(t, agent.Config{})
	c := h.client
	noexec := filepath.Join(h.dir, "plain")
	os.WriteFile(noexec, []byte("data"), 0o644)
	tests := []struct {
		name              string
		req               guest.ExecRequest
		stdin             string
		out, errOut, eMsg string
		code, sig         int
	}{
		{name: "echo", req: guest.ExecRequest{Argv: []string{"echo", "hello", "world"}}, out: "hello world\n"},
		{name: "stderr and code", req: guest.ExecRequest{Argv: []string{"sh", "-c", "echo oops >&2; exit 3"}}, errOut: "oops\n", code: 3},
		{name: "signal death", req: guest.ExecRequest{Argv: []string{"sh", "-c", "kill -TERM $$"}}, code: 143, sig: 15},
		{name: "stdin", req: guest.ExecRequest{Argv: []string{"cat"}}, stdin: "piped input\n", out: "piped input\n"},
		{name: "env and dir", req: guest.ExecRequest{Argv: []string{"sh", "-c", "echo $FOO; pwd"}, Env: []string{"FOO=bar"}, Dir: "/tmp"}, out: "bar\n/tmp\n"},
		{name: "missing binary", req: guest.ExecRequest{Argv: []string{"no-such-binary-xyz"}}, code: 127,
			eMsg: `exec: "no-such-binary-xyz": executable file not found in $PATH`},
		{name: "missing path", req: guest.ExecRequest{Argv: []string{"/nonexistent/bin"}}, code: 127,
			eMsg: `exec: "/nonexistent/bin": no such file or directory`},
		{name: "not executable", req: guest.ExecRequest{Argv: []string{noexec}}, code: 126,
			eMsg: `exec: "` + noexec + `": permission denied`},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			var stdin io.Reader
			if tc.stdin != "" {
				stdin = strings.NewReader(tc.stdin)
			}
			out, errOut, st := run(t, c, tc.req, stdin)
			if out != tc.out || errOut != tc.errOut || st.Code != tc.code || st.Signal != tc.sig || st.Error != tc.eMsg {
				t.Fatalf("got out=%q err=%q status=%+v; want out=%q err=%q code=%d sig=%d msg=%q",
					out, errOut, st, tc.out, tc.errOut, tc.code, tc.sig, tc.eMsg)
			}
		})
	}
}

func TestExecConfiguredEnv(t *testing.T) {
	h := startAgent(t, agent.Config{})
	if err := h.client.Configure(ctxT(t), agentproto.ConfigureRequest{Env: map[string]string{"A": "1", "B": "2"}, Hostname: "box-1"}); err != nil {
		t.Fatal(err)
	}
	out, _, _ := run(t, h.client, guest.ExecRequest{Argv: []string{"sh", "-c", "echo $A$B"}, Env: []string{"B=3"}}, nil)
	if out != "13\n" {
		t.Fatalf("got %q", out)
	}
	p, _ := h.client.Ping(ctxT(t))
	if p.Hostname != "box-1" {
		t.Fatalf("hostname %q", p.Hostname)
	}
	err := h.client.Configure(ctxT(t), agentproto.ConfigureRequest{Env: map[string]string{"A=B": "1"}})
	if !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("bad env key: %v", err)
	}
	err = h.client.Configure(ctxT(t), agentproto.ConfigureRequest{Network: &agentproto.NetworkConfig{Address: "10.0.0.2/24"}})
	if !errors.Is(err, errdefs.ErrRefused) {
		t.Fatalf("network outside init: %v", err)
	}
}

// countingWriter hashes what it gets and records the largest single write.
type countingWriter struct {
	n   int64
	h   io.Writer
	max int
}

func (w *countingWriter) Write(p []byte) (int, error) {
	w.n += int64(len(p))
	w.max = max(w.max, len(p))
	return w.h.Write(p)
}

func TestExecLargeOutputStreamsWithBoundedMemory(t *testing.T) {
	h := startAgent(t, agent.Config{})
	const size = 50 << 20
	hs := sha256.New()
	w := &countingWriter{h: hs}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	st, err := h.client.Exec(ctxT(t), guest.ExecRequest{Argv: []string{"head", "-c", fmt.Sprint(size), "/dev/zero"}}, nil, w, io.Discard, nil)
	if err != nil || st.Code != 0 {
		t.Fatalf("exec: %v %+v", err, st)
	}
	runtime.ReadMemStats(&after)
	if w.n != size {
		t.Fatalf("got %d bytes, want %d", w.n, size)
	}
	if w.max > agentproto.MaxFramePayload {
		t.Fatalf("a single write of %d bytes", w.max)
	}
	want := sha256.Sum256(make([]byte, size))
	if !bytes.Equal(hs.Sum(nil), want[:]) {
		t.Fatal("content differs")
	}
	// Both ends run in this process; the live heap after must not hold the output.
	if grow := int64(after.HeapInuse) - int64(before.HeapInuse); grow > 20<<20 {
		t.Fatalf("heap grew by %d bytes streaming %d", grow, size)
	}
}

func TestExecOutputIsLive(t *testing.T) {
	h := startAgent(t, agent.Config{})
	s, err := h.client.StartExec(ctxT(t), guest.ExecRequest{Argv: []string{"sh", "-c", "echo first; read x; echo second $x"}, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ev, err := s.Next()
	if err != nil || ev.Type != guest.EventStdout || string(ev.Data) != "first\n" {
		t.Fatalf("first event %v %q %v", ev.Type, ev.Data, err)
	}
	// The process is blocked on read: the first line arrived before it exits.
	if err := s.WriteStdin([]byte("go\n")); err != nil {
		t.Fatal(err)
	}
	ev, err = s.Next()
	if err != nil || string(ev.Data) != "second go\n" {
		t.Fatalf("second event %q %v", ev.Data, err)
	}
	ev, err = s.Next()
	if err != nil || ev.Type != guest.EventExit || ev.Exit.Code != 0 {
		t.Fatalf("exit %+v %v", ev, err)
	}
	if _, err := s.Next(); err != io.EOF {
		t.Fatalf("after exit: %v", err)
	}
}

func TestExecSignalAndCancel(t *testing.T) {
	h := startAgent(t, agent.Config{})
	s, err := h.client.StartExec(ctxT(t), guest.ExecRequest{Argv: []string{"sh", "-c", "echo ready; exec sleep 60"}})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if ev, err := s.Next(); err != nil || string(ev.Data) != "ready\n" {
		t.Fatalf("%q %v", ev.Data, err)
	}
	if err := s.Signal(9); err != nil {
		t.Fatal(err)
	}
	ev, err := s.Next()
	if err != nil || ev.Type != guest.EventExit || ev.Exit.Code != 137 || ev.Exit.Signal != 9 {
		t.Fatalf("exit %+v %v", ev, err)
	}

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	start := time.Now()
	_, err = h.client.Exec(ctx, guest.ExecRequest{Argv: []string{"sleep", "60"}}, nil, io.Discard, io.Discard, nil)
	if !errors.Is(err, context.DeadlineExceeded) || time.Since(start) > 10*time.Second {
		t.Fatalf("cancel: %v after %v", err, time.Since(start))
	}
}

func TestExecTTY(t *testing.T) {
	h := startAgent(t, agent.Config{})
	out, _, st := run(t, h.client, guest.ExecRequest{Argv: []string{"tty"}, TTY: true, Rows: 30, Cols: 100}, nil)
	if st.Code != 0 || !strings.HasPrefix(out, "/dev/pts/") {
		t.Fatalf("tty: %q %+v", out, st)
	}
	out, _, _ = run(t, h.client, guest.ExecRequest{Argv: []string{"stty", "size"}, TTY: true, Rows: 30, Cols: 100}, nil)
	if strings.TrimSpace(out) != "30 100" {
		t.Fatalf("stty size %q", out)
	}

	// Resize while running: the shell waits for a line, then prints the new size.
	s, err := h.client.StartExec(ctxT(t), guest.ExecRequest{Argv: []string{"sh", "-c", "stty -echo; echo go; read x; stty size"}, TTY: true, Rows: 24, Cols: 80, Stdin: true})
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	var got strings.Builder
	waitOut := func(want string) {
		for !strings.Contains(got.String(), want) {
			ev, err := s.Next()
			if err != nil || ev.Type == guest.EventExit {
				t.Fatalf("waiting for %q, got %q, %v %+v", want, got.String(), err, ev.Exit)
			}
			got.Write(ev.Data)
		}
	}
	waitOut("go")
	if err := s.Resize(50, 132); err != nil {
		t.Fatal(err)
	}
	s.WriteStdin([]byte("\n"))
	waitOut("50 132")
}

func TestCopyRoundTrip(t *testing.T) {
	h := startAgent(t, agent.Config{})
	ctx := ctxT(t)
	data := bytes.Repeat([]byte("nexus copy "), 100_000) // 1.1 MB, many frames
	target := filepath.Join(h.dir, "sub", "file.txt")
	err := h.client.CopyIn(ctx, agentproto.CopyInRequest{Path: target, Mode: 0o640, Size: int64(len(data))}, bytes.NewReader(data))
	if !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("missing dir: %v", err)
	}
	err = h.client.CopyIn(ctx, agentproto.CopyInRequest{Path: target, Mode: 0o640, Size: int64(len(data)), MkdirAll: true}, bytes.NewReader(data))
	if err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(target)
	if err != nil || fi.Mode().Perm() != 0o640 {
		t.Fatalf("stat %v %v", fi, err)
	}
	var back bytes.Buffer
	info, err := h.client.CopyOut(ctx, target, &back)
	if err != nil || !bytes.Equal(back.Bytes(), data) || info.Size != int64(len(data)) || info.Mode != 0o640 {
		t.Fatalf("copy-out: %v %d bytes info %+v", err, back.Len(), info)
	}

	// Atomicity: a short source leaves the old content and no temporary file.
	err = h.client.CopyIn(ctx, agentproto.CopyInRequest{Path: target, Size: 1000}, strings.NewReader("short"))
	if err == nil {
		t.Fatal("short copy-in succeeded")
	}
	if cur, _ := os.ReadFile(target); !bytes.Equal(cur, data) {
		t.Fatal("target changed by a failed copy-in")
	}
	ents, _ := os.ReadDir(filepath.Dir(target))
	if len(ents) != 1 {
		t.Fatalf("leftover files: %v", ents)
	}

	if _, err := h.client.CopyOut(ctx, filepath.Join(h.dir, "nope"), io.Discard); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("copy-out missing: %v", err)
	}
	if _, err := h.client.CopyOut(ctx, h.dir, io.Discard); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("copy-out dir: %v", err)
	}
	if err := h.client.CopyIn(ctx, agentproto.CopyInRequest{Path: "rel/path", Size: 0}, strings.NewReader("")); !errors.Is(err, errdefs.ErrInvalid) {
		t.Fatalf("relative: %v", err)
	}
}

// echoServer listens on loopback and echoes with a prefix.
func echoServer(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				c.Write([]byte("hi:"))
				io.Copy(c, c)
			}()
		}
	}()
	return l.Addr().(*net.TCPAddr).Port
}

func freePort(t *testing.T) int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	p := l.Addr().(*net.TCPAddr).Port
	l.Close()
	return p
}

func TestConnect(t *testing.T) {
	h := startAgent(t, agent.Config{})
	port := echoServer(t)
	c, err := h.client.Connect(ctxT(t), port)
	if err != nil {
		t.Fatal(err)
	}
	c.Write([]byte("ping"))
	c.(interface{ CloseWrite() error }).CloseWrite()
	got, err := io.ReadAll(c)
	if err != nil || string(got) != "hi:ping" {
		t.Fatalf("got %q %v", got, err)
	}
	c.Close()
	if _, err := h.client.Connect(ctxT(t), freePort(t)); !errors.Is(err, errdefs.ErrUnavailable) {
		t.Fatalf("closed port: %v", err)
	}
}

func TestHybridVsock(t *testing.T) {
	h := startAgent(t, agent.Config{})
	port := echoServer(t)
	vs := filepath.Join(h.dir, "vsock.sock")
	ctx, cancel := context.WithCancel(ctxT(t))
	done := make(chan error, 1)
	go func() { done <- guest.ServeHybridVsock(ctx, h.client, vs, "") }()
	testutil.WaitFor(t, 5*time.Second, func() error { _, err := os.Stat(vs); return err })

	// Good line.
	conn, err := net.Dial("unix", vs)
	if err != nil {
		t.Fatal(err)
	}
	fmt.Fprintf(conn, "CONNECT %d\n", port)
	want := fmt.Sprintf("OK %d\nhi:abc", port)
	conn.Write([]byte("abc"))
	buf := make([]byte, len(want))
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != want {
		t.Fatalf("got %q %v", buf, err)
	}
	conn.Close()

	// Bad lines: closed without a reply.
	for _, line := range []string{"HELLO 1\n", "CONNECT\n", "CONNECT 0\n", "CONNECT 70000\n", "CONNECT 12a\n", strings.Repeat("A", 100), fmt.Sprintf("CONNECT %d\n", freePort(t))} {
		conn, err := net.Dial("unix", vs)
		if err != nil {
			t.Fatal(err)
		}
		conn.Write([]byte(line))
		conn.SetDeadline(time.Now().Add(15 * time.Second))
		got, err := io.ReadAll(conn)
		if errors.Is(err, syscall.ECONNRESET) { // closed with our bytes unread
			err = nil
		}
		if len(got) != 0 || err != nil {
			t.Fatalf("line %q: reply %q err %v", line, got, err)
		}
		conn.Close()
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatal(err)
	}
	if _, err := os.Stat(vs); !os.IsNotExist(err) {
		t.Fatal("socket left behind")
	}
}

func TestDialHost(t *testing.T) {
	h := startAgent(t, agent.Config{})
	vs := filepath.Join(h.dir, "vsock.sock")
	ctx, cancel := context.WithCancel(ctxT(t))
	defer cancel()
	go guest.ServeHybridVsock(ctx, h.client, vs, "")

	// A host service on vsock.sock_2222.
	hl, err := net.Listen("unix", vs+"_2222")
	if err != nil {
		t.Fatal(err)
	}
	defer hl.Close()
	go func() {
		c, err := hl.Accept()
		if err != nil {
			return
		}
		defer c.Close()
		c.Write([]byte("host says hi\n"))
		io.Copy(c, c)
	}()

	// The guest side: the agent's host-dial socket.
	gsock := filepath.Join(h.dir, "hostdial.sock")
	gl, err := net.Listen("unix", gsock)
	if err != nil {
		t.Fatal(err)
	}
	go h.server.ServeHostDial(ctx, gl)

	conn, err := net.Dial("unix", gsock)
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(10 * time.Second))
	fmt.Fprintf(conn, "CONNECT 2222\n")
	conn.Write([]byte("echo me"))
	want := "OK 2222\nhost says hi\necho me"
	buf := make([]byte, len(want))
	if _, err := io.ReadFull(conn, buf); err != nil || string(buf) != want {
		t.Fatalf("got %q %v", buf, err)
	}

	// A port with no host listener: closed without a reply.
	c2, _ := net.Dial("unix", gsock)
	fmt.Fprintf(c2, "CONNECT 2223\n")
	c2.SetDeadline(time.Now().Add(15 * time.Second))
	if got, err := io.ReadAll(c2); len(got) != 0 || err != nil {
		t.Fatalf("refused port: %q %v", got, err)
	}
}

func TestListenersAndLogs(t *testing.T) {
	ring := agent.NewRing(agent.DefaultRingSize)
	fmt.Fprintf(ring, "boot line one\n")
	h := startAgent(t, agent.Config{Logs: ring})
	port := echoServer(t)
	ls, err := h.client.Listeners(ctxT(t))
	if err != nil {
		t.Fatal(err)
	}
	found := false
	for _, l := range ls {
		if l.Port == uint16(port) && l.IP == "127.0.0.1" && l.Proto == "tcp" {
			found = true
		}
	}
	if !found {
		t.Fatalf("listener %d not in %v", port, ls)
	}
	logs, err := h.client.Logs(ctxT(t))
	if err != nil || !strings.Contains(string(logs), "boot line one") {
		t.Fatalf("logs %q %v", logs, err)
	}
	if err := h.client.Shutdown(ctxT(t)); !errors.Is(err, errdefs.ErrRefused) {
		t.Fatalf("shutdown outside init: %v", err)
	}
}

func TestShutdownCallsPowerOff(t *testing.T) {
	off := make(chan struct{})
	h := startAgent(t, agent.Config{PowerOff: func() { close(off) }})
	if err := h.client.Shutdown(ctxT(t)); err != nil {
		t.Fatal(err)
	}
	select {
	case <-off:
	case <-time.After(10 * time.Second):
		t.Fatal("power off not called")
	}
}

func BenchmarkExecTrue(b *testing.B) {
	h := startAgent(b, agent.Config{})
	ctx := context.Background()
	b.ResetTimer()
	for i := 0; i < b.N; i++ {
		st, err := h.client.Exec(ctx, guest.ExecRequest{Argv: []string{"true"}}, nil, io.Discard, io.Discard, nil)
		if err != nil || st.Code != 0 {
			b.Fatal(err, st)
		}
	}
}

func BenchmarkPing(b *testing.B) {
	h := startAgent(b, agent.Config{})
	ctx := context.Background()
	for i := 0; i < b.N; i++ {
		if _, err := h.client.Ping(ctx); err != nil {
			b.Fatal(err)
		}
	}
}
