package bus_test

import (
	"context"
	"go/ast"
	"go/parser"
	"go/token"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/internal/testutil"
	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	gwapi "github.com/IniZio/nexus/pkg/api/gateway"
	mitmapi "github.com/IniZio/nexus/pkg/api/mitm"
	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/bus"
)

// contract is one pkg/api package's endpoints, the user that serves them and the users meant
// to call them.
type contract struct {
	dir       string // under pkg/api
	endpoints []bus.Route
	server    string
	callers   []string
}

var contracts = []contract{
	{"credbroker", credapi.Endpoints, bus.UserCredbroker, []string{bus.UserGateway}},
	{"mitm", mitmapi.Endpoints, bus.UserMITM, []string{bus.UserGateway}},
	{"netstack", netapi.Endpoints, bus.UserNetstack, []string{bus.UserGateway}},
	{"vmm", vmmapi.Endpoints, bus.UserVMM, []string{bus.UserGateway}},
	{"portfwd", portfwdapi.Endpoints, bus.UserPortfwd, []string{bus.UserGateway}},
	{"gateway", gwapi.Endpoints, bus.UserGateway, []string{bus.UserCLI, bus.UserAPI}},
}

// callersOf names the endpoints whose callers are not their contract's.
var callersOf = map[string][]string{
	credapi.Resolve.Subject(""): {bus.UserMITM},
	gwapi.EgressWhy.Subject(""): {bus.UserVMM},
}

// TestEndpointsAreListed: every bus.Endpoint declared in a pkg/api package is in that
// package's Endpoints list (so the permission test below sees it), and no contract is missed.
func TestEndpointsAreListed(t *testing.T) {
	declared := map[string]int{}
	files, _ := filepath.Glob("../api/*/*.go")
	for _, f := range files {
		if strings.HasSuffix(f, "_test.go") {
			continue
		}
		file, err := parser.ParseFile(token.NewFileSet(), f, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		// Endpoint literals, written bus.Endpoint[…]{…} or through an alias of it (Lifecycle{…}).
		isEndpoint := func(e ast.Expr) bool {
			idx, ok := e.(*ast.IndexListExpr)
			if !ok {
				return false
			}
			sel, ok := idx.X.(*ast.SelectorExpr)
			return ok && sel.Sel.Name == "Endpoint"
		}
		aliases := map[string]bool{}
		ast.Inspect(file, func(n ast.Node) bool {
			if ts, ok := n.(*ast.TypeSpec); ok && ts.Assign.IsValid() && isEndpoint(ts.Type) {
				aliases[ts.Name.Name] = true
			}
			return true
		})
		ast.Inspect(file, func(n ast.Node) bool {
			if lit, ok := n.(*ast.CompositeLit); ok {
				if id, ok := lit.Type.(*ast.Ident); isEndpoint(lit.Type) || ok && aliases[id.Name] {
					declared[filepath.Base(filepath.Dir(f))]++
				}
			}
			return true
		})
	}
	listed := map[string]int{}
	for _, c := range contracts {
		listed[c.dir] = len(c.endpoints)
	}
	for dir, n := range declared {
		if listed[dir] != n {
			t.Errorf("pkg/api/%s declares %d endpoints; its Endpoints list (in this test's table) has %d", dir, n, listed[dir])
		}
	}
}

// TestEndpointNamesAreUnique: micro endpoint names are unique per service, subjects everywhere.
func TestEndpointNamesAreUnique(t *testing.T) {
	names := map[string]string{}
	subjects := map[string]bool{}
	for _, c := range contracts {
		for _, ep := range c.endpoints {
			key := ep.API().Name + "/" + ep.Name()
			if prev, ok := names[key]; ok {
				t.Errorf("%s and %s have the same micro name %s", prev, ep.Subject(bus.LocalHost), key)
			}
			names[key] = ep.Subject(bus.LocalHost)
			if subjects[ep.Subject(bus.LocalHost)] {
				t.Errorf("subject %s is declared twice", ep.Subject(bus.LocalHost))
			}
			subjects[ep.Subject(bus.LocalHost)] = true
		}
	}
}

// TestEndpointPermissions: each endpoint may be served by its service's user and called by
// its intended callers, and by no other user.
func TestEndpointPermissions(t *testing.T) {
	for _, c := range contracts {
		for _, ep := range c.endpoints {
			subject := ep.Subject(bus.LocalHost)
			callers := c.callers
			if cs, ok := callersOf[ep.Subject("")]; ok {
				callers = cs
			}
			if !allowed(bus.Permissions(c.server, bus.LocalHost).Subscribe, subject) {
				t.Errorf("%s may not serve %s", c.server, subject)
			}
			// A host's services serve their own host's subjects only (issue 25).
			if ep.API().PerHost && allowed(bus.Permissions(c.server, "other").Subscribe, subject) {
				t.Errorf("%s of host other may serve %s of host %s", c.server, subject, bus.LocalHost)
			}
			for _, u := range bus.Users {
				want := u == bus.UserAdmin || contains(callers, u)
				if got := bus.Permissions(u, bus.LocalHost) == nil || allowed(bus.Permissions(u, bus.LocalHost).Publish, subject); got != want {
					t.Errorf("%s may request %s: %v, want %v", u, subject, got, want)
				}
			}
		}
	}
}

// TestEndpointsAnswerTheirCallers: over a real bus, each intended caller gets a reply.
func TestEndpointsAnswerTheirCallers(t *testing.T) {
	b := testutil.NewBus(t)
	conns := map[string]*nats.Conn{}
	conn := func(u string) *nats.Conn {
		if conns[u] == nil {
			conns[u] = b.Connect(t, u)
		}
		return conns[u]
	}
	for _, c := range contracts {
		for _, ep := range c.endpoints {
			subject := ep.Subject(bus.LocalHost)
			sub, err := conn(c.server).Subscribe(subject, func(m *nats.Msg) { m.Respond([]byte(`{"ok":true}`)) })
			if err != nil {
				t.Fatal(err)
			}
			conn(c.server).Flush()
			callers := c.callers
			if cs, ok := callersOf[ep.Subject("")]; ok {
				callers = cs
			}
			for _, u := range callers {
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
				if _, err := bus.Request[struct{}](ctx, conn(u), subject, struct{}{}); err != nil {
					t.Errorf("%s requesting %s: %v", u, subject, err)
				}
				cancel()
			}
			sub.Unsubscribe()
		}
	}
}

func allowed(p *server.SubjectPermission, subject string) bool {
	if p == nil {
		return true
	}
	ok := false
	for _, a := range p.Allow {
		ok = ok || matches(a, subject)
	}
	for _, d := range p.Deny {
		ok = ok && !matches(d, subject)
	}
	return ok
}

// matches reports whether a NATS subject filter (with * and >) matches subject.
func matches(filter, subject string) bool {
	f, s := strings.Split(filter, "."), strings.Split(subject, ".")
	for i, tok := range f {
		switch {
		case tok == ">":
			return len(s) > i
		case i >= len(s):
			return false
		case tok != "*" && tok != s[i]:
			return false
		}
	}
	return len(f) == len(s)
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}
