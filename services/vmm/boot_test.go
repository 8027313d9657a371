package vmm

import (
	"context"
	"errors"
	"fmt"
	"reflect"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
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
