package main

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"os"
	"strconv"
	"strings"
	"time"

	"github.com/IniZio/nexus/pkg/agentproto"
)

const whyUsage = `usage: nexus-why [--json]                        why this sandbox's recent connections were refused
       nexus-why request HOST[:PORT] [REASON...]   ask the sandbox's owner for a host (ask mode)
`

// maxWhyResponse bounds what nexus-why reads from the host.
const maxWhyResponse = 256 << 10

// why is `nexus-why` (the agent binary under that name, or `nexus-agent why`): it asks the
// host, over the agent channel, for this sandbox's own recent refusals, or files a request. It
// uses a plain HTTP/1.0 exchange so the agent carries no HTTP stack.
func why(args []string) int {
	asJSON := false
	if len(args) > 0 && (args[0] == "--json" || args[0] == "-json") {
		asJSON, args = true, args[1:]
	}
	var status int
	var body []byte
	var err error
	switch {
	case len(args) == 0:
		status, body, err = whyCall("GET", agentproto.WhyPath, nil)
	case args[0] == "request" && len(args) >= 2:
		req := agentproto.WhyRequest{Host: args[1], Reason: strings.Join(args[2:], " ")}
		if h, p, err := net.SplitHostPort(args[1]); err == nil {
			n, perr := strconv.Atoi(p)
			if perr != nil || n < 1 || n > 65535 {
				fmt.Fprintf(os.Stderr, "nexus-why: bad port in %.80q\n", args[1])
				return 2
			}
			req.Host, req.Port = h, n
		}
		b, _ := json.Marshal(req)
		status, body, err = whyCall("POST", agentproto.WhyRequestPath, b)
	default:
		fmt.Fprint(os.Stderr, whyUsage)
		return 2
	}
	if err != nil {
		fmt.Fprintf(os.Stderr, "nexus-why: %v\n", err)
		return 1
	}
	if asJSON {
		os.Stdout.Write(body)
		if status >= 300 {
			return 1
		}
		return 0
	}
	if status >= 300 || len(args) > 0 {
		var a agentproto.WhyAnswer
		if json.Unmarshal(body, &a) != nil || a.Message == "" {
			a.Message = fmt.Sprintf("the host answered %d", status)
		}
		if status >= 300 {
			fmt.Fprintf(os.Stderr, "nexus-why: %s\n", a.Message)
			return 1
		}
		fmt.Println(a.Message)
		return 0
	}
	var rep agentproto.WhyReport
	if err := json.Unmarshal(body, &rep); err != nil {
		fmt.Fprintf(os.Stderr, "nexus-why: unreadable answer: %v\n", err)
		return 1
	}
	printWhy(os.Stdout, rep)
	return 0
}

func printWhy(w io.Writer, rep agentproto.WhyReport) {
	mode := rep.Mode
	if rep.Ask {
		mode += ", ask mode: `nexus-why request HOST[:PORT] REASON` asks the owner"
	}
	fmt.Fprintf(w, "sandbox %s (egress %s)\n", rep.Sandbox, mode)
	if len(rep.Denials) == 0 {
		fmt.Fprintln(w, "nothing was refused recently")
		return
	}
	for _, d := range rep.Denials {
		what := d.Host
		if what == "" {
			what = d.IP
		} else if d.IP != "" {
			what += " (" + d.IP + ")"
		}
		if d.Port != 0 {
			what += " port " + strconv.Itoa(d.Port)
		}
		if d.Method != "" {
			what += " " + d.Method + " " + d.Path
		}
		rule := d.Rule
		if rule == "" {
			rule = "default deny"
		}
		fmt.Fprintf(w, "%s  %s %s  refused [%s]: %s\n    to allow: %s\n", d.Time.Local().Format("15:04:05"), d.Layer, what, rule, d.Reason, d.Fix)
	}
}

// whyCall does one HTTP/1.0 exchange with nexus-why on the host: through the agent's host-dial
// socket to host port agentproto.WhyPort, which the vmm serves for this sandbox alone.
func whyCall(method, path string, body []byte) (int, []byte, error) {
	c, err := dialHostPort(agentproto.WhyPort)
	if err != nil {
		return 0, nil, fmt.Errorf("the host does not answer: %w", err)
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(10 * time.Second))
	var req bytes.Buffer
	fmt.Fprintf(&req, "%s %s HTTP/1.0\r\nHost: nexus-why\r\n", method, path)
	if body != nil {
		fmt.Fprintf(&req, "Content-Type: application/json\r\nContent-Length: %d\r\n", len(body))
	}
	req.WriteString("\r\n")
	req.Write(body)
	if _, err := c.Write(req.Bytes()); err != nil {
		return 0, nil, err
	}
	br := bufio.NewReader(io.LimitReader(c, maxWhyResponse))
	line, err := br.ReadString('\n')
	if err != nil {
		return 0, nil, fmt.Errorf("no answer: %w", err)
	}
	f := strings.Fields(line)
	if len(f) < 2 || !strings.HasPrefix(f[0], "HTTP/") {
		return 0, nil, fmt.Errorf("not an HTTP answer: %.60q", line)
	}
	status, err := strconv.Atoi(f[1])
	if err != nil {
		return 0, nil, fmt.Errorf("not an HTTP answer: %.60q", line)
	}
	for {
		h, err := br.ReadString('\n')
		if err != nil {
			return 0, nil, fmt.Errorf("truncated answer: %w", err)
		}
		if strings.TrimRight(h, "\r\n") == "" {
			break
		}
	}
	out, err := io.ReadAll(br)
	return status, out, err
}
