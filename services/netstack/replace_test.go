package netstack_test

import (
	"context"
	"os"
	"testing"

	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/services/netstack"
)

// A sandbox's network is set up again on every boot: the network a failed VM left behind is
// replaced by the new spec (its own socket and policy), never refused as "already exists".
func TestReplaceNetworkOfAFailedBoot(t *testing.T) {
	e := newEnv(t, curated(t))
	sock := shortSocket(t)
	info, err := e.svc.ReplaceNetwork(context.Background(), netstack.Spec{
		SandboxID: sandboxID, SandboxName: "default/test", SocketPath: sock, ProxyToken: proxyToken,
		Policy: netstackapi.Policy{Mode: "none"},
	})
	if err != nil {
		t.Fatalf("replace: %v", err)
	}
	if info.Mode != "none" {
		t.Fatalf("the replaced network has mode %q", info.Mode)
	}
	if _, err := os.Stat(e.sock); !os.IsNotExist(err) {
		t.Fatalf("the old network's socket is left: %v", err)
	}
	if len(e.svc.List()) != 1 {
		t.Fatalf("%d networks for one sandbox", len(e.svc.List()))
	}
}
