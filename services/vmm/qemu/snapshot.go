package qemu

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/services/vmm/hypervisor"
)

// Snapshots (DESIGN §4). Guest RAM lives in a shared file, so the migration stream carries only
// device state: the capability x-ignore-shared skips the shared RAM block. SaveState writes that
// stream to a file while the guest is stopped; Restore starts a new QEMU over a copy of the RAM
// file mapped privately (share=off: pages are read lazily from the file and copied on write) and
// loads the device state into it.

// migratePoll is how often query-migrate is asked while a migration runs.
const migratePoll = 2 * time.Millisecond

// SaveState stops the vCPUs and writes the device state to path (which must not contain a
// single quote). The VM stays stopped (QMP status postmigrate) until Resume.
func (vm *VM) SaveState(ctx context.Context, path string) error {
	if strings.ContainsAny(path, "'\n") {
		return errdefs.Invalid("save state: path %q must not contain quotes or newlines", path)
	}
	if _, err := vm.QMP.Execute(ctx, "stop", nil); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if err := vm.ignoreShared(ctx); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_WRONLY|os.O_TRUNC, 0o600)
	if err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	defer f.Close()
	if err := vm.QMP.SendFD(ctx, "nexus-save", int(f.Fd())); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if _, err := vm.QMP.Execute(ctx, "migrate", map[string]any{"uri": "fd:nexus-save"}); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	if err := vm.awaitMigration(ctx); err != nil {
		return fmt.Errorf("save state: %w", err)
	}
	return f.Sync()
}

func (vm *VM) ignoreShared(ctx context.Context) error {
	caps := map[string]any{"capabilities": []map[string]any{{"capability": "x-ignore-shared", "state": true}}}
	_, err := vm.QMP.Execute(ctx, "migrate-set-capabilities", caps)
	return err
}

// awaitMigration polls query-migrate until the migration completed or failed.
func (vm *VM) awaitMigration(ctx context.Context) error {
	t := time.NewTicker(migratePoll)
	defer t.Stop()
	for {
		raw, err := vm.QMP.Execute(ctx, "query-migrate", nil)
		if err != nil {
			return err
		}
		var st struct {
			Status    string `json:"status"`
			ErrorDesc string `json:"error-desc"`
		}
		if err := json.Unmarshal(raw, &st); err != nil {
			return fmt.Errorf("query-migrate: %w", err)
		}
		switch st.Status {
		case "completed":
			return nil
		case "failed", "cancelled":
			if st.ErrorDesc == "" {
				st.ErrorDesc = "migration " + st.Status
			}
			return errors.New(st.ErrorDesc)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-vm.done:
			return errExited
		case <-t.C:
		}
	}
}

// Restore starts a VM from saved state: spec must describe the same machine as the saved one
// (memory, vCPUs, devices in the same order) and spec.RAMPath names the saved RAM file, which is
// mapped privately and never written or removed. The VM is running when Restore returns.
func (d *Driver) Restore(ctx context.Context, spec VMSpec, statePath string) (hypervisor.VM, error) {
	if strings.ContainsAny(statePath, "'\n") {
		return nil, errdefs.Invalid("restore: path %q must not contain quotes or newlines", statePath)
	}
	if spec.RAMPath == "" {
		return nil, errdefs.Invalid("restore %s: the RAM file is not set", spec.ID)
	}
	spec.Incoming = true
	vm, err := d.start(ctx, spec)
	if err != nil {
		return nil, err
	}
	fail := func(err error) (hypervisor.VM, error) {
		vm.Kill()
		vm.Close()
		if l := lastLine(logPath(spec.Dir)); l != "" {
			return nil, fmt.Errorf("restore %s: %w: %s", spec.ID, err, l)
		}
		return nil, fmt.Errorf("restore %s: %w", spec.ID, err)
	}
	if err := vm.ignoreShared(ctx); err != nil {
		return fail(err)
	}
	f, err := os.Open(statePath)
	if err != nil {
		return fail(err)
	}
	defer f.Close()
	if err := vm.QMP.SendFD(ctx, "nexus-restore", int(f.Fd())); err != nil {
		return fail(err)
	}
	if _, err := vm.QMP.Execute(ctx, "migrate-incoming", map[string]any{"uri": "fd:nexus-restore"}); err != nil {
		return fail(err)
	}
	if err := vm.awaitMigration(ctx); err != nil {
		return fail(err)
	}
	if _, err := vm.QMP.Execute(ctx, "cont", nil); err != nil {
		return fail(err)
	}
	return vm, nil
}

// Spec is what the VM was started with (read back from vm.json for an adopted VM).
func (vm *VM) Spec() VMSpec { return vm.spec }
