package bus

// Subjects and names shared by every process (DESIGN §2). Host-scoped services put the host
// token second: nexus.vmm.<host>.<verb>.
const (
	// LocalHost is the host name of a single-machine installation.
	LocalHost = "local"

	EventsPrefix = "nexus.events"
	AuditPrefix  = "nexus.audit"
	StreamPrefix = "nexus.stream"

	// KV buckets.
	KVSandboxes = "nexus_sandboxes"
	KVPorts     = "nexus_ports"
	KVSnapshots = "nexus_snapshots"
	KVLeases    = "nexus_leases"

	// Streams.
	StreamAudit  = "NEXUS_AUDIT"
	StreamEvents = "NEXUS_EVENTS"
)
