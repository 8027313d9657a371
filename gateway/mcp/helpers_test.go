package mcp

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"io"
	"os/exec"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/mark3labs/mcp-go/client"
	mcpgo "github.com/mark3labs/mcp-go/mcp"
	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/gateway"
	"github.com/IniZio/nexus/internal/testutil"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/stream"
)

// stack is a bus, the real gateway and (optionally) a fake vmm, with an MCP client driving an
// in-process MCP server.
type stack struct {
	bus    *testutil.Bus
	srv    *Server
	client *client.Client
	gw     *api.Client
	vmm    *fakeVMM
}

func newStack(t *testing.T, withVMM bool) *stack {
	t.Helper()
	b := testutil.NewBus(t)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	gw, err := gateway.New(gateway.Config{Bus: b.Connect(t, bus.UserGateway), Home: b.Home, Host: bus.LocalHost, Log: zerolog.Nop(), Version: "0.0.1"})
	if err != nil {
		t.Fatal(err)
	}
	done := make(chan struct{})
	var runErr atomic.Value
	go func() {
		defer close(done)
		if err := gw.Run(ctx); err != nil {
			runErr.Store(err.Error())
		}
	}()
	t.Cleanup(func() { cancel(); <-done })
	st := &stack{bus: b, gw: api.NewClient(b.Connect(t, bus.UserCLI))}
	startFakePerimeter(t, b.Connect(t, bus.UserAdmin))
	if withVMM {
		st.vmm = startFakeVMM(t, ctx, b.Connect(t, bus.UserVMM))
	}
	testutil.WaitFor(t, 10*time.Second, func() error {
		if e := runErr.Load(); e != nil {
			t.Fatalf("gateway: %s", e)
		}
		_, err := st.gw.List(ctx, api.ListRequest{})
		return err
	})
	st.srv, st.client = connectMCP(t, ctx, b)
	return st
}

// connectMCP starts an MCP server of its own (one `nexus mcp` process) on bus b and a client
// driving it.
func connectMCP(t *testing.T, ctx context.Context, b *testutil.Bus) (*Server, *client.Client) {
	t.Helper()
	srv, err := New(Config{Log: zerolog.Nop(), Version: "test", ValidateOutput: true, Dial: func(ctx context.Context) (*nats.Conn, error) {
		return bus.Connect(ctx, bus.ConnectConfig{Home: b.Home, User: bus.UserCLI, URL: b.URL})
	}})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(srv.Close)
	c, err := client.NewInProcessClient(srv.MCPServer())
	if err != nil {
		t.Fatal(err)
	}
	if err := c.Start(ctx); err != nil {
		t.Fatal(err)
	}
	init := mcpgo.InitializeRequest{}
	init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
	init.Params.ClientInfo = mcpgo.Implementation{Name: "nexus-test", Version: "1"}
	if _, err := c.Initialize(ctx, init); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return srv, c
}

// call invokes a tool and returns its result; a transport failure fails the test.
func (st *stack) call(t *testing.T, tool string, args map[string]any) *mcpgo.CallToolResult {
	t.Helper()
	req := mcpgo.CallToolRequest{}
	req.Params.Name = tool
	req.Params.Arguments = args
	ctx, cancel := context.WithTimeout(context.Background(), 2*time.Minute)
	defer cancel()
	res, err := st.client.CallTool(ctx, req)
	if err != nil {
		t.Fatalf("%s: transport error: %v", tool, err)
	}
	return res
}

// ok calls a tool that must succeed and decodes its structured content into out.
func (st *stack) ok(t *testing.T, tool string, args map[string]any, out any) {
	t.Helper()
	res := st.call(t, tool, args)
	if res.IsError {
		t.Fatalf("%s: tool error: %s", tool, text(res))
	}
	if out != nil {
		b, _ := json.Marshal(res.StructuredContent)
		if err := json.Unmarshal(b, out); err != nil {
			t.Fatalf("%s: decode %s: %v", tool, b, err)
		}
	}
}

// fails calls a tool that must fail and returns its message.
func (st *stack) fails(t *testing.T, tool string, args map[string]any) (string, *mcpgo.CallToolResult) {
	t.Helper()
	res := st.call(t, tool, args)
	if !res.IsError {
		b, _ := json.Marshal(res.StructuredContent)
		t.Fatalf("%s: want a tool error, got %s", tool, b)
	}
	msg := text(res)
	if strings.Contains(msg, "\n") {
		t.Errorf("%s: error message is not one line: %q", tool, msg)
	}
	return msg, res
}

