package vmm

import (
	"github.com/IniZio/nexus/services/vmm/hypervisor"
	"github.com/IniZio/nexus/services/vmm/qemu"
)

// Driver is what the service needs of a hypervisor: it starts, restores from a snapshot and
// re-adopts VMs, each a hypervisor.VM handle the service stops, pauses, snapshots and watches.
// QEMU (package qemu) is the one there is and the default; a Cloud Hypervisor or Firecracker
// driver is a new package implementing hypervisor.Driver, passed in Config.Driver.
type Driver = hypervisor.Driver

var _ Driver = (*qemu.Driver)(nil)
