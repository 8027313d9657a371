package vmm

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"sync"
	"time"

	"golang.org/x/time/rate"

	"github.com/IniZio/nexus/pkg/agentproto"
	gwapi "github.com/IniZio/nexus/pkg/api/gateway"
)

// nexus-why (issue 26): the guest's nexus-why dials host port agentproto.WhyPort through the
// agent's host-dial socket; the stream arrives here over the sandbox's own agent channel, so the
// sandbox is the machine's, whatever the guest says. One HTTP/1.0 exchange a stream, answered
// by the gateway (api.EgressWhy), bounded and rate-limited per sandbox.
const (
	// whyBurst and whyEvery bound the calls a guest makes: a burst, then one per whyEvery.
	whyBurst = 10
	whyEvery = time.Second
	// maxWhyConns bounds the nexus-why exchanges a sandbox has open at once.
	maxWhyConns = 4
	// maxWhyHead and maxWhyBody bound a request's head and body.
	maxWhyHead = 4 << 10
	maxWhyBody = 1 << 10
	// whyDeadline bounds one exchange, the gateway's answer included.
	whyDeadline = 10 * time.Second
)

// whyBudget is whyBurst calls, refilled at one per whyEvery; its zero value is ready.
type whyBudget struct {
	once sync.Once
	l    *rate.Limiter
}

// allow takes one call from the budget.
func (b *whyBudget) allow(now time.Time) bool {
	b.once.Do(func() { b.l = rate.NewLimiter(rate.Every(whyEvery), whyBurst) })
	return b.l.AllowN(now, 1)
}

// whyCaller asks the gateway; a field so that tests can stand in for it.
type whyCaller func(ctx context.Context, r gwapi.EgressWhyRequest) (status int, body any)

// whyServer serves the nexus-why streams of one sandbox.
type whyServer struct {
	id     string // the sandbox of the channel
	budget whyBudget
	sem    chan struct{}
	call   whyCaller
}

func newWhyServer(id string, call whyCaller) *whyServer {
	return &whyServer{id: id, sem: make(chan struct{}, maxWhyConns), call: call}
}

// gatewayWhy is the whyCaller of a running vmm: the gateway's answer, or why there is none.
func (s *Service) gatewayWhy(ctx context.Context, r gwapi.EgressWhyRequest) (int, any) {
	if s.cfg.Bus == nil {
		return http.StatusServiceUnavailable, agentproto.WhyAnswer{Message: "the host has no bus to ask"}
	}
	reply, err := gwapi.EgressWhy.Call(ctx, s.cfg.Bus, "", r)
	switch {
	case err != nil:
		msg, _, _ := strings.Cut(err.Error(), "\n")
		return http.StatusServiceUnavailable, agentproto.WhyAnswer{Message: "the gateway did not answer: " + agentproto.CleanGuestText(msg, 200)}
	case reply.Report != nil:
		return reply.Status, reply.Report
	}
	return reply.Status, agentproto.WhyAnswer{Message: reply.Message}
}

// serve answers one exchange on c and closes it.
func (w *whyServer) serve(ctx context.Context, c net.Conn) {
	defer c.Close()
	select {
	case w.sem <- struct{}{}:
		defer func() { <-w.sem }()
	default:
		return // too many at once
	}
	_ = c.SetDeadline(time.Now().Add(whyDeadline))
	status, body := w.answer(ctx, c)
	b, _ := json.Marshal(body)
	fmt.Fprintf(c, "HTTP/1.0 %d %s\r\nContent-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", status, http.StatusText(status), len(b), b)
}

func (w *whyServer) answer(ctx context.Context, c net.Conn) (int, any) {
	msg := func(s string) agentproto.WhyAnswer { return agentproto.WhyAnswer{Message: s} }
	req, err := http.ReadRequest(bufio.NewReader(io.LimitReader(c, maxWhyHead+maxWhyBody)))
	if err != nil {
		return http.StatusBadRequest, msg("not a nexus-why request")
	}
	if !w.budget.allow(time.Now()) {
		return http.StatusTooManyRequests, msg("too many nexus-why calls: wait a second")
	}
	call := gwapi.EgressWhyRequest{SandboxID: w.id}
	switch {
	case req.Method == http.MethodGet && req.URL.Path == agentproto.WhyPath:
	case req.Method == http.MethodPost && req.URL.Path == agentproto.WhyRequestPath:
		b, err := io.ReadAll(io.LimitReader(req.Body, maxWhyBody+1))
		var wr agentproto.WhyRequest
		if err != nil || len(b) > maxWhyBody || json.Unmarshal(b, &wr) != nil {
			return http.StatusBadRequest, msg("not a request: send {\"host\":..., \"port\":..., \"reason\":...} of at most 1 KiB")
		}
		call.Request = &wr
	default:
		return http.StatusNotFound, msg("not a nexus-why call: GET " + agentproto.WhyPath + " or POST " + agentproto.WhyRequestPath)
	}
	ctx, cancel := context.WithTimeout(ctx, whyDeadline-time.Second)
	defer cancel()
	return w.call(ctx, call)
}
