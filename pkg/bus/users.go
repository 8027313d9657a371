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
)

// Services is the one list of nexus services, in start order, the bus first; each connects to
// the bus as the user of its name. `nexus up` runs them all, `nexus serve <name>` one, the
// Procfile one per process (a test checks it), and `nexus status` expects every one.
var Services = []string{UserBus, UserGateway, UserVMM, UserNetstack, UserMITM, UserCredbroker, UserGitrelay, UserPortfwd}

// Users lists every bus user: the services, ops' admin and the CLI.
var Users = append(append([]string{UserAdmin}, Services...), UserCLI)

// Creds is one user's credentials file.
type Creds struct {
	User     string `json:"user"`
	Password string `json:"password"`
}

// jsRead lets a client use JetStream streams and buckets that exist (info, direct gets,
// consumers, acks) without creating, deleting or purging any.
var jsRead = []string{
	"$JS.API.INFO",
	"$JS.API.STREAM.INFO.*",
	"$JS.API.STREAM.NAMES",
	"$JS.API.STREAM.MSG.GET.*",
	"$JS.API.DIRECT.GET.>",
	"$JS.API.CONSUMER.>",
	"$JS.ACK.>",
	"$JS.FC.>",
}

// permissions is the least-privilege table: what each user may publish and subscribe to.
// Replies to requests a user received are always allowed (allow_responses).
func permissions(user string) *server.Permissions {
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
	with := func(base []string, more ...string) []string { return append(append([]string{}, base...), more...) }
	credResolve := CredAPI.Subject("", CredResolveVerb)
	switch user {
	case UserAdmin:
		return nil // all subjects
	case UserBus:
		return p(with(jsRead, "$JS.API.>", "$SRV.>"), []string{"$SRV.>"})
	case UserGateway:
		perm := p(with(jsRead,
			VMMAPI.All(), NetstackAPI.All(), MITMAPI.All(), CredAPI.All(), GitrelayAPI.All(), PortfwdAPI.All(),
			EventsPrefix+".>", StreamPrefix+".>", AuditPrefix+".>",
			"$KV."+KVSandboxes+".>", "$KV."+KVLeases+".>", "$KV."+KVSnapshots+".>", "$SRV.>"),
			[]string{GatewayAPI.All(), EventsPrefix + ".>", StreamPrefix + ".>", "$SRV.>"})
		perm.Publish.Deny = []string{credResolve}
		return perm
	case UserVMM:
		return p(with(jsRead, EventsPrefix+".>", StreamPrefix+".*.out", "$KV."+KVSnapshots+".>", "$SRV.>"),
			[]string{VMMAPI.All(), StreamPrefix + ".*.in", "$SRV.>"})
	case UserNetstack:
		return p(with(jsRead, AuditPrefix+".egress.>", EventsPrefix+".>", "$SRV.>"),
			[]string{NetstackAPI.All(), "$SRV.>"})
	case UserMITM:
		return p(with(jsRead, credResolve, AuditPrefix+".egress.>", "$SRV.>"),
			[]string{MITMAPI.All(), "$SRV.>"})
	case UserCredbroker:
		return p(with(jsRead, AuditPrefix+".egress.>", "$SRV.>"),
			[]string{CredAPI.All(), "$SRV.>"})
	case UserGitrelay:
		return p(with(jsRead, AuditPrefix+".egress.>", "$SRV.>"),
			[]string{GitrelayAPI.All(), "$SRV.>"})
	case UserPortfwd:
		return p(with(jsRead, EventsPrefix+".ports.>", "$KV."+KVPorts+".>", "$SRV.>"),
			[]string{PortfwdAPI.All(), EventsPrefix + ".>", "$SRV.>"})
	case UserCLI:
		return p(with(jsRead, GatewayAPI.All(), StreamPrefix+".*.in", "$SRV.>", "$KV."+KVLeases+".>"),
			[]string{StreamPrefix + ".*.out", EventsPrefix + ".>"})
	}
	// Unknown users get nothing at all.
	return p([]string{}, []string{})
}

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
