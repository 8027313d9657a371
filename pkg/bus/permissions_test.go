package bus_test

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/jetstream"

	"github.com/IniZio/nexus/internal/testutil"
	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	"github.com/IniZio/nexus/pkg/bus"
)

// permCase is one thing a user may or may not do on the bus: publish (with a reply inbox, as a
// request or a JetStream publish is) or, with sub, subscribe.
type permCase struct {
	what    string
	subject string
	body    string
	sub     bool
	allowed []string // the users who may; every other service user and the CLI may not
}

func kvGet(bucket string) string {
	return "$JS.API.DIRECT.GET.KV_" + bucket + ".$KV." + bucket + ".somekey"
}

const ephemeralConsumer = `{"config":{"ack_policy":"none","mem_storage":true,"inactive_threshold":1000000000}}`

var permMatrix = []permCase{
	// Audit: each service writes under its own prefix only; nobody writes the legacy subjects.
	{what: "write netstack audit events", subject: "nexus.audit.netstack.sb-1", body: `{}`, allowed: []string{bus.UserNetstack}},
	{what: "write mitm audit events", subject: "nexus.audit.mitm.sb-1", body: `{}`, allowed: []string{bus.UserMITM}},
	{what: "write gitrelay audit events", subject: "nexus.audit.gitrelay.sb-1", body: `{}`, allowed: []string{bus.UserGitrelay}},
	{what: "write API request audit events", subject: "nexus.audit.api.token-x", body: `{}`, allowed: []string{bus.UserAPI}},
	{what: "write legacy audit events", subject: "nexus.audit.egress.sb-1", body: `{}`},
	{what: "write audit summaries of another service", subject: "nexus.audit.netstack.sb-1.suppressed", body: `{}`, allowed: []string{bus.UserNetstack}},
	{what: "read the audit stream", subject: "$JS.API.CONSUMER.CREATE." + bus.StreamAudit, body: ephemeralConsumer, allowed: []string{bus.UserGateway, bus.UserCLI, bus.UserAPI}},
	{what: "get an audit message", subject: "$JS.API.STREAM.MSG.GET." + bus.StreamAudit, body: `{"seq":1}`, allowed: []string{bus.UserGateway, bus.UserCLI, bus.UserAPI}},
	{what: "subscribe to live audit events", subject: "nexus.audit.>", sub: true},
	{what: "delete an audit reader", subject: "$JS.API.CONSUMER.DELETE." + bus.StreamAudit + ".victim", allowed: []string{bus.UserCLI, bus.UserAPI}},
	{what: "purge the audit stream", subject: "$JS.API.STREAM.PURGE." + bus.StreamAudit},
	{what: "delete the audit stream", subject: "$JS.API.STREAM.DELETE." + bus.StreamAudit},
	{what: "reconfigure the audit stream", subject: "$JS.API.STREAM.UPDATE." + bus.StreamAudit, body: `{}`},
	{what: "delete an audit message", subject: "$JS.API.STREAM.MSG.DELETE." + bus.StreamAudit, body: `{"seq":1}`},
	// Lifecycle events.
	{what: "follow the events stream", subject: "$JS.API.CONSUMER.CREATE." + bus.StreamEvents, body: ephemeralConsumer, allowed: []string{bus.UserGitrelay, bus.UserPortfwd}},
	{what: "delete another user's events consumer", subject: "$JS.API.CONSUMER.DELETE." + bus.StreamEvents + ".victim"},
	// Buckets.
	{what: "read sandbox records", subject: kvGet(bus.KVSandboxes), allowed: []string{bus.UserGateway, bus.UserGitrelay}},
	{what: "write sandbox records", subject: "$KV." + bus.KVSandboxes + ".somekey", body: `{}`, allowed: []string{bus.UserGateway}},
	{what: "watch sandbox records", subject: "$JS.API.CONSUMER.CREATE.KV_" + bus.KVSandboxes, body: ephemeralConsumer, allowed: []string{bus.UserGateway, bus.UserGitrelay}},
	{what: "remove a watcher of sandbox records", subject: "$JS.API.CONSUMER.DELETE.KV_" + bus.KVSandboxes + ".victim", allowed: []string{bus.UserGateway}},
	{what: "subscribe to sandbox record updates", subject: "$KV." + bus.KVSandboxes + ".>", sub: true},
	{what: "read port forwards", subject: kvGet(bus.KVPorts), allowed: []string{bus.UserPortfwd}},
	{what: "write port forwards", subject: "$KV." + bus.KVPorts + ".somekey", body: `{}`, allowed: []string{bus.UserPortfwd}},
	{what: "read snapshots", subject: kvGet(bus.KVSnapshots), allowed: []string{bus.UserGateway}},
	{what: "write snapshots", subject: "$KV." + bus.KVSnapshots + ".somekey", body: `{}`, allowed: []string{bus.UserGateway}},
	{what: "read leases", subject: kvGet(bus.KVLeases), allowed: []string{bus.UserGateway, bus.UserCLI, bus.UserAPI}},
	{what: "write leases", subject: "$KV." + bus.KVLeases + ".somekey", body: `{}`, allowed: []string{bus.UserGateway, bus.UserCLI, bus.UserAPI}},
	{what: "record a removal a lost host owes", subject: "$KV." + bus.KVHosts + ".removed.b.sb-1", body: `{}`, allowed: []string{bus.UserGateway}},
	{what: "purge a bucket", subject: "$JS.API.STREAM.PURGE.KV_" + bus.KVSandboxes},
	// Account-wide JetStream.
	{what: "list streams", subject: "$JS.API.STREAM.NAMES", body: `{}`},
	{what: "read account info", subject: "$JS.API.INFO"},
	{what: "create a stream", subject: "$JS.API.STREAM.CREATE.EVIL", body: `{"name":"EVIL","subjects":["nexus.audit.evil.>"]}`},
	// Stream sessions: the vmm serves its own host's, the CLI is the client of any host's.
	{what: "serve this host's stream sessions", subject: "nexus.stream.local.*.in", sub: true, allowed: []string{bus.UserGateway, bus.UserVMM}},
	{what: "send a session's output on this host", subject: "nexus.stream.local.sid1.out", body: `{}`, allowed: []string{bus.UserGateway, bus.UserVMM}},
	{what: "serve another host's stream sessions", subject: "nexus.stream.other.*.in", sub: true, allowed: []string{bus.UserGateway}},
	{what: "send a session's output on another host", subject: "nexus.stream.other.sid1.out", body: `{}`, allowed: []string{bus.UserGateway}},
	{what: "follow any host's session output", subject: "nexus.stream.*.sid1.out", sub: true, allowed: []string{bus.UserGateway, bus.UserCLI, bus.UserAPI}},
	{what: "send a session's input", subject: "nexus.stream.other.sid1.in", body: `{}`, allowed: []string{bus.UserGateway, bus.UserCLI, bus.UserAPI}},
	{what: "subscribe to every stream session", subject: "nexus.stream.>", sub: true, allowed: []string{bus.UserGateway}},
	// Service APIs.
	{what: "resolve a placeholder", subject: credapi.Resolve.Subject(""), body: `{}`, allowed: []string{bus.UserMITM}},
}

