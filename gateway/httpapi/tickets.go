package httpapi

import (
	"crypto/rand"
	"encoding/hex"
	"net/http"
	"sync"
	"time"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// A browser cannot set Authorization on a WebSocket: it asks for a ticket with its token
// (POST …/exec/ticket) and opens the exec socket with ?ticket=, which stands for that token on
// that one route, once, for ticketTTL.
const (
	ticketTTL  = 30 * time.Second
	maxTickets = 1024
)

type ticket struct {
	token   Token
	path    string // the exec socket's path, unescaped
	expires time.Time
}

type tickets struct {
	mu sync.Mutex
	m  map[string]ticket
}

// issue mints a ticket for tok on path.
func (ts *tickets) issue(tok Token, path string, now time.Time) (string, time.Time, error) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	if ts.m == nil {
		ts.m = map[string]ticket{}
	}
	for k, t := range ts.m {
		if now.After(t.expires) {
			delete(ts.m, k)
		}
	}
	if len(ts.m) >= maxTickets {
		return "", time.Time{}, errdefs.Unavailable("too many exec tickets outstanding: use one, or wait %s", ticketTTL)
	}
	b := make([]byte, 24)
	rand.Read(b)
	id := "nxt_" + hex.EncodeToString(b)
	exp := now.Add(ticketTTL)
	ts.m[id] = ticket{token: tok, path: path, expires: exp}
	return id, exp, nil
}

// take consumes the ticket id for path: the token it stands for, or false when it is unknown,
// used, expired or for another path.
func (ts *tickets) take(id, path string, now time.Time) (Token, bool) {
	ts.mu.Lock()
	defer ts.mu.Unlock()
	t, ok := ts.m[id]
	if !ok {
		return Token{}, false
	}
	delete(ts.m, id)
	if now.After(t.expires) || t.path != path {
		return Token{}, false
	}
	return t.token, true
}

// TicketBody is the answer of POST …/exec/ticket.
type TicketBody struct {
	Ticket    string    `json:"ticket"`
	ExpiresAt time.Time `json:"expires_at"`
}

func execTicket(s *Service, w http.ResponseWriter, r *http.Request) error {
	tok, _ := callerOf(r.Context())
	id, exp, err := s.tickets.issue(tok, "/v1/sandboxes/"+r.PathValue("name")+"/exec/ws", time.Now())
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, TicketBody{Ticket: id, ExpiresAt: exp.UTC()})
	return nil
}

// ticketCaller is the token a request's exec ticket stands for, when it has no Authorization.
func (s *Service) ticketCaller(r *http.Request) (Token, bool) {
	id := r.URL.Query().Get("ticket")
	if id == "" || r.Method != http.MethodGet || r.Header.Get("Authorization") != "" {
		return Token{}, false
	}
	return s.tickets.take(id, r.URL.Path, time.Now())
}
