package vmm

import (
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// healthVM is a VM whose driver reports disk errors and an exit reason.
type healthVM struct {
	hypervisor.VM
	disk hypervisor.DiskErrors
	exit string
}

func (v healthVM) DiskErrors() hypervisor.DiskErrors { return v.disk }
func (v healthVM) ExitReason() string                { return v.exit }
func (v healthVM) Containment() string               { return "contained" }

// A VM that had to stop because the host disk filled says "host disk full" with the free space
// and the failed writes, never the generic "hung" (issue 19); an exit reason the driver knows
// (out of memory) wins; without either the generic reason stays.
func TestFailedVMOnFullHostDiskSaysSo(t *testing.T) {
	const hung = "the guest stopped answering its heartbeat (hung or panicked)"
	dir := home.Dir(t.TempDir())
	for _, c := range []struct {
		name      string
		vm        healthVM
		watermark home.Watermark
		want      []string
	}{
		{"guest writes failed with ENOSPC", healthVM{disk: hypervisor.DiskErrors{Count: 3, NoSpace: 3, Last: "No space left on device"}}, home.Watermark{},
			[]string{home.ErrDiskFull, "3 guest disk writes failed with no space left", "the VM was stopped"}},
		{"home below the watermark", healthVM{}, home.Watermark{Percent: 100},
			[]string{home.ErrDiskFull, string(dir), "the VM was stopped"}},
		{"out of memory", healthVM{exit: "out of memory (limit 600 MiB)", disk: hypervisor.DiskErrors{NoSpace: 1}}, home.Watermark{Percent: 100},
			[]string{"out of memory (limit 600 MiB)"}},
		{"nothing known", healthVM{}, home.Watermark{}, []string{hung}},
	} {
		t.Run(c.name, func(t *testing.T) {
			s := &Service{cfg: Config{Home: dir, MinFreeDisk: c.watermark}}
			got := s.whyFailed(&machine{vm: c.vm}, hung)
			for _, w := range c.want {
				if !strings.Contains(got, w) {
					t.Errorf("reason %q; want it to say %q", got, w)
				}
			}
			if c.want[0] != hung && strings.Contains(got, "hung") {
				t.Errorf("reason %q says hung", got)
			}
		})
	}
}
