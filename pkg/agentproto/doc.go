// Package agentproto is the wire protocol between the host and nexus-agent, the PID 1 of every
// nexus guest (DESIGN §4).
//
// Transport: one byte stream (a virtio-serial port, an AF_VSOCK connection, or a unix socket in
// tests) starts with a line handshake (Hello/Ready, see handshake.go) that lets the host resync
// after bytes were lost or left over, then carries a hashicorp/yamux session in which the guest is
// the yamux server and the host the client. Either side may open streams: the host opens one per
// operation; the agent opens "dial-host" streams when a guest process connects to a host port.
//
// Every stream starts with one Request (a length-prefixed JSON message, at most MaxMessage bytes),
// answered by one Response. What follows depends on the op:
//
//	ping, configure, listeners, shutdown   nothing
//	exec                                  frames both ways (stdin…/stdout, stderr, exit)
//	copy-in                               host sends Data frames then End, agent sends a final Response
//	copy-out, logs                        agent sends Data frames then End (or Error)
//	connect, dial-host                    raw bytes both ways
//	watch-listeners                       agent sends a Response (a listener set) at each change
//
// A frame is 1 type byte, a 4-byte big-endian length and at most MaxFramePayload bytes of payload.
// Decoders never allocate more than these bounds, whatever a peer claims.
package agentproto

// Version is the protocol version the agent reports in Pong and the host checks.
const Version = "nexus-agent/1"

// Kernel command line tokens read by the agent. The host builds the command line from these.
const (
	// CmdlineRoot names the root block device (an ext4 file system), e.g. nexus.root=/dev/vda.
	CmdlineRoot = "nexus.root"
	// CmdlineRootFS is the root file system type; ext4 when absent.
	CmdlineRootFS = "nexus.rootfs"
	// CmdlineHostname is the guest host name.
	CmdlineHostname = "nexus.hostname"
	// CmdlineIP is the address of eth0 in CIDR form, e.g. nexus.ip=192.168.127.2/24.
	// Without it the agent configures no network (loopback only).
	CmdlineIP = "nexus.ip"
	// CmdlineGateway is the default route, e.g. nexus.gw=192.168.127.1.
	CmdlineGateway = "nexus.gw"
	// CmdlineDNS is a comma-separated list of resolvers written to /etc/resolv.conf.
	CmdlineDNS = "nexus.dns"
	// CmdlineTime is the host clock in unix seconds; the agent sets the guest clock from it first.
	CmdlineTime = "nexus.time"
	// CmdlineAgentPort is the name of the virtio-serial port carrying the channel.
	CmdlineAgentPort = "nexus.agentport"
	// CmdlineShares, when set, says the VM has host shares (9p) to mount.
	CmdlineShares = "nexus.shares"
	// CmdlineVsockPort is the AF_VSOCK port the agent listens on (DefaultVsockPort when absent).
	CmdlineVsockPort = "nexus.vsockport"
)

// Defaults and fixed paths shared by host and guest.
const (
	// DefaultAgentPort is the virtio-serial port name when nexus.agentport is absent.
	DefaultAgentPort = "nexus.agent"
	// DefaultVsockPort is the AF_VSOCK port the agent serves the protocol on.
	DefaultVsockPort = 1024
	// ModulesList is the initramfs file listing kernel modules to load, one absolute path a line,
	// in dependency order. Those after a SharesModulesMarker line are loaded only when the command
	// line has CmdlineShares.
	ModulesList = "/etc/nexus/modules"
	// SharesModulesMarker starts the modules only host shares (9p) need.
	SharesModulesMarker = "#shares"
	// HostDialSocket is the unix socket inside the guest on which a guest process asks for a
	// connection to a host port: it writes "CONNECT <port>\n", reads "OK <port>\n", then bytes flow.
	HostDialSocket = "/run/nexus/hostdial.sock"
	// GuestBinDir holds the agent binary inside the guest root (bind-mounted from the initramfs),
	// and is on the default PATH of every exec.
	GuestBinDir = "/run/nexus/bin"
)
