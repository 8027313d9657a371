package vmm

import (
	"errors"
	"fmt"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

func admissionService(a Admission) *Service {
	return &Service{cfg: Config{Admission: a.withDefaults()}, vms: map[string]*machine{}, reserved: map[string]int{}}
}

// TestAdmitMemory: running VMs and boots under way count, with their overhead, against the
// host's share; a refusal gives the numbers, and a released reservation frees its room.
func TestAdmitMemory(t *testing.T) {
	s := admissionService(Admission{HostMemoryMiB: 4000, HostCores: 2, MemoryShare: 0.5}) // 2000 MiB for sandboxes
	s.vms["sb-run"] = &machine{id: "sb-run", vm: &fakeVM{spec: hypervisor.Spec{MemoryMiB: 1024 - VMOverheadMiB}}}
	// 1024 are taken; 512+overhead more fit, and then nothing of 512.
	release, err := s.admit("sb-a", 512, 1)
	if err != nil {
		t.Fatalf("a 512 MiB sandbox next to 1024 MiB used of 2000: %v", err)
	}
	_, err = s.admit("sb-b", 512, 1)
	if !errors.Is(err, errdefs.ErrRefused) {
		t.Fatalf("a second 512 MiB sandbox: %v, want refused", err)
	}
	held := fmt.Sprintf("2 sandboxes hold %d MiB", 1024+512+VMOverheadMiB)
	for _, want := range []string{"512 MiB sandbox", "2000 MiB (50% of 4000 MiB)", held, "--memory-share"} {
		if !strings.Contains(err.Error(), want) {
			t.Errorf("refusal %q does not say %q", err, want)
		}
	}
	release()
	if release, err := s.admit("sb-b", 512, 1); err != nil {
		t.Fatalf("after the first boot's reservation was released: %v", err)
	} else {
		release()
	}
	if _, err := s.admit("sb-huge", 200000, 1); !errors.Is(err, errdefs.ErrRefused) {
		t.Fatalf("--memory 200000 on a 4000 MiB host: %v, want refused", err)
	}
}

// TestAdmitVCPUs: more vCPUs than cores is refused unless overcommit is configured.
func TestAdmitVCPUs(t *testing.T) {
	s := admissionService(Admission{HostMemoryMiB: 1 << 20, HostCores: 2})
	if _, err := s.admit("sb-a", 256, 64); !errors.Is(err, errdefs.ErrRefused) || !strings.Contains(err.Error(), "--vcpus 64 is more than this host's 2 cores") {
		t.Fatalf("--vcpus 64 on 2 cores: %v", err)
	}
	if _, err := s.admit("sb-a", 256, 2); err != nil {
		t.Fatalf("--vcpus 2 on 2 cores: %v", err)
	}
	s = admissionService(Admission{HostMemoryMiB: 1 << 20, HostCores: 2, VCPUOvercommit: true})
	if _, err := s.admit("sb-b", 256, 4); err != nil {
		t.Fatalf("--vcpus 4 on 2 cores with overcommit: %v", err)
	}
}

func TestHostMemory(t *testing.T) {
	if got := hostMemoryMiB(); got < 64 {
		t.Fatalf("MemTotal read as %d MiB", got)
	}
}
