package bus

import (
	"crypto/subtle"
	"strings"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"golang.org/x/crypto/bcrypt"

	"github.com/IniZio/nexus/pkg/home"
)

// clusterAuth authenticates the clients of a clustered node: its host's users (fixed when the
// node starts) and, on the CA host, one join user per usable join token. The tokens are read
// from tokens.json at each join user's attempt, so a token created or revoked counts at once
// and the server's options are never reloaded (nats-server's ReloadOptions raced with
// connecting clients' authentication).
type clusterAuth struct {
	home  home.Dir
	users map[string]*server.User
	now   func() time.Time
}

func newClusterAuth(h home.Dir, users []*server.User) *clusterAuth {
	a := &clusterAuth{home: h, users: make(map[string]*server.User, len(users)), now: time.Now}
	for _, u := range users {
		a.users[u.Username] = u
	}
	return a
}

// Check implements server.Authentication: true (and the user's permissions given to the
// client) for a known user with its password or a usable token's join user with its secret.
func (a *clusterAuth) Check(c server.ClientAuthentication) bool {
	o := c.GetOpts()
	if o == nil || c.Kind() != server.CLIENT {
		return false
	}
	if u, ok := a.users[o.Username]; ok {
		if subtle.ConstantTimeCompare([]byte(u.Password), []byte(o.Password)) != 1 {
			return false
		}
		c.RegisterUser(&server.User{Username: u.Username, Permissions: u.Permissions})
		return true
	}
	id, ok := strings.CutPrefix(o.Username, joinUserPrefix)
	if !ok || id == "" {
		return false
	}
	tokens, err := loadTokens(a.home)
	if err != nil {
		return false
	}
	now := a.now()
	for _, t := range tokens {
		if t.ID != id || !t.Usable(now) {
			continue
		}
		if bcrypt.CompareHashAndPassword([]byte(t.Hash), []byte(o.Password)) != nil {
			return false
		}
		u := joinUser(t)
		u.ConnectionDeadline = t.Expires // a join takes seconds; an expired token's session ends
		c.RegisterUser(u)
		return true
	}
	return false
}

// joinUser is the bus user of join token t: it may only ask to join.
func joinUser(t Token) *server.User {
	user := joinUserPrefix + t.ID
	return &server.User{Username: user, Permissions: &server.Permissions{
		Publish:   &server.SubjectPermission{Allow: []string{ClusterJoinSubject}},
		Subscribe: &server.SubjectPermission{Allow: []string{InboxPrefix(user) + ".>"}},
	}}
}
