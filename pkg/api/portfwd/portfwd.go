// Package portfwd is the contract of the port-forward service: the guest listener events the
// vmm publishes, the forward events and records of the portfwd service, its list endpoint and a
// typed client. The CLI reaches the list through the gateway (gateway.Ports).
package portfwd

import (
	"context"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/pkg/bus"
)

// The guest ports that are forwarded: a listener outside this range stays in the guest.
const (
	MinPort = 1024
	MaxPort = 11023
)

// InRange reports whether a guest port is forwarded at all.
func InRange(port int) bool { return port >= MinPort && port <= MaxPort }

// List is the one endpoint, nexus.portfwd.<host>.list: the forwards (and conflicts) of one
// sandbox, or of all.
var List = bus.Endpoint[ListRequest, []Forward]{Scope: bus.PortfwdAPI, Verb: "list"}

// Endpoints lists every endpoint of the contract (the bus tests check their permissions).
var Endpoints = []bus.Route{List}

// Event types on nexus.events.ports.<id>.
const (
	TypeListeners = "listeners" // the vmm's full set of forwardable guest listeners
	TypeForward   = "forward"   // one forward changed state (portfwd)
)

// Forward states.
const (
	StateForwarding = "forwarding" // 127.0.0.1:<port> on the host relays to the guest
	StateConflict   = "conflict"   // the host port is held by another sandbox or process
	StateReleased   = "released"   // the forward ended (events only)
)

// EventSubject is where the port events of sandbox id are published.
func EventSubject(id string) string { return bus.EventsPrefix + ".ports." + id }

// EventWildcard matches the port events of every sandbox.
const EventWildcard = bus.EventsPrefix + ".ports.>"

// Port is one forwardable guest listener.
type Port struct {
	Port uint16 `json:"port"`
	Addr string `json:"addr"` // the guest address it listens on: 127.0.0.1, 0.0.0.0, ::, ::1
}

// ListenersEvent is the complete set of forwardable listeners of one sandbox, published by the
// vmm when it changes, periodically while the guest runs, and empty when the VM stops.
type ListenersEvent struct {
	Type  string    `json:"type"` // TypeListeners
	ID    string    `json:"id"`
	Name  string    `json:"name"`
	Ports []Port    `json:"ports"`
	Time  time.Time `json:"time"`
	// Host is the host whose vmm runs the VM: in a cluster every forwarder hears every set and
	// opens those of its own host only (a set without one is taken as its own).
	Host string `json:"host,omitempty"`
}

// ForwardEvent reports that one forward started, is in conflict, or was released.
type ForwardEvent struct {
	Type   string    `json:"type"` // TypeForward
	ID     string    `json:"id"`
	Name   string    `json:"name"`
	Port   uint16    `json:"port"`
	State  string    `json:"state"`
	Holder string    `json:"holder,omitempty"` // who holds the host port, for a conflict
	Reason string    `json:"reason,omitempty"` // why a forward was released
	Time   time.Time `json:"time"`
}

// Forward is one guest port and what happened to it on the host: a record in KV nexus_ports
// (key <id>.<port>) and a row of `nexus ports`.
type Forward struct {
	ID        string    `json:"id"`
	Sandbox   string    `json:"sandbox"` // project/name
	Port      uint16    `json:"port"`
	GuestAddr string    `json:"guest_addr,omitempty"`
	HostAddr  string    `json:"host_addr"` // 127.0.0.1:<port>
	State     string    `json:"state"`
	Holder    string    `json:"holder,omitempty"`
	Since     time.Time `json:"since"`
	Host      string    `json:"host"` // the machine the sandbox runs on
	// Conns are the connections relayed now and Accepted all those this forward took since it
	// started (in List answers only, not the stored record): idle handling counts them.
	Conns    int    `json:"conns,omitempty"`
	Accepted uint64 `json:"accepted,omitempty"`
}

// ListRequest selects the forwards of one sandbox by id (all when empty).
type ListRequest struct {
	ID string `json:"id,omitempty"`
}

// Client calls the portfwd service of one host.
type Client struct {
	nc   *nats.Conn
	host string
}

// NewClient returns a client for the portfwd service on host.
func NewClient(nc *nats.Conn, host string) *Client { return &Client{nc: nc, host: host} }

// List returns the forwards (and conflicts) of one sandbox, or of all.
func (c *Client) List(ctx context.Context, r ListRequest) ([]Forward, error) {
	return List.Call(ctx, c.nc, c.host, r)
}