// TestPermissionMatrix: against a real server, each service user and the CLI can do exactly
// what the matrix allows it and nothing else in it.
func TestPermissionMatrix(t *testing.T) {
	b := testutil.NewBus(t)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	// Consumers of another user to try to delete.
	js, err := jetstream.New(b.Connect(t, bus.UserAdmin))
	if err != nil {
		t.Fatal(err)
	}
	for _, st := range []string{bus.StreamAudit, bus.StreamEvents} {
		if _, err := js.CreateConsumer(ctx, st, jetstream.ConsumerConfig{Durable: "victim", AckPolicy: jetstream.AckNonePolicy}); err != nil {
			t.Fatal(err)
		}
	}
	// A credbroker that answers anything.
	admin := b.Connect(t, bus.UserAdmin)
	if _, err := admin.Subscribe(credapi.Resolve.Subject(""), func(m *nats.Msg) { m.Respond([]byte(`{}`)) }); err != nil {
		t.Fatal(err)
	}
	// And a peer of every stream session, so that an allowed send gets an answer.
	if _, err := admin.Subscribe(bus.StreamPrefix+".>", func(m *nats.Msg) { m.Respond([]byte(`{}`)) }); err != nil {
		t.Fatal(err)
	}
	admin.Flush()
	users := []string{bus.UserGateway, bus.UserVMM, bus.UserNetstack, bus.UserMITM, bus.UserCredbroker, bus.UserGitrelay, bus.UserPortfwd, bus.UserCLI, bus.UserAPI}
	for _, u := range users {
		t.Run(u, func(t *testing.T) {
			creds, err := bus.LoadCreds(b.Home.BusCreds(), u)
			if err != nil {
				t.Fatal(err)
			}
			errs := make(chan error, 64)
			nc, err := nats.Connect(b.URL, nats.UserInfo(creds.User, creds.Password), nats.CustomInboxPrefix(bus.InboxPrefix(u)),
				nats.ErrorHandler(func(_ *nats.Conn, _ *nats.Subscription, err error) { errs <- err }))
			if err != nil {
				t.Fatal(err)
			}
			defer nc.Close()
			for _, c := range permMatrix {
				want := slices.Contains(c.allowed, u)
				got, err := try(nc, c, errs)
				if err != nil {
					t.Errorf("%s: %v", c.what, err)
					continue
				}
				if got != want {
					t.Errorf("%s (%s): allowed=%v, want %v", c.what, c.subject, got, want)
				}
			}
		})
	}
	// The victims are still there.
	for _, st := range []string{bus.StreamEvents} {
		if _, err := js.Consumer(ctx, st, "victim"); err != nil {
			t.Errorf("consumer victim of %s: %v", st, err)
		}
	}
}

