package gateway

import (
	"context"
	"errors"
	"strings"
	"testing"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// A create's --disk-bps and --disk-iops outside their range are refused with the range, before
// anything is recorded.
func TestCreateDiskLimitsRange(t *testing.T) {
	g := &Service{}
	for _, c := range []struct {
		r    api.CreateRequest
		want string
	}{
		{api.CreateRequest{Name: "a", DiskBps: 1000}, "--disk-bps 1000 is out of range: 64 KiB to 64 GiB per second"},
		{api.CreateRequest{Name: "a", DiskBps: -1}, "--disk-bps -1 is out of range"},
		{api.CreateRequest{Name: "a", DiskIOPS: 5}, "--disk-iops 5 is out of range 10-1048576"},
		{api.CreateRequest{Name: "a", DiskIOPS: 2 << 20}, "--disk-iops 2097152 is out of range"},
	} {
		_, err := g.validate(context.Background(), c.r)
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%+v: %v, want %q", c.r, err, c.want)
		}
	}
}
