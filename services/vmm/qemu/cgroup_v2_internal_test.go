package qemu

import (
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"
)

// fakeV2 is a unified hierarchy in a temporary directory offering controllers, for the v2 path
// of newCgroup: this host's controllers are all on v1 hierarchies, so a real v2 cgroup with
// limits cannot be made here.
func fakeV2(t *testing.T, controllers string) string {
	t.Helper()
	old := cgroupRoot
	cgroupRoot = t.TempDir()
	t.Cleanup(func() { cgroupRoot = old })
	own, err := ownV2Group()
	if err != nil {
		t.Skip(err)
	}
	parent := filepath.Join(cgroupRoot, own)
	if err := os.MkdirAll(parent, 0o755); err != nil {
		t.Fatal(err)
	}
	for _, d := range []string{cgroupRoot, parent} {
		os.WriteFile(filepath.Join(d, "cgroup.subtree_control"), nil, 0o644)
	}
	if err := os.WriteFile(filepath.Join(cgroupRoot, "cgroup.controllers"), []byte(controllers+"\n"), 0o444); err != nil {
		t.Fatal(err)
	}
	return cgroupRoot
}

// TestCgroupV2Limits: on a unified hierarchy a VM's cgroup is <the vmm's group>/nexus-vm-<id>-<hash>
// with memory.max (no swap), cpu.max from the quota, pids.max and io.max for the disk's device,
// and the OOM reason and limit are read from its memory.events and memory.max.
func TestCgroupV2Limits(t *testing.T) {
	root := fakeV2(t, "cpuset cpu io memory hugetlb pids")
	own, _ := ownV2Group()
	name := cgroupName("sb-1", "/home/x/sandboxes/sb-1")
	dir := filepath.Join(root, own, name)
	if !strings.HasPrefix(name, "nexus-vm-sb-1-") {
		t.Errorf("the VM's group is named %s", name)
	}
	l := cgroupLimits{memoryMiB: 256 + overheadTCGMiB, cpuQuota: 150_000, pids: cgroupPidsMax,
		dev: &[2]int64{8, 16}, bps: 64 << 20, iops: 1000}
	cg, err := newCgroup(name, l)
	if err != nil {
		t.Fatal(err)
	}
	slices.Sort(cg.V2)
	if want := []string{"cpu", "io", "memory", "pids"}; !slices.Equal(cg.V2, want) {
		t.Fatalf("v2 controllers %v, want %v", cg.V2, want)
	}
	for _, c := range cg.V2 {
		if cg.Dirs[c] != dir {
			t.Errorf("%s is in %s, want %s", c, cg.Dirs[c], dir)
		}
	}
	read := func(f string) string {
		b, err := os.ReadFile(filepath.Join(dir, f))
		if err != nil {
			t.Fatal(err)
		}
		return strings.TrimSpace(string(b))
	}
	for f, want := range map[string]string{
		"memory.max":      "503316480", // (256+224) MiB
		"memory.swap.max": "0",
		"cpu.max":         "150000 100000",
		"pids.max":        "512",
	} {
		if got := read(f); got != want {
			t.Errorf("%s = %q, want %q", f, got, want)
		}
	}
	// The kernel takes io.max one line per write; the file here keeps the last of them.
	var lines []string
	for _, e := range l.ioMax() {
		lines = append(lines, e.String())
	}
	if want := []string{"8:16 rbps=67108864", "8:16 wbps=67108864", "8:16 riops=1000", "8:16 wiops=1000"}; !slices.Equal(lines, want) {
		t.Errorf("io.max lines %q, want %q", lines, want)
	}
	if got := read("io.max"); got != lines[len(lines)-1] {
		t.Errorf("io.max = %q, want the lines written", got)
	}
	if (cgroupLimits{}).ioMax() != nil {
		t.Errorf("a disk on no device (tmpfs) is throttled")
	}
	if got := read(filepath.Join("..", "cgroup.subtree_control")); !strings.Contains(got, "+memory") || !strings.Contains(got, "+pids") {
		t.Errorf("the parent does not delegate the controllers: %q", got)
	}

	vm := &VM{cg: cg}
	if r := vm.oomReason(); r != "" {
		t.Errorf("no OOM yet, but the reason is %q", r)
	}
	os.WriteFile(filepath.Join(dir, "memory.events"), []byte("low 0\nhigh 0\nmax 12\noom 1\noom_kill 1\n"), 0o644)
	if r, want := vm.oomReason(), "out of memory (limit 480 MiB)"; r != want {
		t.Errorf("reason %q, want %q", r, want)
	}
	os.WriteFile(filepath.Join(dir, "memory.max"), []byte("268435456\n"), 0o644) // an operator lowered it
	if r, want := vm.oomReason(), "out of memory (limit 256 MiB)"; r != want {
		t.Errorf("reason %q, want %q", r, want)
	}
}

// TestCgroupV2NoController: a unified hierarchy offering none of the controllers (this host's:
// hugetlb only) and no v1 ones gives no cgroup, and says so.
func TestCgroupV2NoController(t *testing.T) {
	fakeV2(t, "hugetlb")
	if cg, err := newCgroup("x", cgroupLimits{memoryMiB: 1}); err == nil || cg != nil {
		t.Fatalf("newCgroup = %+v, %v; want no cgroup and an error", cg, err)
	}
}

// TestCgroupV2LeavesServiceGroup: a vmm started in a group holding processes (a systemd
// service's) moves itself into <group>/nexus-vmm, since v2 gives the children of a group with
// processes no controller, and the VMs' groups go beside it, in <group>.
func TestCgroupV2LeavesServiceGroup(t *testing.T) {
	root := fakeV2(t, "cpu memory pids")
	self := filepath.Join(t.TempDir(), "cgroup")
	os.WriteFile(self, []byte("0::/system.slice/nexus.service\n"), 0o644)
	old := selfCgroup
	selfCgroup = self
	t.Cleanup(func() { selfCgroup = old })
	svc := filepath.Join(root, "system.slice", "nexus.service")
	os.MkdirAll(svc, 0o755)
	os.WriteFile(filepath.Join(svc, "cgroup.subtree_control"), nil, 0o644)
	os.WriteFile(filepath.Join(root, "system.slice", "cgroup.subtree_control"), nil, 0o644)
	os.WriteFile(filepath.Join(svc, "cgroup.procs"), []byte("4242\n"), 0o644)
	cg, err := newCgroup("nexus-vm-sb-1-x", cgroupLimits{memoryMiB: 480, cpuQuota: 100_000, pids: 512})
	if err != nil {
		t.Fatal(err)
	}
	if want := filepath.Join(svc, "nexus-vm-sb-1-x"); cg.Dirs["memory"] != want {
		t.Errorf("the VM's group is %s, want %s", cg.Dirs["memory"], want)
	}
	b, err := os.ReadFile(filepath.Join(svc, vmmLeaf, "cgroup.procs"))
	if err != nil || string(b) != strconv.Itoa(os.Getpid()) {
		t.Errorf("the vmm did not move into %s/%s: %q %v", svc, vmmLeaf, b, err)
	}
	// Once moved, its group is the leaf's parent and it does not move again.
	os.WriteFile(self, []byte("0::/system.slice/nexus.service/nexus-vmm\n"), 0o644)
	if p, err := vmsV2Parent(root); err != nil || p != "/system.slice/nexus.service" {
		t.Errorf("after the move, the VMs' parent is %q, %v", p, err)
	}
}
