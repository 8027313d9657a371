package vmm

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	api "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
	"github.com/IniZio/nexus/services/vmm/kernel"
)

// fakeSteps are n steps s1…sn that log their runs and undos; step fail fails with err, and the
// steps in skip have nothing to do.
func fakeSteps(n, fail int, err error, skip map[int]bool, log *[]string) []bootStep {
	var steps []bootStep
	for i := 1; i <= n; i++ {
		name := fmt.Sprintf("s%d", i)
		steps = append(steps, bootStep{
			name: name,
			run: func(*boot, context.Context) error {
				*log = append(*log, "run "+name)
				switch {
				case i == fail:
					return err
				case skip[i]:
					return errSkip
				}
				return nil
			},
			undo: func(*boot) { *log = append(*log, "undo "+name) },
		})
	}
	return steps
}

func TestRunStepsUndoesInReverse(t *testing.T) {
	boom := errors.New("boom")
	for k := 1; k <= 4; k++ {
		t.Run(fmt.Sprintf("fail at s%d", k), func(t *testing.T) {
			var log, finished []string
			err := runSteps(context.Background(), "start", fakeSteps(4, k, boom, nil, &log), &boot{}, func(s string) { finished = append(finished, s) })
			var want, wantFinished []string
			for i := 1; i <= k; i++ {
				want = append(want, fmt.Sprintf("run s%d", i))
			}
			for i := k - 1; i >= 1; i-- {
				want = append(want, fmt.Sprintf("undo s%d", i))
				wantFinished = append([]string{fmt.Sprintf("s%d", i)}, wantFinished...)
			}
			if !reflect.DeepEqual(log, want) {
				t.Errorf("ran %q, want %q", log, want)
			}
			if !reflect.DeepEqual(finished, wantFinished) {
				t.Errorf("reported %q, want %q", finished, wantFinished)
			}
			if wantErr := fmt.Sprintf("start: s%d: boom", k); err == nil || err.Error() != wantErr || !errors.Is(err, boom) {
				t.Errorf("error %v, want %q wrapping the step's error", err, wantErr)
			}
		})
	}
}

func TestRunStepsSkipped(t *testing.T) {
	var log, finished []string
	steps := fakeSteps(4, 0, nil, map[int]bool{2: true}, &log)
	if err := runSteps(context.Background(), "fork", steps, &boot{}, func(s string) { finished = append(finished, s) }); err != nil {
		t.Fatal(err)
	}
	if want := []string{"s1", "s3", "s4"}; !reflect.DeepEqual(finished, want) {
		t.Errorf("reported %q, want %q: a skipped step is not reported", finished, want)
	}
	// A skipped step did nothing, so a later failure does not undo it.
	log = nil
	err := runSteps(context.Background(), "fork", fakeSteps(4, 4, errors.New("boom"), map[int]bool{2: true}, &log), &boot{}, func(string) {})
	if want := []string{"run s1", "run s2", "run s3", "run s4", "undo s3", "undo s1"}; !reflect.DeepEqual(log, want) {
		t.Errorf("ran %q, want %q", log, want)
	}
	if err == nil || err.Error() != "fork: s4: boom" {
		t.Errorf("error %v, want fork: s4: boom", err)
	}
}

func TestRunStepsKeepsUserErrors(t *testing.T) {
	// Invalid and conflict errors are a sentence for the user already: no step prefix.
	for _, err := range []error{errdefs.Invalid("volume name %q must be unique", "x"), errdefs.Conflict("sandbox a already has a disk")} {
		var log []string
		got := runSteps(context.Background(), "start", fakeSteps(3, 2, err, nil, &log), &boot{}, func(string) {})
		if got == nil || got.Error() != err.Error() {
			t.Errorf("error %v, want %v as it is", got, err)
		}
		if want := []string{"run s1", "run s2", "undo s1"}; !reflect.DeepEqual(log, want) {
			t.Errorf("ran %q, want %q", log, want)
		}
	}
}

// The step names are what the create progress bar and errors show: users and scripts see them.
func TestBootStepNames(t *testing.T) {
	names := func(steps []bootStep) (out []string) {
		for _, st := range steps {
			out = append(out, st.name)
		}
		return out
	}
	if got, want := names(coldBoot), []string{"kernel", "initramfs", "image", "disk", "volumes", "qemu", "agent", "configure", "mounts", "files"}; !reflect.DeepEqual(got, want) {
		t.Errorf("cold boot steps %q, want %q", got, want)
	}
	if got, want := names(restoreBoot), []string{"kernel", "initramfs", "disk", "volumes", "restore", "agent", "configure", "mounts", "files"}; !reflect.DeepEqual(got, want) {
		t.Errorf("restore steps %q, want %q", got, want)
	}
	// Every step after the VM is running must be able to fail without leaving QEMU behind.
	for _, list := range [][]bootStep{coldBoot, restoreBoot} {
		for _, st := range list {
			if (st.name == "qemu" || st.name == "restore") && st.undo == nil {
				t.Errorf("step %s starts a VM but has no undo", st.name)
			}
		}
	}
}

