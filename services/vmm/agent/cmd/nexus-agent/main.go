// Command nexus-agent is the nexus guest agent. As PID 1 (the initramfs /init) it boots the guest
// and serves the host channel; run by hand inside a guest it offers a few subcommands.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"os/signal"
	"strconv"
	"time"

	"github.com/mdlayher/vsock"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/services/vmm/agent"
	"github.com/IniZio/nexus/services/vmm/guest"
)

const usage = `usage: nexus-agent <command>

As PID 1 it boots the guest and serves the host. Commands (inside a guest):
  selftest-vsock [-port N]   check the agent's AF_VSOCK listener over vsock loopback (CID 1)
  dial-host PORT             connect stdin/stdout to host port PORT (e.g. an ssh ProxyCommand)
  serve -unix PATH           serve the protocol on a unix socket (debugging)
  version                    print the protocol version
`

func main() {
	if os.Getpid() == 1 {
		agent.RunInit() // never returns
		return
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
	case "serve":
		err = serve(os.Args[2:])
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
	c, err := guest.NewClient(ctx, conn, guest.Config{Logger: zerolog.Nop()})
	if err != nil {
		conn.Close()
		return fmt.Errorf("selftest-vsock: %w", err)
	}
	defer c.Close()
	t0 := time.Now()
	pong, err := c.Ping(ctx)
	if err != nil {
		return fmt.Errorf("selftest-vsock: ping: %w", err)
	}
	rtt := time.Since(t0)
	if _, err := c.Listeners(ctx); err != nil {
		return fmt.Errorf("selftest-vsock: listeners: %w", err)
	}
	st, err := c.Exec(ctx, guest.ExecRequest{Argv: []string{"nexus-agent", "version"}}, nil, io.Discard, io.Discard, nil)
	if err != nil || st.Code != 0 {
		return fmt.Errorf("selftest-vsock: exec: %v %s", err, st.Error)
	}
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
