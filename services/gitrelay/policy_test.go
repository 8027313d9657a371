package gitrelay

import (
	"bytes"
	"slices"
	"strings"
	"testing"

	gwapi "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/config"
	"github.com/IniZio/nexus/pkg/httppolicy"
	"github.com/IniZio/nexus/pkg/pktline"
)

func TestPolicy(t *testing.T) {
	rec := &gwapi.Sandbox{ID: "x", Name: "default/x", Egress: gwapi.Egress{Mode: gwapi.EgressCurated, Repos: []string{"Acme/App"}},
		Config: &config.Config{Version: 1, Egress: config.Egress{Policy: []httppolicy.HostRules{{Host: "github.com", Repos: []string{"acme/lib"}}}}}}
	p, err := PolicyOf(rec)
	if err != nil {
		t.Fatal(err)
	}
	for _, c := range []struct {
		host, repo string
		ok         bool
	}{
		{"github.com", "acme/app", true},
		{"github.com", "acme/lib", true},
		{"github.com", "acme/other", false},
		{"gitlab.com", "acme/app", false},
	} {
		if got := p.RepoAllowed(c.host, c.repo); got != c.ok {
			t.Errorf("RepoAllowed(%s, %s) = %v, want %v", c.host, c.repo, got, c.ok)
		}
	}
	for ref, ok := range map[string]bool{
		"refs/heads/nexus/x": true, "refs/heads/nexus/a/b": true, "refs/heads/main": false,
		"refs/heads/nexus": false, "refs/tags/nexus/x": false,
	} {
		if got := p.BranchAllowed(ref); got != ok {
			t.Errorf("default BranchAllowed(%s) = %v, want %v", ref, got, ok)
		}
	}

	rec.Labels = map[string]string{BranchLabel: "nexus/feature"}
	p, err = PolicyOf(rec)
	if err != nil {
		t.Fatal(err)
	}
	if !slices.Equal(p.Branches, []string{"refs/heads/nexus/feature"}) || !p.BranchAllowed("refs/heads/nexus/feature") || p.BranchAllowed("refs/heads/nexus/other") {
		t.Errorf("worktree branch policy: %v", p.Branches)
	}

	rec.Egress.Mode = gwapi.EgressNone
	p, _ = PolicyOf(rec)
	if p.RepoAllowed("github.com", "acme/app") {
		t.Error("egress none must not reach a bound repo")
	}
}

func TestRefusalsWordForWord(t *testing.T) {
	if got, want := RepoRefusal("github.com", "acme/other").Error(),
		"nexus: refused by egress policy: github.com acme/other not in .nexus/config.yaml egress.policy"; got != want {
		t.Errorf("repo refusal:\n got %q\nwant %q", got, want)
	}
	if got, want := RefRefusal("refs/heads/main").Error(), "nexus: refused: ref refs/heads/main not in allowed branches"; got != want {
		t.Errorf("ref refusal:\n got %q\nwant %q", got, want)
	}
}

func TestParseHostsAndArgv(t *testing.T) {
	hosts, err := ParseHosts("github.com=127.0.0.1:2200, ghe.example=deploy@[::1]:22,plain.example=10.0.0.1")
	if err != nil {
		t.Fatal(err)
	}
	want := map[string]Target{
		"github.com":    {Host: "127.0.0.1", Port: 2200},
		"ghe.example":   {User: "deploy", Host: "::1", Port: 22},
		"plain.example": {Host: "10.0.0.1"},
	}
	for k, v := range want {
		if hosts[k] != v {
			t.Errorf("hosts[%s] = %+v, want %+v", k, hosts[k], v)
		}
	}
	for _, bad := range []string{"github.com", "=x", "github.com=-oProxyCommand=x", "github.com=h:0", "a=b@c@d", "-x=h"} {
		if _, err := ParseHosts(bad); err == nil {
			t.Errorf("ParseHosts(%q) accepted", bad)
		}
	}
	c := SSHConfig{Binary: "ssh", Options: []string{"-F", "/dev/null"}, Hosts: hosts}
	cmd, _ := ParseCommand([]string{"-o", "SendEnv=GIT_PROTOCOL", "-p", "1234", "git@github.com", "git-upload-pack 'acme/app.git'"})
	got := c.Argv(cmd)
	wantArgv := []string{"-F", "/dev/null", "-T", "-x", "-a", "-o", "ClearAllForwardings=yes", "-o", "PermitLocalCommand=no", "-o", "BatchMode=yes",
		"-p", "2200", "-o", "SendEnv=GIT_PROTOCOL", "--", "git@127.0.0.1", "git-upload-pack 'acme/app.git'"}
	if !slices.Equal(got, wantArgv) {
		t.Errorf("Argv =\n %q\nwant\n %q", got, wantArgv)
	}
}

func TestJudgePush(t *testing.T) {
	p, err := PolicyOf(&gwapi.Sandbox{Egress: gwapi.Egress{Mode: gwapi.EgressCurated}})
	if err != nil {
		t.Fatal(err)
	}
	z, o := strings.Repeat("0", 40), strings.Repeat("a", 40)
	push := func(refs ...string) []byte {
		var b []byte
		for i, r := range refs {
			line := z + " " + o + " " + r
			if i == 0 {
				line += "\x00report-status side-band-64k"
			}
			b = pktline.AppendData(b, []byte(line+"\n"))
		}
		return append(pktline.AppendFlush(b), "PACK..."...)
	}
	for _, c := range []struct {
		name string
		data []byte
		rule string
	}{
		{"allowed", push("refs/heads/nexus/x", "refs/heads/nexus/y/z"), ""},
		{"main", push("refs/heads/main"), RulePushBranch},
		{"mixed", push("refs/heads/nexus/x", "refs/tags/v1"), RulePushBranch},
		{"nothing", pktline.AppendFlush(nil), ""},
		{"malformed", []byte("zzzz"), RuleBadPush},
		{"cut short", push("refs/heads/nexus/x")[:20], RuleBadPush},
		{"signed", append(pktline.AppendData(nil, []byte("push-cert\x00report-status\n")), "0000"...), RuleBadPush},
	} {
		req, _, err := pktline.ReadUpdateRequest(bytes.NewReader(c.data), pktline.Limits{})
		v := judgePush(req, err, p)
		if v.rule != c.rule {
			t.Errorf("%s: rule %q (%s), want %q", c.name, v.rule, v.msg, c.rule)
		}
	}
	req, _, err := pktline.ReadUpdateRequest(bytes.NewReader(push("refs/heads/nexus/x", "refs/heads/main")), pktline.Limits{})
	if v := judgePush(req, err, p); v.msg != "nexus: refused: ref refs/heads/main not in allowed branches" {
		t.Errorf("refusal %q", v.msg)
	}
}
