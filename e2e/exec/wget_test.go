package exec_test

import (
	"strings"
	"testing"
)

// TestMiniHTTPClient: nexus-mini's wget fetches from a server in the same guest, with and without
// a timeout (Debian's busybox wget segfaulted on every -T, rc 139), and a timeout that passes is
// exit 4 with a sentence.
func TestMiniHTTPClient(t *testing.T) {
	const box = "exec/wget"
	stack.MustNexus(t, "create", box, "--image", "nexus-mini", "--memory", "256", "-l", "nexus-test=1")
	t.Cleanup(func() { stack.Nexus(t, "rm", "--force", box) })
	stack.MustNexus(t, "exec", box, "--", "sh", "-c", "mkdir -p /tmp/www && echo hello from the guest > /tmp/www/index.html && httpd -p 127.0.0.1:8080 -h /tmp/www")
	for _, args := range [][]string{
		{"-O-", "http://localhost:8080/"},
		{"-q", "-O-", "http://127.0.0.1:8080/index.html"},
		{"-T", "5", "-O-", "http://localhost:8080/"},
		{"-T5", "-q", "-O-", "http://localhost:8080/"},
		{"--timeout=5", "-O-", "http://localhost:8080/"},
	} {
		out, errOut, code := stack.Nexus(t, append([]string{"exec", box, "--", "wget"}, args...)...)
		if code != 0 || out != "hello from the guest\n" {
			t.Errorf("wget %v: exit %d, %q %q", args, code, out, strings.TrimSpace(errOut))
		}
	}
	// A server that accepts and never answers: the timeout ends the transfer.
	stack.MustNexus(t, "exec", box, "--", "sh", "-c", "setsid nc -l -p 8081 -e sleep 60 </dev/null >/dev/null 2>&1 &")
	_, errOut, code := stack.Nexus(t, "exec", box, "--", "wget", "-T", "2", "-O-", "http://127.0.0.1:8081/")
	if code != 4 || !strings.Contains(errOut, "wget: timed out after 2s") {
		t.Errorf("wget -T 2 against a server that never answers: exit %d, %q", code, errOut)
	}
}