// fakeDriver starts fakeVMs that never answer as a guest.
type fakeDriver struct{ vms []*fakeVM }

func (d *fakeDriver) Start(ctx context.Context, spec hypervisor.Spec) (hypervisor.VM, error) {
	vm := &fakeVM{spec: spec, done: make(chan struct{})}
	d.vms = append(d.vms, vm)
	vm.log = append(vm.log, "start")
	return vm, nil
}

func (d *fakeDriver) Restore(ctx context.Context, spec hypervisor.Spec, state string) (hypervisor.VM, error) {
	return nil, errors.New("fake: no restore")
}

func (d *fakeDriver) Adopt(ctx context.Context, dir string) (hypervisor.VM, error) {
	return nil, errdefs.NotFound("fake: nothing to adopt")
}

type fakeVM struct {
	spec hypervisor.Spec
	done chan struct{}
	log  []string
}

func (v *fakeVM) Pid() int                                        { return 4242 }
func (v *fakeVM) Accel() string                                   { return "tcg" }
func (v *fakeVM) Started() time.Time                              { return time.Time{} }
func (v *fakeVM) Spec() hypervisor.Spec                           { return v.spec }
func (v *fakeVM) RAMPath() string                                 { return "" }
func (v *fakeVM) Done() <-chan struct{}                           { return v.done }
func (v *fakeVM) Pause(context.Context) error                     { return nil }
func (v *fakeVM) Resume(context.Context) error                    { return nil }
func (v *fakeVM) Paused(context.Context) (bool, error)            { return false, nil }
func (v *fakeVM) SaveState(context.Context, string) error         { return nil }
func (v *fakeVM) AgentPortOpened(context.Context) <-chan struct{} { return nil }
func (v *fakeVM) Close() error                                    { v.log = append(v.log, "close"); return nil }
func (v *fakeVM) Cleanup() error                                  { v.log = append(v.log, "cleanup"); return nil }

func (v *fakeVM) Exited() bool {
	select {
	case <-v.done:
		return true
	default:
		return false
	}
}

func (v *fakeVM) Wait(ctx context.Context) error {
	select {
	case <-v.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (v *fakeVM) Kill() error {
	v.log = append(v.log, "kill")
	if !v.Exited() {
		close(v.done)
	}
	return nil
}

// TestColdBootAgentFailureKillsVM runs the cold boot's steps from qemu on over a fake driver
// whose guest never answers: the agent step fails, the qemu step's undo kills the VM and releases
// it, and the error names the agent step.
func TestColdBootAgentFailureKillsVM(t *testing.T) {
	drv := &fakeDriver{}
	s := &Service{cfg: Config{Home: home.Dir(t.TempDir()), BootTimeout: 300 * time.Millisecond}, drv: drv, vms: map[string]*machine{}}
	b := s.newBoot(api.StartRequest{ID: "fake", Name: "fake", MemoryMiB: 256, VCPUs: 1})
	b.kern, b.initrd, b.dir = &kernel.Kernel{VmlinuxPath: "/k"}, "/i", s.cfg.Home.Sandbox("fake")
	var steps []bootStep
	for i, st := range coldBoot {
		if st.name == "qemu" {
			steps = coldBoot[i:]
		}
	}
	var finished []string
	err := runSteps(context.Background(), "start", steps, b, func(s string) { finished = append(finished, s) })
	if err == nil || !strings.HasPrefix(err.Error(), "start: agent: the guest agent did not answer") {
		t.Fatalf("error %v, want start: agent: …", err)
	}
	if len(drv.vms) != 1 {
		t.Fatalf("%d VMs started, want 1", len(drv.vms))
	}
	if got, want := drv.vms[0].log, []string{"start", "kill", "cleanup", "close"}; !reflect.DeepEqual(got, want) {
		t.Errorf("VM saw %q, want %q", got, want)
	}
	if want := []string{"qemu"}; !reflect.DeepEqual(finished, want) {
		t.Errorf("reported %q, want %q", finished, want)
	}
	if len(s.vms) != 0 {
		t.Errorf("a failed boot registered its machine: %v", s.vms)
	}
}
