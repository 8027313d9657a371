package mcp

import (
	"strings"
	"testing"

	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

// TestSandboxRunImageDefaults: sandbox_run with argv [] runs the image's Entrypoint and Cmd, and
// is refused, before any sandbox is made, for an image that has neither.
func TestSandboxRunImageDefaults(t *testing.T) {
	st := newStack(t, true)
	st.vmm.mu.Lock()
	st.vmm.images["app:1"] = vmmapi.ImageInfo{Name: "app", Entrypoint: []string{"echo"}, Cmd: []string{"from", "the image"}}
	st.vmm.images["nexus-mini"] = vmmapi.ImageInfo{Name: "nexus-mini"}
	st.vmm.mu.Unlock()
	var r ExecResult
	st.ok(t, "sandbox_run", map[string]any{"image": "app:1", "argv": []string{}}, &r)
	if r.ExitCode != 0 || r.Stdout != "from the image\n" {
		t.Errorf("run of the image's entrypoint and cmd: %+v", r)
	}
	requireNoSandboxes(t, st)
	msg, _ := st.fails(t, "sandbox_run", map[string]any{"image": "nexus-mini", "argv": []string{}})
	if !strings.Contains(msg, "has no Entrypoint or Cmd") {
		t.Errorf("argv [] on an image without defaults: %q", msg)
	}
	requireNoSandboxes(t, st)
	// A given argv replaces both, as nexus exec's does.
	st.ok(t, "sandbox_run", map[string]any{"image": "app:1", "argv": []string{"echo", "mine"}}, &r)
	if r.Stdout != "mine\n" {
		t.Errorf("run with argv: %+v", r)
	}
}
