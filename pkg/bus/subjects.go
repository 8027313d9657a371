package bus

// Subjects and names shared by every process (DESIGN §2). Host-scoped services put the host
// token second: nexus.vmm.<host>.<verb>.
const (
	// LocalHost is the host name of a single-machine installation.
	LocalHost = "local"

	GatewayPrefix   = "nexus.gateway"
	VMMPrefix       = "nexus.vmm"
	NetstackPrefix  = "nexus.netstack"
	MITMPrefix      = "nexus.mitm"
	CredPrefix      = "nexus.cred"
	GitrelayPrefix  = "nexus.gitrelay"
	PortfwdPrefix   = "nexus.portfwd"
	EventsPrefix    = "nexus.events"
	AuditPrefix     = "nexus.audit"
	StreamPrefix    = "nexus.stream"
	AuditEgressWild = "nexus.audit.egress.>"

	// KV buckets.
	KVSandboxes = "nexus_sandboxes"
	KVPorts     = "nexus_ports"
	KVSnapshots = "nexus_snapshots"
	KVLeases    = "nexus_leases"

	// Streams.
	StreamAudit  = "NEXUS_AUDIT"
	StreamEvents = "NEXUS_EVENTS"
)

// HostSubject builds nexus.<svc>.<host>.<verb> for host-scoped services.
func HostSubject(prefix, host, verb string) string { return prefix + "." + host + "." + verb }

// Subject builds <prefix>.<verb> for services that are not host-scoped.
func Subject(prefix, verb string) string { return prefix + "." + verb }