func text(res *mcpgo.CallToolResult) string {
	var parts []string
	for _, c := range res.Content {
		if tc, ok := mcpgo.AsTextContent(c); ok {
			parts = append(parts, tc.Text)
		}
	}
	return strings.Join(parts, " ")
}

// fakeVMM answers the vmm's bus API without VMs: start/stop/pause/resume/remove only record
// state, and exec runs the command on the host with sh, so that exec plumbing, output limits
// and cleanup can be tested fast. It is a test double, never wired into nexus.
type fakeVMM struct {
	mu      sync.Mutex
	vms     map[string]*vmmapi.VMInfo
	removed []string
	// execHook, when set, can refuse an exec.
	execHook func(r vmmapi.ExecRequest) error
	// paths maps guest paths to host directories in argv and env (the "guest" filesystem).
	paths map[string]string
	// images are the image records inspect answers; an exec without argv in a sandbox of one
	// runs its Entrypoint and Cmd, as the vmm does.
	images  map[string]vmmapi.ImageInfo
	imageOf map[string]string
}

func (f *fakeVMM) mapPaths(ss []string) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		for g, h := range f.paths {
			s = strings.ReplaceAll(s, g, h)
		}
		out[i] = s
	}
	return out
}

func startFakeVMM(t *testing.T, ctx context.Context, nc *nats.Conn) *fakeVMM {
	f := &fakeVMM{vms: map[string]*vmmapi.VMInfo{}, images: map[string]vmmapi.ImageInfo{}, imageOf: map[string]string{}}
	ready := make(chan error, 1)
	serve := func(register func(s *bus.Service) error) {
		err := bus.Serve(ctx, nc, bus.ServiceInfo{Name: "vmm", Host: bus.LocalHost, Version: "0.0.1"}, zerolog.Nop(), register)
		select {
		case ready <- err: // it failed before registering
		default:
		}
	}
	go serve(func(s *bus.Service) error {
		err := errors.Join(
			vmmapi.Start.Serve(s, func(_ context.Context, r vmmapi.StartRequest) (vmmapi.StartResponse, error) {
				f.mu.Lock()
				defer f.mu.Unlock()
				f.vms[r.ID] = &vmmapi.VMInfo{ID: r.ID, Running: true, PID: 1, Started: time.Now()}
				f.imageOf[r.ID] = r.Image
				return vmmapi.StartResponse{PID: 1, Accel: "fake"}, nil
			}),
			vmmapi.Stop.Serve(s, f.set(func(vi *vmmapi.VMInfo) { vi.Running = false })),
			vmmapi.Pause.Serve(s, f.set(func(vi *vmmapi.VMInfo) { vi.Paused = true })),
			vmmapi.Resume.Serve(s, f.set(func(vi *vmmapi.VMInfo) { vi.Paused = false })),
			vmmapi.Remove.Serve(s, func(_ context.Context, r vmmapi.IDRequest) (vmmapi.Empty, error) {
				f.mu.Lock()
				defer f.mu.Unlock()
				delete(f.vms, r.ID)
				f.removed = append(f.removed, r.ID)
				return vmmapi.Empty{}, nil
			}),
			vmmapi.Inspect.Serve(s, func(_ context.Context, r vmmapi.IDRequest) (vmmapi.VMInfo, error) {
				f.mu.Lock()
				defer f.mu.Unlock()
				if vi, ok := f.vms[r.ID]; ok {
					return *vi, nil
				}
				return vmmapi.VMInfo{ID: r.ID}, nil
			}),
			vmmapi.List.Serve(s, func(_ context.Context, _ vmmapi.Empty) ([]vmmapi.VMInfo, error) {
				f.mu.Lock()
				defer f.mu.Unlock()
				out := []vmmapi.VMInfo{}
				for _, vi := range f.vms {
					out = append(out, *vi)
				}
				return out, nil
			}),
			vmmapi.Logs.Serve(s, func(_ context.Context, r vmmapi.LogsRequest) (vmmapi.LogsResponse, error) {
				log := []byte("boot: ok\nagent: ready \xe2\x9c\x93\n") // ends with a 3-byte rune
				off := min(r.Offset, int64(len(log)))
				end := min(off+int64(r.Max), int64(len(log)))
				return vmmapi.LogsResponse{Data: log[off:end], NextOffset: end}, nil
			}),
			vmmapi.Exec.Serve(s, f.exec(nc)),
			vmmapi.Image.Serve(s, func(_ context.Context, r vmmapi.ImageRequest) (vmmapi.ImageInfo, error) {
				f.mu.Lock()
				defer f.mu.Unlock()
				if i, ok := f.images[r.Name]; ok && r.Op == "inspect" {
					return i, nil
				}
				return vmmapi.ImageInfo{}, errdefs.NotFound("image %s is not here", r.Name)
			}),
		)
		ready <- err
		return err
	})
	if err := <-ready; err != nil {
		t.Fatal(err)
	}
	return f
}

