package httpapi

import (
	"encoding/json"
	"testing"
	"time"
)

// A browser's exec socket: a ticket from POST …/exec/ticket opens that sandbox's socket without
// Authorization, once; a used, foreign or made-up ticket is a 401; a read token gets none.
func TestExecTicket(t *testing.T) {
	f := newFixture(t)
	if a := f.do(t, f.tokens[ScopeRead], "POST", "/v1/sandboxes/box/exec/ticket", ""); a.status != 403 {
		t.Fatalf("a ticket for a read token: %d %s", a.status, a.body)
	}
	issue := func() string {
		a := f.do(t, f.tokens[ScopeWrite], "POST", "/v1/sandboxes/box/exec/ticket", "")
		var tb TicketBody
		if a.status != 200 || json.Unmarshal([]byte(a.body), &tb) != nil || tb.Ticket == "" || time.Until(tb.ExpiresAt) > ticketTTL {
			t.Fatalf("ticket: %d %s", a.status, a.body)
		}
		return tb.Ticket
	}
	tk := issue()
	// The fake gateway runs no command: past the guard the exec fails, but not as a 401.
	if a := f.do(t, "", "GET", "/v1/sandboxes/box/exec/ws?argv=true&ticket="+tk, ""); a.status == 401 || a.status == 403 {
		t.Fatalf("the first use of a ticket: %d %s", a.status, a.body)
	}
	if a := f.do(t, "", "GET", "/v1/sandboxes/box/exec/ws?argv=true&ticket="+tk, ""); a.status != 401 {
		t.Errorf("a used ticket: %d %s", a.status, a.body)
	}
	if a := f.do(t, "", "GET", "/v1/sandboxes/other/exec/ws?argv=true&ticket="+issue(), ""); a.status != 401 {
		t.Errorf("a ticket on another sandbox's socket: %d %s", a.status, a.body)
	}
	if a := f.do(t, "", "GET", "/v1/sandboxes?ticket="+issue(), ""); a.status != 401 {
		t.Errorf("a ticket on another route: %d %s", a.status, a.body)
	}
	if a := f.do(t, "", "GET", "/v1/sandboxes/box/exec/ws?argv=true&ticket=nxt_made-up", ""); a.status != 401 {
		t.Errorf("a made-up ticket: %d %s", a.status, a.body)
	}
	if a := f.do(t, "", "GET", "/v1/sandboxes/box/exec/ws?argv=true&ticket="+issue(), "", "Origin", "https://evil.example"); a.status != 403 {
		t.Errorf("a ticket from a foreign Origin: %d %s", a.status, a.body)
	}
	var ts tickets
	id, _, _ := ts.issue(Token{Name: "x"}, "/p", time.Now())
	if _, ok := ts.take(id, "/p", time.Now().Add(ticketTTL+time.Second)); ok {
		t.Error("an expired ticket was taken")
	}
}
