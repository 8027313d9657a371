package bus

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"time"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/nats-io/nats-server/v2/server"
)

// Bus users. Every process connects as its own user; credentials are generated on the first
// start of the bus (0600 files under $NEXUS_HOME/bus/creds) and never leave the machine.
const (
	UserAdmin      = "admin" // ops: the nats CLI; everything
	UserBus        = "bus"   // the bus process itself: stream and bucket setup
	UserGateway    = "gateway"
	UserVMM        = "vmm"
	UserNetstack   = "netstack"
	UserMITM       = "mitm"
	UserCredbroker = "credbroker"
	UserGitrelay   = "gitrelay"
	UserPortfwd    = "portfwd"
	UserCLI        = "cli" // the nexus CLI and the MCP server: the gateway's API only
	UserAPI        = "api" // the remote HTTP API (`nexus serve api`): the CLI's rights, and its request audit
)

// Services is the one list of nexus services, in start order, the bus first; each connects to
// the bus as the user of its name. `nexus up` runs them all, `nexus serve <name>` one, the
// Procfile one per process (a test checks it), and `nexus status` expects every one.
var Services = []string{UserBus, UserGateway, UserVMM, UserNetstack, UserMITM, UserCredbroker, UserGitrelay, UserPortfwd}

// Users lists every bus user: the services, ops' admin, the CLI and the remote API.
var Users = append(append([]string{UserAdmin}, Services...), UserCLI, UserAPI)

// Creds is one user's credentials file.
type Creds struct {
	User     string `json:"user"`
	Password string `json:"password"`
}

// JetStream access is granted per stream and per bucket, never account-wide: a service reads the
// streams and buckets it needs and nothing else, creates consumers only on those (it never
// deletes one: ephemeral consumers go away on their own when idle), and writes only its own
// buckets. The JetStream API subjects are $JS.API.<op>.<stream>[.<consumer>[.<filter>]].

// streamRead lets a client look a stream up, read messages of it by sequence or subject, and
// follow it with its own ephemeral consumers.
func streamRead(stream string) []string {
	return []string{
		"$JS.API.STREAM.INFO." + stream,
		"$JS.API.STREAM.MSG.GET." + stream,
		"$JS.API.DIRECT.GET." + stream,
		"$JS.API.DIRECT.GET." + stream + ".>",
		"$JS.API.CONSUMER.CREATE." + stream,
		"$JS.API.CONSUMER.CREATE." + stream + ".>",
		"$JS.API.CONSUMER.INFO." + stream + ".*",
		"$JS.API.CONSUMER.MSG.NEXT." + stream + ".*",
		"$JS.FC." + stream + ".>",
	}
}

// kvRead lets a client get keys of a bucket, list and watch it.
func kvRead(bucket string) []string { return streamRead("KV_" + bucket) }

// kvWrite is kvRead plus puts and deletes of its keys, and removing the watchers on it (its
// owner's own: only the owner watches a bucket).
func kvWrite(bucket string) []string {
	return append(kvRead(bucket), "$KV."+bucket+".>", "$JS.API.CONSUMER.DELETE.KV_"+bucket+".*")
}

// kvList is kvRead plus removing the consumers its key listings leave (nats.go deletes them
// when a listing ends, and waits for the answer).
func kvList(bucket string) []string {
	return append(kvRead(bucket), "$JS.API.CONSUMER.DELETE.KV_"+bucket+".*")
}

// AuditAPI is the remote API's audit service token (audit.APIService): its request events.
const AuditAPI = "api"

// AuditPublish is what a service may publish audit events on: its own prefix only, so that no
// service can write events in another's name (nexus.audit.<service>.<sandbox>).
func AuditPublish(service string) string { return AuditPrefix + "." + service + ".>" }

