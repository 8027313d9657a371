package agent

import (
	"errors"
	"testing"

	"github.com/IniZio/nexus/pkg/agentproto"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// A MAC from the host is checked before any interface is touched: only a unicast six-byte one.
func TestConfigureInterfaceRefusesBadMAC(t *testing.T) {
	for _, mac := range []string{"nope", "03:00:00:00:00:01", "ff:ff:ff:ff:ff:ff", "02:00:00:00:00:00:00:01"} {
		err := ConfigureInterface("nexus-no-such-if", agentproto.NetworkConfig{Address: "192.168.127.2/24", MAC: mac})
		if !errors.Is(err, errdefs.ErrInvalid) {
			t.Errorf("mac %q: %v, want invalid", mac, err)
		}
	}
	// A good one gets as far as the interface.
	err := ConfigureInterface("nexus-no-such-if", agentproto.NetworkConfig{Address: "192.168.127.2/24", MAC: "02:6e:78:12:34:56"})
	if err == nil || errors.Is(err, errdefs.ErrInvalid) {
		t.Errorf("good mac: %v, want the missing interface", err)
	}
}
