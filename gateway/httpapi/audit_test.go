package httpapi

import (
	"encoding/json"
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/bus"
)

// apiEvents reads the API's request events back from the audit stream as the operator does
// (`nexus audit tail --api`), waiting until there are want of them.
func apiEvents(t *testing.T, f *fixture, o audit.TailOptions, want int) []audit.Event {
	t.Helper()
	nc := f.bus.Connect(t, bus.UserCLI)
	var got []audit.Event
	testutil.WaitFor(t, 10*time.Second, func() error {
		got = got[:0]
		err := audit.Tail(t.Context(), nc, o, func(ev audit.Event) error { got = append(got, ev); return nil })
		if err == nil && len(got) < want {
			err = fmt.Errorf("%d of %d events", len(got), want)
		}
		return err
	})
	return got
}

func TestRequestsAreAuditedOnTheStream(t *testing.T) {
	f := newFixture(t)
	f.do(t, f.tokens[ScopeWrite], "GET", "/v1/sandboxes/box", "")
	f.do(t, "", "GET", "/v1/sandboxes", "")
	f.do(t, f.tokens[ScopeRead], "POST", "/v1/sandboxes", `{"name":"x"}`)

	evs := apiEvents(t, f, audit.TailOptions{API: true}, 3)
	if len(evs) != 3 {
		t.Fatalf("events: %+v", evs)
	}
	want := []audit.Event{
		{Layer: audit.LayerAPI, Token: "t-write", Method: "GET", Rule: "GET /v1/sandboxes/{name}", Path: "/v1/sandboxes/box", Name: "box", Status: 200, Decision: audit.Allow},
		{Layer: audit.LayerAPI, Method: "GET", Path: "/v1/sandboxes", Status: 401, Decision: audit.Deny},
		{Layer: audit.LayerAPI, Token: "t-read", Method: "POST", Rule: "POST /v1/sandboxes", Path: "/v1/sandboxes", Status: 403, Decision: audit.Deny},
	}
	for i, ev := range evs {
		if ev.IP != "127.0.0.1" || ev.Port == 0 || ev.Time.IsZero() {
			t.Errorf("event %d: client %s:%d at %s", i, ev.IP, ev.Port, ev.Time)
		}
		ev.IP, ev.Port, ev.Time = "", 0, time.Time{}
		if ev != want[i] {
			t.Errorf("event %d:\n got %+v\nwant %+v", i, ev, want[i])
		}
	}

	// One token's requests alone; and none of them among the egress decisions.
	if evs := apiEvents(t, f, audit.TailOptions{API: true, Tokens: []string{"t-read"}}, 1); len(evs) != 1 || evs[0].Token != "t-read" {
		t.Errorf("--token t-read: %+v", evs)
	}
	if evs := apiEvents(t, f, audit.TailOptions{}, 0); len(evs) != 0 {
		t.Errorf("API requests read as egress decisions: %+v", evs)
	}

	// Each token has its subject; no stored byte is a token's secret.
	nc := f.bus.Connect(t, bus.UserCLI)
	js, _ := jetstream.New(nc)
	st, err := js.Stream(t.Context(), bus.StreamAudit)
	if err != nil {
		t.Fatal(err)
	}
	for _, subject := range []string{"nexus.audit.api.token-t-write", "nexus.audit.api.anonymous", "nexus.audit.api.token-t-read"} {
		m, err := st.GetLastMsgForSubject(t.Context(), subject)
		if err != nil {
			t.Errorf("%s: %v", subject, err)
			continue
		}
		for _, secret := range f.tokens {
			if strings.Contains(string(m.Data), secret) {
				t.Errorf("%s holds a token secret", subject)
			}
		}
	}
	raw, _ := json.Marshal(evs)
	for _, secret := range f.tokens {
		if strings.Contains(string(raw), secret) {
			t.Fatal("an audit event holds a token secret")
		}
	}
}

func TestAuditEventsOfTheAPIAreAdminOnly(t *testing.T) {
	f := newFixture(t)
	f.do(t, f.tokens[ScopeWrite], "GET", "/v1/sandboxes/box", "")
	apiEvents(t, f, audit.TailOptions{API: true, Tokens: []string{"t-write"}}, 1)
	if a := f.do(t, f.tokens[ScopeWrite], "GET", "/v1/audit?api=true&follow=false", ""); a.status != 403 || !strings.Contains(a.msg, "needs scope admin") {
		t.Errorf("API events with a write token: %d %s", a.status, a.body)
	}
	a := f.do(t, f.tokens[ScopeAdmin], "GET", "/v1/audit?token=t-write&follow=false", "")
	if a.status != 200 || !strings.Contains(a.body, "event: audit") || !strings.Contains(a.body, `"token":"t-write"`) || strings.Contains(a.body, `"token":"t-admin"`) {
		t.Errorf("API events of t-write: %d %s", a.status, a.body)
	}
	if a := f.do(t, f.tokens[ScopeAdmin], "GET", "/v1/audit?follow=false", ""); a.status != 200 || strings.Contains(a.body, "event: audit") {
		t.Errorf("egress decisions hold API requests: %d %s", a.status, a.body)
	}
}
