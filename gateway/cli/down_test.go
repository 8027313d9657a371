package cli

import (
	"encoding/json"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/micro"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
)

// TestDown: nexus down sends SIGTERM to every stack process on this host (here a stand-in
// service whose process is a sleep) and waits for it to end; with no stack it says so and
// succeeds.
func TestDown(t *testing.T) {
	st := newGatewayStack(t)
	sleep := exec.Command("sleep", "60")
	if err := sleep.Start(); err != nil {
		t.Fatal(err)
	}
	exited := make(chan struct{})
	go func() { sleep.Wait(); close(exited) }()
	t.Cleanup(func() { sleep.Process.Kill(); <-exited })
	admin := st.bus.Connect(t, bus.UserAdmin)
	svc, err := micro.AddService(admin, micro.Config{Name: bus.ServiceName("standin"), Version: "0.0.1",
		Metadata: map[string]string{bus.MetaHost: bus.LocalHost, bus.MetaPID: strconv.Itoa(sleep.Process.Pid)}})
	if err != nil {
		t.Fatal(err)
	}
	defer svc.Stop()
	out, errOut, code := st.exec(t, "down", "--json")
	var res DownResult
	if err := json.Unmarshal([]byte(out), &res); err != nil || code != 0 || !slices.Contains(res.PIDs, sleep.Process.Pid) || !slices.Contains(res.Services, "standin") {
		t.Fatalf("down --json: exit %d %s %s (%v)", code, out, errOut, err)
	}
	select {
	case <-exited:
	case <-time.After(10 * time.Second):
		t.Fatal("the stand-in's process still runs after nexus down")
	}
	root := NewRoot()
	home := testutil.IsolateHome(t)
	var stderr strings.Builder
	root.SetErr(&stderr)
	root.SetArgs([]string{"--home", home, "down"})
	if code := Execute(root); code != 0 || !strings.Contains(stderr.String(), "nothing to stop") {
		t.Errorf("down with no stack: exit %d, %q", code, stderr.String())
	}
}
