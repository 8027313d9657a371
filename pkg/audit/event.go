// Package audit defines the one egress-decision event every perimeter layer emits (DESIGN §5).
//
// An Event is the canonical line for a decision: it is published with JetStream ack on
// nexus.audit.egress.<sandbox> and read back by `nexus audit tail`. It never carries a secret or a
// placeholder value: Swapped says that a credential was swapped, never what it was.
package audit

import (
	"context"
	"time"
)

// Layers of the perimeter that make decisions.
const (
	LayerDNS  = "dns"
	LayerL4   = "l4"
	LayerTLS  = "tls"
	LayerHTTP = "http"
	LayerCred = "cred"
	LayerGit  = "git"
)

// Decisions.
const (
	Allow = "allow"
	Deny  = "deny"
)

// Event is one decision.
type Event struct {
	Time     time.Time `json:"time"`
	Sandbox  string    `json:"sandbox"` // the sandbox id
	Layer    string    `json:"layer"`
	Proto    string    `json:"proto,omitempty"` // tcp, udp, icmp
	Host     string    `json:"host,omitempty"`
	IP       string    `json:"ip,omitempty"`
	Port     int       `json:"port,omitempty"`
	Method   string    `json:"method,omitempty"`
	Path     string    `json:"path,omitempty"`
	Status   int       `json:"status,omitempty"`
	Bytes    int64     `json:"bytes,omitempty"`
	Decision string    `json:"decision"`
	Rule     string    `json:"rule,omitempty"`
	Reason   string    `json:"reason,omitempty"`
	Swapped  bool      `json:"swapped,omitempty"`
}

// Sink receives events. Implementations must not block the caller's data path for long: the
// JetStream sink publishes asynchronously and tracks acks.
type Sink interface {
	Emit(ctx context.Context, ev Event)
}

// SinkFunc adapts a function to Sink.
type SinkFunc func(ctx context.Context, ev Event)

func (f SinkFunc) Emit(ctx context.Context, ev Event) { f(ctx, ev) }

// Subject is the bus subject for a sandbox's egress events.
func Subject(sandboxID string) string { return "nexus.audit.egress." + sandboxID }