// startFakePerimeter answers every request to netstack, mitm and credbroker with success and
// no data, so that the gateway's create and remove get past the perimeter without those
// services (their own tests cover them).
func startFakePerimeter(t *testing.T, nc *nats.Conn) {
	t.Helper()
	ok, _ := bus.EncodeOK(struct{}{})
	for _, subj := range []string{bus.NetstackAPI.All(), bus.MITMAPI.All(), bus.CredAPI.All()} {
		sub, err := nc.Subscribe(subj, func(m *nats.Msg) {
			if m.Reply != "" {
				m.Respond(ok)
			}
		})
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { sub.Unsubscribe() })
	}
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}
}

func (f *fakeVMM) set(fn func(*vmmapi.VMInfo)) func(context.Context, vmmapi.IDRequest) (vmmapi.Empty, error) {
	return func(_ context.Context, r vmmapi.IDRequest) (vmmapi.Empty, error) {
		f.mu.Lock()
		defer f.mu.Unlock()
		vi, ok := f.vms[r.ID]
		if !ok {
			return vmmapi.Empty{}, errdefs.NotFound("no VM %s", r.ID)
		}
		fn(vi)
		return vmmapi.Empty{}, nil
	}
}

func (f *fakeVMM) running() int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.vms)
}

func (f *fakeVMM) exec(nc *nats.Conn) func(context.Context, vmmapi.ExecRequest) (vmmapi.Empty, error) {
	return func(_ context.Context, r vmmapi.ExecRequest) (vmmapi.Empty, error) {
		if f.execHook != nil {
			if err := f.execHook(r); err != nil {
				return vmmapi.Empty{}, err
			}
		}
		sess, err := stream.Server(nc, bus.LocalHost, r.SID)
		if err != nil {
			return vmmapi.Empty{}, err
		}
		if len(r.Argv) == 0 {
			f.mu.Lock()
			img := f.images[f.imageOf[r.ID]]
			f.mu.Unlock()
			r.Argv = append(append([]string{}, img.Entrypoint...), img.Cmd...)
		}
		argv := f.mapPaths(r.Argv)
		cmd := exec.Command(argv[0], argv[1:]...)
		cmd.Env = append([]string{"PATH=/usr/bin:/bin"}, f.mapPaths(r.Env)...)
		cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
		stdin, _ := cmd.StdinPipe()
		stdout, _ := cmd.StdoutPipe()
		stderr, _ := cmd.StderrPipe()
		if err := cmd.Start(); err != nil {
			sess.Close()
			return vmmapi.Empty{}, errdefs.Invalid("exec: %v", err)
		}
		go func() {
			defer sess.Close()
			var wg sync.WaitGroup
			pump := func(kind string, rd io.Reader) {
				defer wg.Done()
				buf := make([]byte, 32<<10)
				for {
					n, err := rd.Read(buf)
					if n > 0 {
						sess.Write(kind, bytes.Clone(buf[:n]))
					}
					if err != nil {
						return
					}
				}
			}
			wg.Add(2)
			go pump(stream.KindStdout, stdout)
			go pump(stream.KindStderr, stderr)
			go func() {
				for {
					m, err := sess.Recv()
					if err != nil {
						syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL)
						return
					}
					switch m.Kind {
					case stream.KindStdin:
						stdin.Write(m.Data)
					case stream.KindStdinClose:
						stdin.Close()
					}
				}
			}()
			var timedOut atomic.Bool
			if d, err := time.ParseDuration(r.Timeout); err == nil && d > 0 {
				t := time.AfterFunc(d, func() { timedOut.Store(true); syscall.Kill(-cmd.Process.Pid, syscall.SIGKILL) })
				defer t.Stop()
			}
			wg.Wait()
			err := cmd.Wait()
			code := 0
			var ee *exec.ExitError
			if errors.As(err, &ee) {
				code = ee.ExitCode()
			}
			if timedOut.Load() {
				code = 124
			}
			sess.Send(stream.KindExit, vmmapi.Exit{Code: code})
		}()
		return vmmapi.Empty{}, nil
	}
}
