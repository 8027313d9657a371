package agent

import (
	"errors"
	"os/user"
	"slices"
	"strings"
	"testing"
)

// fakeUsers is a user database: nil maps are an image without /etc/passwd or /etc/group.
func fakeUsers(users map[string]user.User, groups map[string]string, member map[string][]string) userDB {
	missing := errors.New("open /etc/passwd: no such file or directory")
	return userDB{
		lookup: func(name string) (*user.User, error) {
			if u, ok := users[name]; ok {
				return &u, nil
			}
			return nil, missing
		},
		lookupID: func(uid string) (*user.User, error) {
			for _, u := range users {
				if u.Uid == uid {
					return &u, nil
				}
			}
			return nil, missing
		},
		lookupGroup: func(name string) (*user.Group, error) {
			if g, ok := groups[name]; ok {
				return &user.Group{Name: name, Gid: g}, nil
			}
			return nil, missing
		},
		groupIDs: func(u *user.User) ([]string, error) { return member[u.Username], nil },
	}
}

// TestResolveUser: a build step or exec as root works in an image without /etc/passwd (a
// static binary FROM scratch), numeric ids need no entry, and a name that cannot be resolved is
// a one-line error naming it.
func TestResolveUser(t *testing.T) {
	empty := fakeUsers(nil, nil, nil)
	debian := fakeUsers(map[string]user.User{
		"root": {Uid: "0", Gid: "0", Username: "root", HomeDir: "/root"},
		"dev":  {Uid: "1000", Gid: "1000", Username: "dev", HomeDir: "/home/dev"},
	}, map[string]string{"root": "0", "docker": "998"}, map[string][]string{"dev": {"1000", "998"}})
	for _, tc := range []struct {
		db        userDB
		spec      string
		uid, gid  uint32
		groups    []uint32
		home, err string
	}{
		{db: empty, spec: "root", home: "/root"},
		{db: empty, spec: "0", home: "/root"},
		{db: empty, spec: "0:0", home: "/root"},
		{db: empty, spec: "root:root", home: "/root"},
		{db: empty, spec: "1000", uid: 1000, gid: 1000, home: "/"},
		{db: empty, spec: "1000:50", uid: 1000, gid: 50, home: "/"},
		{db: empty, spec: "root:5", gid: 5, home: "/root"},
		{db: empty, spec: "dev", err: `exec: unknown user "dev"`},
		{db: empty, spec: "1000:staff", err: `exec: unknown group "staff"`},
		{db: empty, spec: ":0", err: `exec: bad user ":0": give USER[:GROUP]`},
		{db: empty, spec: "0:", err: `exec: bad user "0:": give USER[:GROUP]`},
		{db: empty, spec: strings.Repeat("x", 100), err: `exec: unknown user "` + strings.Repeat("x", 40) + `"`},
		{db: debian, spec: "root", home: "/root"},
		{db: debian, spec: "dev", uid: 1000, gid: 1000, groups: []uint32{1000, 998}, home: "/home/dev"},
		{db: debian, spec: "1000", uid: 1000, gid: 1000, groups: []uint32{1000, 998}, home: "/home/dev"},
		{db: debian, spec: "dev:docker", uid: 1000, gid: 998, groups: []uint32{1000, 998}, home: "/home/dev"},
		{db: debian, spec: "nobody", err: `exec: unknown user "nobody"`},
	} {
		cred, home, err := tc.db.resolve(tc.spec)
		if tc.err != "" {
			if err == nil || err.Error() != tc.err {
				t.Errorf("%q: err %v, want %q", tc.spec, err, tc.err)
			}
			continue
		}
		if err != nil {
			t.Errorf("%q: %v", tc.spec, err)
			continue
		}
		if cred.Uid != tc.uid || cred.Gid != tc.gid || !slices.Equal(cred.Groups, tc.groups) || home != tc.home {
			t.Errorf("%q: uid %d gid %d groups %v home %q, want %d %d %v %q", tc.spec, cred.Uid, cred.Gid, cred.Groups, home, tc.uid, tc.gid, tc.groups, tc.home)
		}
	}
}
