package main

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"slices"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
	relayapi "github.com/IniZio/nexus/pkg/api/gitrelay"
)

// exitShim is the shim's exit code for its own failures (ssh's code for its errors).
const exitShim = 255

// shimDialWait bounds how long the shim retries a host that does not take the connection yet
// (the relay starts listening when the sandbox's running event reaches it).
const shimDialWait = 5 * time.Second

// sshShim is the guest's GIT_SSH_COMMAND: instead of ssh it sends the argv git gave it to the
// host's git relay (host port relayapi.GuestPort through the agent's host-dial socket) and
// relays stdin, stdout, stderr and the exit code. No key, agent or known_hosts is needed in the
// guest: the relay decides and runs the host's ssh. It returns the exit code.
func sshShim(args []string) int {
	// git's ssh variant probe (`ssh -G … host`) must succeed so git passes OpenSSH options
	// (-p, -o SendEnv=GIT_PROTOCOL); it runs nothing anywhere.
	if slices.Contains(args, "-G") {
		return 0
	}
	c, err := dialRelay()
	if err != nil {
		fmt.Fprintf(os.Stderr, "nexus: git relay is unavailable: %v\n", err)
		return exitShim
	}
	defer c.Close()
	hello, _ := json.Marshal(relayapi.Hello{Args: args, GitProtocol: os.Getenv("GIT_PROTOCOL")})
	if len(hello) > relayapi.MaxHello {
		fmt.Fprintln(os.Stderr, "nexus: ssh arguments are too long for the git relay")
		return exitShim
	}
	if err := relayapi.WriteFrame(c, relayapi.FrameHello, hello); err != nil {
		fmt.Fprintf(os.Stderr, "nexus: git relay: %v\n", err)
		return exitShim
	}
	go func() {
		// stdin → relay; the frames stay whole because only this goroutine writes to c.
		if _, err := relayapi.CopyFrames(c, relayapi.FrameStdin, os.Stdin); err == nil {
			relayapi.WriteFrame(c, relayapi.FrameStdinEOF, nil)
		}
	}()
	fr := relayapi.NewFrameReader(bufio.NewReaderSize(c, 128<<10))
	for {
		typ, p, err := fr.Next(relayapi.MaxFrame)
		if err != nil {
			fmt.Fprintln(os.Stderr, "nexus: git relay closed the connection")
			return exitShim
		}
		switch typ {
		case relayapi.FrameStdout:
			if _, err := os.Stdout.Write(p); err != nil {
				return exitShim // git went away
			}
		case relayapi.FrameStderr:
			os.Stderr.Write(p)
		case relayapi.FrameExit:
			code, err := relayapi.ParseExit(p)
			if err != nil {
				return exitShim
			}
			return code
		default:
			fmt.Fprintln(os.Stderr, "nexus: git relay sent an unexpected frame")
			return exitShim
		}
	}
}

// dialRelay connects to the relay through the agent's host-dial socket, retrying briefly while
// the host does not take the connection.
func dialRelay() (net.Conn, error) {
	deadline := time.Now().Add(shimDialWait)
	for {
		c, err := dialHostPort(relayapi.GuestPort)
		if err == nil || time.Now().After(deadline) {
			return c, err
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// dialHostPort does the host-dial handshake: "CONNECT <port>\n" → "OK <port>\n".
func dialHostPort(port int) (net.Conn, error) {
	c, err := net.Dial("unix", agentproto.HostDialSocket)
	if err != nil {
		return nil, err
	}
	c.SetDeadline(time.Now().Add(15 * time.Second))
	fmt.Fprintf(c, "CONNECT %d\n", port)
	want := agentproto.ConnectOK(port)
	got := make([]byte, len(want))
	if _, err := io.ReadFull(c, got); err != nil || string(got) != string(want) {
		c.Close()
		return nil, fmt.Errorf("host port %d refused", port)
	}
	c.SetDeadline(time.Time{})
	return c, nil
}
