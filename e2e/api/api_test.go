package api_test

import (
	"archive/tar"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/gorilla/websocket"
	"github.com/mark3labs/mcp-go/client"
	"github.com/mark3labs/mcp-go/client/transport"
	mcpgo "github.com/mark3labs/mcp-go/mcp"

	"github.com/IniZio/nexus/gateway/httpapi"
	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
)

// box is the one sandbox of the package; its name's slash travels as %2F.
const box = "api/box"

var boxPath = "/v1/sandboxes/" + url.PathEscape(box)

type reply struct {
	status int
	body   []byte
	header http.Header
}

func (r reply) code() string {
	var eb httpapi.ErrorBody
	json.Unmarshal(r.body, &eb)
	return eb.Error.Code
}

func (r reply) decode(t *testing.T, v any) {
	t.Helper()
	if err := json.Unmarshal(r.body, v); err != nil {
		t.Fatalf("%s: %v", r.body, err)
	}
}

// call sends one request with token (none when empty); hdr are header pairs ("Host" sets the
// request's Host).
func call(t *testing.T, token, method, path string, body io.Reader, hdr ...string) reply {
	t.Helper()
	req, err := http.NewRequest(method, base+path, body)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	for i := 0; i+1 < len(hdr); i += 2 {
		if hdr[i] == "Host" {
			req.Host = hdr[i+1]
		} else {
			req.Header.Set(hdr[i], hdr[i+1])
		}
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		t.Fatalf("%s %s: %v", method, path, err)
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(resp.Body)
	return reply{status: resp.StatusCode, body: b, header: resp.Header}
}

func jsonBody(v any) io.Reader {
	b, _ := json.Marshal(v)
	return bytes.NewReader(b)
}

func must(t *testing.T, r reply, status int) reply {
	t.Helper()
	if r.status != status {
		t.Fatalf("status %d, want %d: %s", r.status, status, r.body)
	}
	return r
}

// TestAPI is every surface of the API on one sandbox.
func TestAPI(t *testing.T) {
	write, read := tokens["write"], tokens["read"]

	t.Run("refused", func(t *testing.T) {
		for _, c := range []struct {
			name, token string
			hdr         []string
			status      int
		}{
			{"no token", "", nil, 401},
			{"bad token", httpapi.TokenPrefix + strings.Repeat("ab", 32), nil, 401},
			{"foreign origin", read, []string{"Origin", "https://evil.example"}, 403},
			{"rebound host", read, []string{"Host", "rebind.evil.example"}, 403},
		} {
			r := call(t, c.token, "GET", "/v1/sandboxes", nil, c.hdr...)
			if r.status != c.status || r.code() != "refused" {
				t.Errorf("%s: %d %s", c.name, r.status, r.body)
			}
		}
		r := call(t, read, "POST", "/v1/sandboxes", jsonBody(map[string]any{"name": box, "image": "nexus-mini", "agent": "codex"}))
		if r.status != 403 || !strings.Contains(string(r.body), "needs scope write") {
			t.Errorf("create with a read token: %d %s", r.status, r.body)
		}
		r = call(t, write, "POST", "/v1/sandboxes", jsonBody(map[string]any{"name": box, "image": "nexus-mini", "agent": "codex", "mounts": []string{"/etc:/mnt"}}))
		if r.status != 403 || !strings.Contains(string(r.body), "needs scope admin") {
			t.Errorf("create with a host mount and a write token: %d %s", r.status, r.body)
		}
		// A foreign page's WebSocket never reaches the exec.
		d := websocket.Dialer{}
		hdr := http.Header{"Authorization": {"Bearer " + write}, "Origin": {"https://evil.example"}}
		_, resp, err := d.Dial(strings.Replace(base, "http", "ws", 1)+boxPath+"/exec/ws?argv=true", hdr)
		if err == nil || resp == nil || resp.StatusCode != 403 {
			t.Errorf("cross-site WebSocket: %v %v", err, resp)
		}
	})
	if t.Failed() {
		return
	}

	var sb struct {
		Name  string `json:"name"`
		State string `json:"state"`
	}
	must(t, call(t, write, "POST", "/v1/sandboxes", jsonBody(map[string]any{
		"name": box, "image": "nexus-mini", "memory_mib": 256, "agent": "codex", "labels": map[string]string{"nexus-test": "1"},
	})), 201).decode(t, &sb)
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", box) })
	if sb.Name != box || sb.State != "running" {
		t.Fatalf("created %+v", sb)
	}
	if r := call(t, write, "POST", "/v1/sandboxes", jsonBody(map[string]any{"name": box, "image": "nexus-mini", "agent": "codex"})); r.status != 409 || r.code() != "conflict" {
		t.Errorf("a second create of %s: %d %s", box, r.status, r.body)
	}
	var list struct {
		Sandboxes []struct{ Name string } `json:"sandboxes"`
	}
	must(t, call(t, read, "GET", "/v1/sandboxes?selector=nexus-test%3D1", nil), 200).decode(t, &list)
	if len(list.Sandboxes) != 1 || list.Sandboxes[0].Name != box {
		t.Errorf("list by selector: %+v", list)
	}

	t.Run("exec", func(t *testing.T) {
		var res struct {
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout"`
			Stderr   string `json:"stderr"`
		}
		must(t, call(t, write, "POST", boxPath+"/exec", jsonBody(map[string]any{
			"argv": []string{"sh", "-c", "echo out; cat >&2; exit 3"}, "stdin": "err\n",
		})), 200).decode(t, &res)
		if res.ExitCode != 3 || res.Stdout != "out\n" || res.Stderr != "err\n" {
			t.Errorf("exec: %+v", res)
		}
		if r := call(t, write, "POST", "/v1/sandboxes/nope/exec", jsonBody(map[string]any{"argv": []string{"true"}})); r.status != 404 || r.code() != "not_found" {
			t.Errorf("exec in a missing sandbox: %d %s", r.status, r.body)
		}
		if r := call(t, read, "POST", boxPath+"/exec", jsonBody(map[string]any{"argv": []string{"true"}})); r.status != 403 {
			t.Errorf("exec with a read token: %d %s", r.status, r.body)
		}
	})

	t.Run("exec websocket", func(t *testing.T) {
		ws := dialExec(t, write, url.Values{"argv": {"sh", "-c", "cat; echo bye >&2; exit 7"}, "stdin": {"true"}})
		ws.WriteMessage(websocket.BinaryMessage, append([]byte{httpapi.ChanStdin}, "hello"...))
		ws.WriteJSON(httpapi.WSControl{Type: "stdin_close"})
		out, errOut, exit := readExec(t, ws, nil)
		if out != "hello" || errOut != "bye\n" || exit.Type != "exit" || exit.ExitCode != 7 {
			t.Errorf("websocket exec: %q %q %+v", out, errOut, exit)
		}
	})

	t.Run("exec websocket pty resize", func(t *testing.T) {
		ws := dialExec(t, write, url.Values{"argv": {"sh", "-c", "stty size; while read x; do stty size; done"}, "stdin": {"true"}, "tty": {"true"}, "rows": {"30"}, "cols": {"90"}})
		var seen strings.Builder
		out, _, exit := readExec(t, ws, func(chunk string) bool {
			seen.WriteString(chunk)
			switch {
			case strings.Contains(seen.String(), "40 100"):
				ws.WriteJSON(httpapi.WSControl{Type: "kill"})
				return true
			case strings.Contains(seen.String(), "30 90"):
				ws.WriteJSON(httpapi.WSControl{Type: "resize", Rows: 40, Cols: 100})
				ws.WriteMessage(websocket.BinaryMessage, append([]byte{httpapi.ChanStdin}, '\r'))
			}
			return false
		})
		if !strings.Contains(out, "30 90") || !strings.Contains(out, "40 100") {
			t.Errorf("pty sizes: %q (%+v)", out, exit)
		}
	})

	t.Run("files", func(t *testing.T) {
		q := func(p string) string { return "?path=" + url.QueryEscape(p) }
		must(t, call(t, write, "POST", boxPath+"/files/mkdir"+q("/tmp/d/sub"), nil), 200)
		must(t, call(t, write, "PUT", boxPath+"/files/content"+q("/tmp/d/a b.txt")+"&mode=600", strings.NewReader("hello api")), 200)
		var fi httpapi.FileInfo
		must(t, call(t, read, "GET", boxPath+"/files/stat"+q("/tmp/d/a b.txt"), nil), 200).decode(t, &fi)
		if fi.Size != 9 || fi.Type != "file" || fi.Mode != 0o600 || fi.Name != "a b.txt" {
			t.Errorf("stat: %+v", fi)
		}
		var ls struct{ Entries []httpapi.FileInfo }
		must(t, call(t, read, "GET", boxPath+"/files"+q("/tmp/d"), nil), 200).decode(t, &ls)
		names := map[string]string{}
		for _, e := range ls.Entries {
			names[e.Name] = e.Type
		}
		if len(names) != 2 || names["a b.txt"] != "file" || names["sub"] != "dir" {
			t.Errorf("list: %+v", ls.Entries)
		}
		if r := must(t, call(t, read, "GET", boxPath+"/files/content"+q("/tmp/d/a b.txt"), nil), 200); string(r.body) != "hello api" {
			t.Errorf("download: %q", r.body)
		}
		r := must(t, call(t, read, "GET", boxPath+"/files/tar"+q("/tmp/d"), nil), 200)
		tarNames := map[string]string{}
		tr := tar.NewReader(bytes.NewReader(r.body))
		for {
			h, err := tr.Next()
			if err != nil {
				if !errors.Is(err, io.EOF) {
					t.Fatalf("tar: %v", err)
				}
				break
			}
			b, _ := io.ReadAll(tr)
			tarNames[strings.TrimPrefix(h.Name, "./")] = string(b)
		}
		if tarNames["a b.txt"] != "hello api" {
			t.Errorf("tar of /tmp/d: %v", tarNames)
		}
		must(t, call(t, write, "PUT", boxPath+"/files/tar"+q("/tmp/e"), bytes.NewReader(r.body)), 200)
		if r := must(t, call(t, read, "GET", boxPath+"/files/content"+q("/tmp/e/a b.txt"), nil), 200); string(r.body) != "hello api" {
			t.Errorf("the unpacked tar: %q", r.body)
		}
		if r := call(t, write, "DELETE", boxPath+"/files"+q("/tmp/d"), nil); r.status != 409 {
			t.Errorf("remove of a directory without recursive: %d %s", r.status, r.body)
		}
		must(t, call(t, write, "DELETE", boxPath+"/files"+q("/tmp/d")+"&recursive=true", nil), 200)
		if r := call(t, read, "GET", boxPath+"/files/stat"+q("/tmp/d"), nil); r.status != 404 || r.code() != "not_found" {
			t.Errorf("stat of a removed directory: %d %s", r.status, r.body)
		}
		if r := call(t, read, "PUT", boxPath+"/files/content"+q("/tmp/x"), strings.NewReader("x")); r.status != 403 {
			t.Errorf("upload with a read token: %d %s", r.status, r.body)
		}
		if r := call(t, read, "GET", boxPath+"/files/stat?path=relative", nil); r.status != 400 {
			t.Errorf("a relative path: %d %s", r.status, r.body)
		}
	})

	t.Run("logs and audit", func(t *testing.T) {
		var logs struct {
			Data       []byte `json:"data"`
			NextOffset int64  `json:"next_offset"`
		}
		must(t, call(t, read, "GET", boxPath+"/logs", nil), 200).decode(t, &logs)
		if len(logs.Data) == 0 || logs.NextOffset == 0 {
			t.Errorf("logs: %d bytes, next %d", len(logs.Data), logs.NextOffset)
		}
		ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
		defer cancel()
		req, _ := http.NewRequestWithContext(ctx, "GET", base+boxPath+"/logs?follow=true", nil)
		req.Header.Set("Authorization", "Bearer "+read)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		line := make([]byte, 64)
		n, _ := io.ReadAtLeast(resp.Body, line, len("event: log"))
		resp.Body.Close()
		if resp.Header.Get("Content-Type") != "text/event-stream" || !strings.HasPrefix(string(line[:n]), "id: ") {
			t.Errorf("logs follow: %s %q", resp.Header.Get("Content-Type"), line[:n])
		}
		r := must(t, call(t, read, "GET", "/v1/audit?follow=false&sandbox="+url.QueryEscape(box), nil), 200)
		if r.header.Get("Content-Type") != "text/event-stream" {
			t.Errorf("audit: %s", r.header.Get("Content-Type"))
		}
		var eg struct{ Sandbox string }
		must(t, call(t, read, "GET", boxPath+"/egress", nil), 200).decode(t, &eg)
		if eg.Sandbox != box {
			t.Errorf("egress show: %+v", eg)
		}
	})

	t.Run("live egress", func(t *testing.T) {
		var ch struct {
			After []string `json:"after"`
			Live  bool     `json:"live"`
			Grant struct{ By string }
		}
		if r := call(t, write, "POST", boxPath+"/egress/allow", jsonBody(map[string]any{"host": "granted.example"})); r.status != 403 {
			t.Errorf("allow with a write token: %d %s", r.status, r.body)
		}
		must(t, call(t, tokens["admin"], "POST", boxPath+"/egress/allow", jsonBody(map[string]any{"host": "granted.example", "for": "10m"})), 200).decode(t, &ch)
		if !strings.Contains(strings.Join(ch.After, " "), "granted.example") || ch.Grant.By != "token e2e-admin via api" {
			t.Errorf("allow: %+v", ch)
		}
		if r := call(t, read, "POST", boxPath+"/egress/revoke", jsonBody(map[string]any{"host": "granted.example"})); r.status != 403 {
			t.Errorf("revoke with a read token: %d %s", r.status, r.body)
		}
		must(t, call(t, write, "POST", boxPath+"/egress/revoke", jsonBody(map[string]any{"host": "granted.example"})), 200).decode(t, &ch)
		if strings.Contains(strings.Join(ch.After, " "), "granted.example") {
			t.Errorf("revoke: %+v", ch)
		}
		var ex struct{ Decision string }
		must(t, call(t, read, "POST", boxPath+"/egress/explain", jsonBody(map[string]any{"method": "GET", "url": "https://granted.example/"})), 200).decode(t, &ex)
		if ex.Decision != "deny" {
			t.Errorf("explain after revoke: %+v", ex)
		}
		must(t, call(t, write, "POST", boxPath+"/egress/deny", jsonBody(map[string]any{"host": "denied.example", "for": "10m"})), 200).decode(t, &ch)
		if !strings.Contains(strings.Join(ch.After, " "), "!denied.example") {
			t.Errorf("deny: %+v", ch)
		}
		// The audit stream's filters: the sandbox's policy changes, then only its denials.
		sse := func(q string) string {
			return string(must(t, call(t, read, "GET", "/v1/audit?follow=false&sandbox="+url.QueryEscape(box)+q, nil), 200).body)
		}
		testutil.WaitFor(t, 20*time.Second, func() error {
			if all := sse("&since=1h"); !strings.Contains(all, `"host":"granted.example"`) || !strings.Contains(all, `"host":"denied.example"`) {
				return fmt.Errorf("the sandbox's audit lacks its policy changes: %s", all)
			}
			return nil
		})
		if denied := sse("&denied=true"); !strings.Contains(denied, `"host":"denied.example"`) || strings.Contains(denied, `"decision":"allow"`) {
			t.Errorf("audit with denied: %s", denied)
		}
	})

	t.Run("mcp", func(t *testing.T) {
		ctx := context.Background()
		c, err := client.NewStreamableHttpClient(base+"/mcp", transport.WithHTTPHeaders(map[string]string{"Authorization": "Bearer " + write}))
		if err != nil {
			t.Fatal(err)
		}
		defer c.Close()
		if err := c.Start(ctx); err != nil {
			t.Fatal(err)
		}
		init := mcpgo.InitializeRequest{}
		init.Params.ProtocolVersion = mcpgo.LATEST_PROTOCOL_VERSION
		init.Params.ClientInfo = mcpgo.Implementation{Name: "e2e", Version: "1"}
		if _, err := c.Initialize(ctx, init); err != nil {
			t.Fatal(err)
		}
		req := mcpgo.CallToolRequest{}
		req.Params.Name = "sandbox_exec"
		req.Params.Arguments = map[string]any{"name": box, "argv": []string{"echo", "via mcp"}}
		res, err := c.CallTool(ctx, req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := json.Marshal(res.StructuredContent)
		if res.IsError || !strings.Contains(string(b), `"stdout":"via mcp\n"`) {
			t.Errorf("sandbox_exec over /mcp: %v %s %+v", res.IsError, b, res.Content)
		}
	})

	t.Run("ports and images", func(t *testing.T) {
		var ports struct {
			Ports []struct {
				Sandbox string `json:"sandbox"`
			} `json:"ports"`
		}
		must(t, call(t, read, "GET", boxPath+"/ports", nil), 200).decode(t, &ports)
		for _, p := range ports.Ports {
			if p.Sandbox != box {
				t.Errorf("%s's ports list another sandbox's: %+v", box, ports)
			}
		}
		must(t, call(t, read, "GET", "/v1/ports", nil), 200)
		var images struct {
			Images []struct {
				Name string `json:"name"`
			} `json:"images"`
		}
		must(t, call(t, read, "GET", "/v1/images", nil), 200).decode(t, &images)
		found := false
		for _, im := range images.Images {
			found = found || im.Name == "nexus-mini"
		}
		if !found {
			t.Errorf("GET /v1/images lacks nexus-mini, which %s runs: %+v", box, images)
		}
	})

	t.Run("dockerfile build and image rm", func(t *testing.T) {
		var buf bytes.Buffer
		tw := tar.NewWriter(&buf)
		for name, body := range map[string]string{"Dockerfile": "FROM nexus-mini\nARG GREETING\nCOPY hello.txt /opt/hello.txt\nENV GREETING=$GREETING\n", "hello.txt": "hello from the context\n"} {
			tw.WriteHeader(&tar.Header{Name: name, Typeflag: tar.TypeReg, Mode: 0o644, Size: int64(len(body))})
			tw.Write([]byte(body))
		}
		tw.Close()
		const tag = "api-built:1"
		if r := call(t, read, "POST", "/v1/builds/"+tag, bytes.NewReader(buf.Bytes())); r.status != 403 {
			t.Errorf("a build with a read token: %d %s", r.status, r.body)
		}
		r := must(t, call(t, write, "POST", "/v1/builds/"+tag+"?build_arg=GREETING%3Dhi", bytes.NewReader(buf.Bytes())), 200)
		t.Cleanup(func() { stack.Nexus(t, "image", "rm", "--force", tag) })
		if !strings.Contains(string(r.body), "api-built") || !strings.Contains(string(r.body), "GREETING=hi") {
			t.Errorf("built: %s", r.body)
		}
		if r := call(t, read, "DELETE", "/v1/images/"+tag, nil); r.status != 403 {
			t.Errorf("image rm with a read token: %d %s", r.status, r.body)
		}
		must(t, call(t, write, "DELETE", "/v1/images/"+tag, nil), 200)
		if r := must(t, call(t, read, "GET", "/v1/images", nil), 200); strings.Contains(string(r.body), "api-built") {
			t.Errorf("the removed image is still listed: %s", r.body)
		}
	})

	t.Run("snapshot and fork", func(t *testing.T) {
		must(t, call(t, write, "POST", boxPath+"/exec", jsonBody(map[string]any{"argv": []string{"sh", "-c", "printf from-parent > /root/origin"}})), 200)
		var snap struct {
			Name    string `json:"name"`
			Sandbox string `json:"sandbox"`
		}
		if r := call(t, read, "POST", boxPath+"/snapshots", jsonBody(map[string]any{"snapshot": "api-snap"})); r.status != 403 {
			t.Errorf("snapshot with a read token: %d %s", r.status, r.body)
		}
		must(t, call(t, write, "POST", boxPath+"/snapshots", jsonBody(map[string]any{"snapshot": "api-snap"})), 201).decode(t, &snap)
		t.Cleanup(func() { call(t, write, "DELETE", "/v1/snapshots/api-snap", nil) })
		if snap.Name != "api-snap" || snap.Sandbox != box {
			t.Fatalf("snapshot: %+v", snap)
		}
		var child struct {
			Name   string            `json:"name"`
			State  string            `json:"state"`
			Labels map[string]string `json:"labels"`
		}
		must(t, call(t, write, "POST", "/v1/forks", jsonBody(map[string]any{"source": "api-snap", "name": "api/child", "labels": map[string]string{"via": "api"}})), 201).decode(t, &child)
		t.Cleanup(func() { stack.Nexus(t, "rm", "--force", "api/child") })
		if child.Name != "api/child" || child.State != "running" || child.Labels["via"] != "api" {
			t.Fatalf("fork: %+v", child)
		}
		var res struct {
			ExitCode int    `json:"exit_code"`
			Stdout   string `json:"stdout"`
		}
		must(t, call(t, write, "POST", "/v1/sandboxes/"+url.PathEscape("api/child")+"/exec", jsonBody(map[string]any{"argv": []string{"cat", "/root/origin"}})), 200).decode(t, &res)
		if res.ExitCode != 0 || res.Stdout != "from-parent" {
			t.Errorf("the fork's /root/origin: %+v", res)
		}
		var snaps struct {
			Snapshots []struct {
				Name     string   `json:"name"`
				Children []string `json:"children"`
			} `json:"snapshots"`
		}
		must(t, call(t, read, "GET", "/v1/snapshots", nil), 200).decode(t, &snaps)
		if len(snaps.Snapshots) != 1 || snaps.Snapshots[0].Name != "api-snap" || len(snaps.Snapshots[0].Children) != 1 || snaps.Snapshots[0].Children[0] != "api/child" {
			t.Errorf("snapshots: %+v", snaps)
		}
		must(t, call(t, write, "DELETE", "/v1/sandboxes/"+url.PathEscape("api/child"), nil), 200)
		must(t, call(t, write, "DELETE", "/v1/snapshots/api-snap", nil), 200)
	})

	t.Run("sdks", func(t *testing.T) { testSDKs(t, write) })

	must(t, call(t, write, "DELETE", boxPath, nil), 200)
	if r := call(t, read, "GET", boxPath, nil); r.status != 404 {
		t.Errorf("get after remove: %d %s", r.status, r.body)
	}
	// The remove is audited on the audit stream with the token's name (not its secret), apart
	// from the egress decisions.
	var del audit.Event
	testutil.WaitFor(t, 30*time.Second, func() error {
		out, _, code := stack.Nexus(t, "audit", "tail", "--api", "--token", "e2e-write", "--json")
		if code != 0 {
			return fmt.Errorf("audit tail --api: exit %d", code)
		}
		for _, line := range strings.Split(strings.TrimSpace(out), "\n") {
			var ev audit.Event
			if json.Unmarshal([]byte(line), &ev) == nil && ev.Rule == "DELETE /v1/sandboxes/{name}" && ev.Name == box {
				del = ev
				return nil
			}
		}
		return fmt.Errorf("no audited DELETE of %s in %d lines", box, strings.Count(out, "\n"))
	})
	if del.Layer != audit.LayerAPI || del.Token != "e2e-write" || del.Method != "DELETE" || del.Status != 200 || del.Decision != audit.Allow {
		t.Errorf("the remove's audit event: %+v", del)
	}
	egress, _, _ := stack.Nexus(t, "audit", "tail", "--json")
	if strings.Contains(egress, `"layer":"api"`) {
		t.Error("nexus audit tail (egress decisions) prints API requests")
	}
	for _, secret := range tokens {
		if strings.Contains(egress+stack.Log(), secret) {
			t.Error("a token secret is in the audit stream or the stack's log")
		}
	}
	if _, err := os.Stat(filepath.Join(string(stack.Home), "api", "requests.log")); err == nil {
		t.Error("the API still writes $NEXUS_HOME/api/requests.log")
	}
}

func dialExec(t *testing.T, token string, q url.Values) *websocket.Conn {
	t.Helper()
	d := websocket.Dialer{HandshakeTimeout: 30 * time.Second}
	ws, resp, err := d.Dial(strings.Replace(base, "http", "ws", 1)+boxPath+"/exec/ws?"+q.Encode(), http.Header{"Authorization": {"Bearer " + token}})
	if err != nil {
		body := ""
		if resp != nil {
			b, _ := io.ReadAll(resp.Body)
			body = fmt.Sprintf("%d %s", resp.StatusCode, b)
		}
		t.Fatalf("dial exec: %v %s", err, body)
	}
	t.Cleanup(func() { ws.Close() })
	return ws
}

// readExec reads the socket to its last message; onStdout, when set, sees each stdout chunk
// and ends the read when it returns true.
func readExec(t *testing.T, ws *websocket.Conn, onStdout func(string) bool) (string, string, httpapi.WSControl) {
	t.Helper()
	var out, errOut strings.Builder
	ws.SetReadDeadline(time.Now().Add(time.Minute))
	for {
		kind, data, err := ws.ReadMessage()
		if err != nil {
			return out.String(), errOut.String(), httpapi.WSControl{Type: "closed", Error: err.Error()}
		}
		switch {
		case kind == websocket.BinaryMessage && len(data) > 0 && data[0] == httpapi.ChanStdout:
			out.Write(data[1:])
			if onStdout != nil && onStdout(string(data[1:])) {
				onStdout = nil
			}
		case kind == websocket.BinaryMessage && len(data) > 0 && data[0] == httpapi.ChanStderr:
			errOut.Write(data[1:])
		case kind == websocket.TextMessage:
			var m httpapi.WSControl
			json.Unmarshal(data, &m)
			return out.String(), errOut.String(), m
		}
	}
}
