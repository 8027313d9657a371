package mitm

import (
	"context"
	"errors"
	"testing"

	"github.com/IniZio/nexus/internal/testutil"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// TestSetHostsKeepsTheRestAndSurvivesRestart: a live grant or deny replaces only the hosts of a
// registered sandbox (its token and credentials stay), a deny beats a wildcard allow, and the
// next run serves the changed hosts.
func TestSetHostsKeepsTheRestAndSurvivesRestart(t *testing.T) {
	h := home.Dir(t.TempDir())
	s := newTestService(t, h, &testutil.SyncBuffer{})
	pol := mitmapi.SandboxPolicy{ID: "sb-live", TokenHash: mitmapi.HashHex(testToken), AllowedHosts: []string{"api.example.com"},
		Credentials: []mitmapi.CredentialBinding{{PlaceholderHash: mitmapi.HashHex(placeholder), Hosts: []string{"api.example.com"}}}}
	if err := s.register(pol); err != nil {
		t.Fatal(err)
	}
	if err := s.setHosts(mitmapi.SetHostsRequest{ID: "sb-live", AllowedHosts: []string{"api.example.com", "*.granted.test"},
		DeniedHosts: []string{"bad.granted.test"}}); err != nil {
		t.Fatal(err)
	}
	for _, svc := range []*Service{s, newTestService(t, h, &testutil.SyncBuffer{})} {
		sb, err := svc.reg.Lookup(context.Background(), "sb-live")
		if err != nil {
			t.Fatal(err)
		}
		if !sb.tokenOK(testToken) {
			t.Fatal("the token was lost")
		}
		if _, ok := sb.placeholder(placeholder); !ok {
			t.Fatal("the credential binding was lost")
		}
		if !sb.AllowsHost("docs.granted.test") || sb.AllowsHost("bad.granted.test") || !sb.AllowsHost("api.example.com") {
			t.Fatal("the granted and denied hosts are not served")
		}
	}
	if err := s.setHosts(mitmapi.SetHostsRequest{ID: "sb-unknown"}); !errors.Is(err, errdefs.ErrNotFound) {
		t.Fatalf("an unknown sandbox: %v", err)
	}
	if err := s.setHosts(mitmapi.SetHostsRequest{ID: "sb-live", AllowedHosts: []string{"bad host"}}); err == nil {
		t.Fatal("an invalid host was accepted")
	}
}