// try reports whether the server let nc do c: a permissions violation naming the subject means
// no; a reply (any answer, even an error of JetStream's) or, for a subscription, a round trip
// without a violation means yes.
func try(nc *nats.Conn, c permCase, errs chan error) (bool, error) {
	for len(errs) > 0 {
		<-errs
	}
	violation := func() (bool, error) {
		for {
			select {
			case err := <-errs:
				if strings.Contains(strings.ToLower(err.Error()), "permissions violation") && strings.Contains(err.Error(), c.subject) {
					return true, nil
				}
			default:
				return false, nil
			}
		}
	}
	if c.sub {
		sub, err := nc.SubscribeSync(c.subject)
		if err != nil {
			return false, err
		}
		defer sub.Unsubscribe()
		if err := nc.Flush(); err != nil {
			return false, err
		}
		// The violation was sent before the flush's PONG; its callback may lag a little.
		deadline := time.Now().Add(time.Second)
		for time.Now().Before(deadline) {
			if v, _ := violation(); v {
				return false, nil
			}
			time.Sleep(10 * time.Millisecond)
		}
		return true, nil
	}
	inbox := nc.NewRespInbox()
	sub, err := nc.SubscribeSync(inbox)
	if err != nil {
		return false, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(c.subject, inbox, []byte(c.body)); err != nil {
		return false, err
	}
	if err := nc.Flush(); err != nil {
		return false, err
	}
	deadline := time.Now().Add(5 * time.Second)
	for time.Now().Before(deadline) {
		if v, _ := violation(); v {
			return false, nil
		}
		if _, err := sub.NextMsg(20 * time.Millisecond); err == nil {
			return true, nil
		}
	}
	return false, fmt.Errorf("neither an answer nor a permissions violation for %s", c.subject)
}
