package policy_test

import (
	"strings"
	"testing"
)

// TestGHInGuest: Debian's gh CLI in nexus-base works in a --repo sandbox through the brokered
// GH_TOKEN placeholder. gh sends `Authorization: token <GH_TOKEN>`; the mitm swaps the real token
// in (it used to swap only Bearer, so gh reached GitHub with the placeholder). `gh api /user`
// answers from the fake api.github.com and `gh auth status` (GET / for the scopes, then the
// GraphQL viewer { login } probe) reports logged in.
func TestGHInGuest(t *testing.T) {
	name := repoSandbox(t)
	const env = "GH_NO_UPDATE_NOTIFIER=1 GH_PROMPT_DISABLED=1 NO_COLOR=1"
	real := func(auth string) bool { return auth == "token "+ghToken || auth == "Bearer "+ghToken }
	clean := func(s string) string { return strings.ReplaceAll(s, ghToken, "<the real GH_TOKEN>") }

	before := len(api.find(""))
	out, code := sh(t, name, env+" gh api /user")
	if code != 0 || !strings.Contains(out, `"login":"nexus-bot"`) {
		t.Fatalf("gh api /user: exit %d\n%s", code, clean(out))
	}
	if got := since(before, "GET", "/user"); len(got) != 1 || !real(got[0].Auth) {
		t.Fatalf("api.github.com saw GET /user with Authorization %v, want the real token once", auths(got))
	}

	before = len(api.find(""))
	out, code = sh(t, name, env+" gh auth status")
	if code != 0 || !strings.Contains(out, "Logged in to github.com as nexus-bot") {
		t.Fatalf("gh auth status: exit %d\n%s", code, clean(out))
	}
	if strings.Contains(out, ghToken) {
		t.Fatal("gh auth status in the guest printed the real token")
	}
	for _, probe := range [][2]string{{"GET", "/"}, {"POST", "/graphql"}} {
		got := since(before, probe[0], probe[1])
		if len(got) == 0 {
			t.Errorf("gh auth status did not reach api.github.com with %s %s", probe[0], probe[1])
		}
		for _, s := range got {
			if !real(s.Auth) {
				t.Errorf("gh auth status: %s %s reached api.github.com with Authorization %s, want the real token", probe[0], probe[1], redact(s.Auth))
			}
		}
	}
}

// since returns the requests to api.github.com after the first n whose method and path (without
// the query) are method and path.
func since(n int, method, path string) []seen {
	var out []seen
	for _, s := range api.find("")[n:] {
		if p, _, _ := strings.Cut(s.Path, "?"); s.Method == method && p == path {
			out = append(out, s)
		}
	}
	return out
}

func auths(ss []seen) []string {
	out := make([]string, len(ss))
	for i, s := range ss {
		out[i] = redact(s.Auth)
	}
	return out
}
