package agent

import "github.com/IniZio/nexus/pkg/ring"

// DefaultRingSize is the size of the agent's log ring.
const DefaultRingSize = 1 << 20

// Ring keeps the last bytes written to it, up to its size (the agent's own log, served by the
// logs op).
type Ring = ring.Ring

// NewRing returns a Ring of size bytes.
func NewRing(size int) *Ring { return ring.New(size) }