// permissions is the least-privilege table: what each user may publish and subscribe to.
// Replies to requests a user received are always allowed (allow_responses).
func permissions(user, host string) *server.Permissions {
	inbox := InboxPrefix(user) + ".>"
	p := func(pub, sub []string) *server.Permissions {
		return &server.Permissions{
			Publish:   &server.SubjectPermission{Allow: pub},
			Subscribe: &server.SubjectPermission{Allow: append(sub, inbox)},
			// A reply may come long after its request (an image build before a boot): allow it
			// for as long as any handler may run (MaxHandlerTime), not the server's 2-minute default.
			Response: &server.ResponsePermission{MaxMsgs: 1 << 20, Expires: MaxHandlerTime + time.Minute},
		}
	}
	join := func(lists ...[]string) []string {
		var out []string
		for _, l := range lists {
			out = append(out, l...)
		}
		return out
	}
	credResolve := CredAPI.Subject("", CredResolveVerb)
	whySubject := GatewayAPI.Subject("", "egress.why")
	switch user {
	case UserAdmin:
		return nil // all subjects
	case UserBus:
		// It answers the joins of a cluster's hosts on the node that holds the CA.
		return p([]string{"$JS.API.>", "$SRV.>", StoreRestartedSubject}, []string{"$SRV.>", ClusterJoinSubject})
	case UserGateway:
		perm := p(join(
			[]string{VMMAPI.All(), NetstackAPI.All(), MITMAPI.All(), CredAPI.All(), GitrelayAPI.All(), PortfwdAPI.All(),
				EventsPrefix + ".>", StreamPrefix + ".>", "$SRV.>", AuditPublish(UserGateway)},
			kvWrite(KVSandboxes), kvWrite(KVLeases), kvWrite(KVSnapshots), kvList(KVHosts),
			// It owes a lost host the removal of what it holds of a removed sandbox (hosts.go).
			[]string{"$KV." + KVHosts + "." + removedPrefix + ">"},
			// `nexus ps` and `egress show` look up each sandbox's last `suppressed` summary.
			[]string{"$JS.API.STREAM.INFO." + StreamAudit, "$JS.API.STREAM.MSG.GET." + StreamAudit, "$JS.API.DIRECT.GET." + StreamAudit + ".>"}),
			[]string{GatewayAPI.All(), EventsPrefix + ".>", StreamPrefix + ".>", "$SRV.>"})
		// nexus-why reads a sandbox's recent refusals (its one-shot consumers go away on their own).
		perm.Publish.Allow = append(perm.Publish.Allow, streamRead(StreamAudit)...)
		perm.Publish.Deny = []string{credResolve}
		return perm
	case UserVMM:
		// It heartbeats its own host's capacity, and no other host's (hosts.go).
		// It forwards its guests' nexus-why to the gateway, naming the sandbox itself.
		// It serves the stream sessions of its own host only (nexus.stream.<host>.<sid>.*).
		return p([]string{EventsPrefix + ".>", StreamOnHost(host, "out"), "$SRV.>", whySubject,
			"$JS.API.STREAM.INFO.KV_" + KVHosts, "$KV." + KVHosts + "." + host},
			[]string{VMMAPI.OnHost(host), StreamOnHost(host, "in"), "$SRV.>"})
	case UserNetstack:
		// It reports the queries an ask-mode sandbox holds (nexus.events.egress.request.<id>).
		return p([]string{AuditPublish(UserNetstack), EventsPrefix + ".egress.request.>", "$SRV.>"},
			[]string{NetstackAPI.OnHost(host), "$SRV.>"})
	case UserMITM:
		return p([]string{credResolve, AuditPublish(UserMITM), "$SRV.>"},
			[]string{MITMAPI.OnHost(host), "$SRV.>"})
	case UserCredbroker:
		return p([]string{"$SRV.>"},
			[]string{CredAPI.All(), "$SRV.>"})
	case UserGitrelay:
		// It reads the sandbox records (the repo policy) and follows lifecycle events.
		return p(join([]string{AuditPublish(UserGitrelay), "$SRV.>"}, kvRead(KVSandboxes), streamRead(StreamEvents)),
			[]string{GitrelayAPI.OnHost(host), "$SRV.>"})
	case UserPortfwd:
		return p(join([]string{EventsPrefix + ".ports.>", "$SRV.>"}, kvWrite(KVPorts), streamRead(StreamEvents)),
			[]string{PortfwdAPI.OnHost(host), EventsPrefix + ".>", "$SRV.>"})
	case UserCLI, UserAPI:
		// The operator's reader of the audit stream (`nexus audit tail`, the MCP audit tool),
		// which also removes the consumers it made there. nexus-why is the vmm's to call: the
		// sandbox it names is the one whose channel the call came over. The remote API
		// (`nexus serve api`) serves the same calls over HTTP, and only it writes the request
		// events under nexus.audit.api.>: no CLI can put a request in a token's name.
		pub := []string{GatewayAPI.All(), StreamOnHost("*", "in"), "$SRV.>", "$JS.API.CONSUMER.DELETE." + StreamAudit + ".*"}
		if user == UserAPI {
			pub = append(pub, AuditPublish(AuditAPI))
		}
		perm := p(join(pub, kvWrite(KVLeases), streamRead(StreamAudit),
			// `nexus hosts` reads the heartbeats; `nexus hosts drain` writes drain.<host>.
			kvList(KVHosts), []string{"$KV." + KVHosts + ".drain.>"}),
			[]string{StreamOnHost("*", "out"), EventsPrefix + ".>"})
		perm.Publish.Deny = []string{whySubject}
		return perm
	}
	// Unknown users get nothing at all.
	return p([]string{}, []string{})
}

// StreamOnHost is one direction (in or out) of every stream session served on host ("*":
// on any host): nexus.stream.<host>.<sid>.<dir>, as pkg/stream names them.
func StreamOnHost(host, dir string) string { return StreamPrefix + "." + host + ".*." + dir }

// InboxPrefix is the user's private reply prefix: no user can subscribe to another's replies.
func InboxPrefix(user string) string { return "_INBOX_" + user }

func credsPath(dir, user string) string { return filepath.Join(dir, user+".json") }

// ensureCreds loads every user's credentials from dir, generating missing ones (0600, atomic).
func ensureCreds(dir string) (map[string]Creds, error) {
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("bus credentials: %w", err)
	}
	out := make(map[string]Creds, len(Users))
	for _, u := range Users {
		c, err := LoadCreds(dir, u)
		if err == nil {
			out[u] = c
			continue
		}
		if !errors.Is(err, os.ErrNotExist) {
			return nil, err
		}
		buf := make([]byte, 32)
		if _, err := rand.Read(buf); err != nil {
			return nil, fmt.Errorf("bus credentials: %w", err)
		}
		c = Creds{User: u, Password: hex.EncodeToString(buf)}
		b, _ := json.Marshal(c)
		if err := atomicfile.WriteFile(credsPath(dir, u), b, 0o600); err != nil {
			return nil, fmt.Errorf("bus credentials: %w", err)
		}
		out[u] = c
	}
	return out, nil
}

// LoadCreds reads one user's credentials file.
func LoadCreds(dir, user string) (Creds, error) {
	b, err := os.ReadFile(credsPath(dir, user))
	if err != nil {
		return Creds{}, err
	}
	var c Creds
	if err := json.Unmarshal(b, &c); err != nil || c.User != user || c.Password == "" {
		return Creds{}, fmt.Errorf("bus credentials %s are damaged; remove the file and restart the bus", credsPath(dir, user))
	}
	return c, nil
}
