// Package hypervisor is the contract between the vmm service and a VM driver (DESIGN §4): the
// machine a sandbox boots (Spec), a handle on one running VM (VM) and the driver that starts,
// restores and re-adopts VMs (Driver). QEMU (services/vmm/qemu) implements it; a Cloud
// Hypervisor or Firecracker driver is a new package implementing it, not an edit of the service.
//
// A driver keeps a VM's files in its sandbox directory (Spec.Dir) and must find them again after
// the vmm restarts: VMs outlive the service, and Adopt re-attaches to them. Two of those files
// the service reads itself, whatever the driver: AgentSocket and ConsoleLog.
package hypervisor

import (
	"context"
	"path/filepath"
	"time"
)

// Driver starts, restores and re-adopts VMs.
type Driver interface {
	// Start boots spec and returns once the VM is running and controllable.
	Start(ctx context.Context, spec Spec) (VM, error)
	// Restore starts a VM from the device state at statePath saved by VM.SaveState, over the
	// saved RAM file spec.RAMPath (mapped privately, never written). spec describes the same
	// machine as the saved one; the VM runs when Restore returns.
	Restore(ctx context.Context, spec Spec, statePath string) (VM, error)
	// Adopt re-attaches to a VM an earlier process started in dir. A VM that is gone is an
	// errdefs.ErrNotFound error.
	Adopt(ctx context.Context, dir string) (VM, error)
}

// VM is a handle on one running VM. Dropping the handle (Close) leaves the VM running.
type VM interface {
	Pid() int              // the hypervisor process
	Accel() string         // the accelerator the VM runs under (kvm, tcg)
	Started() time.Time    // when it was started
	Spec() Spec            // what it was started with (read back for an adopted VM)
	RAMPath() string       // the guest RAM file
	Done() <-chan struct{} // closed when the VM has exited
	Exited() bool
	// Wait blocks until the VM exits or ctx ends.
	Wait(ctx context.Context) error
	// Kill ends the VM at once and waits until its process is gone.
	Kill() error
	// Close drops the handle and leaves the VM running.
	Close() error
	// Cleanup removes what Start left in the directory once the VM has exited; the console log
	// stays.
	Cleanup() error

	// Pause and Resume stop and restart the vCPUs; Paused says whether they are stopped.
	Pause(ctx context.Context) error
	Resume(ctx context.Context) error
	Paused(ctx context.Context) (bool, error)
	// SaveState stops the vCPUs and writes the device state to path; the VM stays paused until
	// Resume.
	SaveState(ctx context.Context, path string) error
	// AgentPortOpened signals each time the guest opens its end of the agent channel, until ctx
	// ends; nil when the hypervisor cannot tell.
	AgentPortOpened(ctx context.Context) <-chan struct{}
}

// AgentSocket is the host end of the guest agent's channel in a sandbox directory.
func AgentSocket(dir string) string { return filepath.Join(dir, "agent.sock") }

// ConsoleLog is the guest serial console log in a sandbox directory.
func ConsoleLog(dir string) string { return filepath.Join(dir, "console.log") }

// DiskErrors counts the block I/O errors a VM's hypervisor handed to the guest rather than
// pausing it (QEMU: werror=report,rerror=report and its BLOCK_IO_ERROR event).
type DiskErrors struct {
	Count   int       `json:"count"`
	NoSpace int       `json:"no_space"` // of which "no space left on device"
	Last    string    `json:"last,omitempty"`
	LastAt  time.Time `json:"last_at,omitzero"`
}

// Health is what a VM can tell the service about why it struggles or died, beyond VM. A driver's
// VM implements it when it can; the service asks before it falls back to a generic reason.
type Health interface {
	DiskErrors() DiskErrors
	// ExitReason says why the VM exited when the driver knows, e.g. "out of memory (limit 600
	// MiB)"; empty when it does not.
	ExitReason() string
	// Containment says how the hypervisor process is contained: "contained", or a sentence
	// starting "less contained:" or "not contained:" saying why.
	Containment() string
}
