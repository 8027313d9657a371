package vmm

import (
	"crypto/sha256"
	"fmt"
)

// MACFor is the MAC address of the NIC of the sandbox (or VM) with this id: a stable locally
// administered unicast address. A cold boot gets it from QEMU's command line; a guest restored
// from a template or snapshot is given it in the configure step. The gateway pins the
// sandbox's netstack DHCP lease to it.
func MACFor(id string) string {
	h := sha256.Sum256([]byte("nexus-mac\x00" + id))
	return fmt.Sprintf("5a:94:ef:%02x:%02x:%02x", h[0], h[1], h[2])
}
