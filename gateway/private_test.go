package gateway

import (
	"errors"
	"slices"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/profile"
)

// TestPlanAllowPrivate: --allow-private and the config's egress.allow_private are validated,
// normalised, merged and recorded, so that every later boot (planFromRecord) keeps them.
func TestPlanAllowPrivate(t *testing.T) {
	now := time.Now()
	none := storedSecrets(func(string) ([]string, bool) { return nil, false })
	cfg, err := config.Parse("c.yaml", []byte("version: 1\negress:\n  allow: [db.internal:5432]\n  allow_private: [100.64.0.0/10, 10.20.0.0/16]\n"))
	if err != nil {
		t.Fatal(err)
	}
	p, err := planEgress(api.CreateRequest{AllowHosts: []string{"db.internal:5432"}, AllowPrivate: []string{"10.20.3.4/16"}, Config: cfg}, profile.Default(), now, none)
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.20.0.0/16", "100.64.0.0/10"}; !slices.Equal(p.egress.AllowPrivate, want) {
		t.Errorf("allow private = %v, want %v", p.egress.AllowPrivate, want)
	}
	sb := &api.Sandbox{Name: "default/x", Egress: p.egress}
	again, err := planFromRecord(sb)
	if err != nil || !slices.Equal(again.egress.AllowPrivate, p.egress.AllowPrivate) {
		t.Errorf("planFromRecord: %v, %v", again.egress.AllowPrivate, err)
	}
	for _, bad := range []string{"0.0.0.0/0", "8.8.8.8/32", "10.0.0.0/33"} {
		_, err := planEgress(api.CreateRequest{AllowPrivate: []string{bad}}, profile.Default(), now, none)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.HasPrefix(err.Error(), "invalid --allow-private ") {
			t.Errorf("--allow-private %s: %v", bad, err)
		}
	}
}
