// Command nexus-agent is the nexus guest agent. As PID 1 (the initramfs /init) it boots the guest
// and serves the host channel; run by hand inside a guest it offers a few subcommands.
package main

import (
	"bufio"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"path/filepath"
	"strconv"
	"syscall"
	"time"

	"github.com/hashicorp/yamux"
	"github.com/mdlayher/vsock"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/services/vmm/agent"
)

const usage = `usage: nexus-agent <command>

As PID 1 it boots the guest and serves the host. Commands (inside a guest):
  selftest-vsock [-port N]   check the agent's AF_VSOCK listener over vsock loopback (CID 1)
  dial-host PORT             connect stdin/stdout to host port PORT (e.g. an ssh ProxyCommand)
  ssh-shim SSH-ARGS...       the guest's GIT_SSH_COMMAND: git over SSH through the host's git relay
  serve -unix PATH           serve the protocol on a unix socket (debugging)
  why [--json] | why request HOST[:PORT] REASON
                             why connections were refused; ask for a host (also as nexus-why)
  owner tcp|udp PORT         the pid and command line of the process with that local port
  sync                       write the guest's dirty pages to its disks (the host's consistent copies)
  version                    print the protocol version
`

func main() {
	if os.Getpid() == 1 {
		agent.RunInit() // never returns
		return
	}
	if filepath.Base(os.Args[0]) == "nexus-why" {
		os.Exit(why(os.Args[1:]))
	}
	if len(os.Args) < 2 {
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	var err error
	switch os.Args[1] {
	case "selftest-vsock":
		err = selftestVsock(os.Args[2:])
	case "dial-host":
		err = dialHost(os.Args[2:])
	case "ssh-shim":
		os.Exit(sshShim(os.Args[2:]))
	case "serve":
		err = serve(os.Args[2:])
	case "owner":
		err = owner(os.Args[2:])
	case "why":
		os.Exit(why(os.Args[2:]))
	case "sync":
		// What the host runs before copying a running guest's disk: every image has this
		// binary, not every image a sync(1).
		syscall.Sync()
	case "version":
		fmt.Println(agentproto.Version)
	default:
		fmt.Fprint(os.Stderr, usage)
		os.Exit(2)
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nexus-agent: %v\n", err)
		os.Exit(1)
	}
}

// selftestVsock connects to the agent over AF_VSOCK loopback and runs ping, listeners and an exec
// through it: the same protocol a hypervisor's vsock would carry.
func selftestVsock(args []string) error {
	fs := flag.NewFlagSet("selftest-vsock", flag.ContinueOnError)
	port := fs.Uint("port", agentproto.DefaultVsockPort, "vsock port of the agent")
	if err := fs.Parse(args); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	conn, err := vsock.Dial(vsock.Local, uint32(*port), nil)
	if err != nil {
		return fmt.Errorf("selftest-vsock: dial cid %d port %d: %w", vsock.Local, *port, err)
	}
	defer conn.Close()
	conn.SetDeadline(time.Now().Add(20 * time.Second))
	// The same handshake and framing the host uses over virtio-serial.
	br := bufio.NewReader(conn)
	nonce := strconv.FormatInt(time.Now().UnixNano(), 16)
	if _, err := conn.Write(agentproto.Hello(nonce)); err != nil {
		return fmt.Errorf("selftest-vsock: hello: %w", err)
	}
	if err := agentproto.AwaitReady(br, nonce); err != nil {
		return fmt.Errorf("selftest-vsock: handshake: %w", err)
	}
	sess, err := yamux.Client(bufConn{conn, br}, agent.YamuxConfig())
	if err != nil {
		return fmt.Errorf("selftest-vsock: %w", err)
	}
	defer sess.Close()
	call := func(op agentproto.Op) (*agentproto.Response, error) {
		st, err := sess.OpenStream()
		if err != nil {
			return nil, err
		}
		defer st.Close()
		if err := agentproto.WriteMessage(st, agentproto.Request{Op: op}); err != nil {
			return nil, err
		}
		resp, err := agentproto.ReadResponse(st)
		if err != nil {
			return nil, err
		}
		return resp, resp.Err()
	}
	t0 := time.Now()
	resp, err := call(agentproto.OpPing)
	if err != nil || resp.Pong == nil {
		return fmt.Errorf("selftest-vsock: ping: %v", err)
	}
	rtt := time.Since(t0)
	pong := resp.Pong
	if _, err := call(agentproto.OpListeners); err != nil {
		return fmt.Errorf("selftest-vsock: listeners: %w", err)
	}
	_ = ctx
	fmt.Printf("selftest-vsock: ok (agent %s, ping %s, vsock port %d)\n", pong.Version, rtt.Round(time.Microsecond), *port)
	return nil
}

// dialHost splices stdin/stdout with a host port through the agent's host-dial socket.
func dialHost(args []string) error {
	if len(args) != 1 {
		return errors.New("usage: nexus-agent dial-host PORT")
	}
	port, err := strconv.Atoi(args[0])
	if err != nil || port < 1 || port > 65535 {
		return fmt.Errorf("dial-host: bad port %.20q", args[0])
	}
	c, err := net.Dial("unix", agentproto.HostDialSocket)
	if err != nil {
		return fmt.Errorf("dial-host: %w", err)
	}
	defer c.Close()
	c.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(c, "CONNECT %d\n", port)
	want := agentproto.ConnectOK(port)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(want) {
		return fmt.Errorf("dial-host: host port %d refused", port)
	}
	c.SetDeadline(time.Time{})
	done := make(chan struct{})
	go func() {
		io.Copy(os.Stdout, c)
		close(done)
	}()
	io.Copy(c, os.Stdin)
	c.(*net.UnixConn).CloseWrite()
	<-done
	return nil
}

func serve(args []string) error {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	path := fs.String("unix", "", "unix socket path to listen on")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *path == "" {
		return errors.New("serve: -unix is required")
	}
	log := zerolog.New(os.Stderr).With().Timestamp().Logger()
	srv, err := agent.New(agent.Config{Logger: log, Env: os.Environ()})
	if err != nil {
		return err
	}
	os.Remove(*path)
	l, err := net.Listen("unix", *path)
	if err != nil {
		return fmt.Errorf("serve: %w", err)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt)
	defer stop()
	return srv.Serve(ctx, l)
}

// bufConn reads through the handshake's buffered reader so no byte after READY is lost.
type bufConn struct {
	net.Conn
	r *bufio.Reader
}

func (c bufConn) Read(p []byte) (int, error) { return c.r.Read(p) }
