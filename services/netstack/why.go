package netstack

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"sync"
	"time"

	"gvisor.dev/gvisor/pkg/tcpip"
	"gvisor.dev/gvisor/pkg/tcpip/adapters/gonet"
	"gvisor.dev/gvisor/pkg/tcpip/network/ipv4"

	"github.com/IniZio/nexus/pkg/agentproto"
	netstackapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/netaddr"
	"github.com/IniZio/nexus/pkg/policy"
)

// nexus-why (agentproto.WhyPort): the guest asks why its connections were refused. The service
// listens inside this network's own gvisor stack on the gateway address, so only this sandbox
// reaches it, and it answers from this network's own decisions: it dials nothing.
const (
	// whyKeep is how many recent refusals a network keeps for nexus-why.
	whyKeep = 32
	// whyBurst and whyEvery bound the calls a guest makes: a burst, then one per whyEvery.
	whyBurst = 10
	whyEvery = time.Second
	// maxWhyConns bounds the connections the service has open at once.
	maxWhyConns = 4
	maxWhyBody  = 1 << 10
)

// whyLog keeps a network's recent refusals and the call budget of its nexus-why service.
type whyLog struct {
	mu     sync.Mutex
	evs    []audit.Event // ring of whyKeep, oldest at next once full
	next   int
	tokens float64
	last   time.Time
}

func (w *whyLog) add(ev audit.Event) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if len(w.evs) < whyKeep {
		w.evs = append(w.evs, ev)
		return
	}
	w.evs[w.next] = ev
	w.next = (w.next + 1) % whyKeep
}

// recent is the kept refusals, oldest first.
func (w *whyLog) recent() []audit.Event {
	w.mu.Lock()
	defer w.mu.Unlock()
	return append(append([]audit.Event(nil), w.evs[w.next:]...), w.evs[:w.next]...)
}

// allow takes one call from the budget.
func (w *whyLog) allow(now time.Time) bool {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.last.IsZero() {
		w.tokens = whyBurst
	} else {
		w.tokens = min(whyBurst, w.tokens+float64(now.Sub(w.last))/float64(whyEvery))
	}
	w.last = now
	if w.tokens < 1 {
		return false
	}
	w.tokens--
	return true
}

// noteRefusal keeps a refusal of the guest's traffic for nexus-why (not budget delays, which
// are allowed, nor anything the network did on its own).
func (n *network) noteRefusal(ev audit.Event) {
	if ev.Decision != audit.Deny || ev.Layer == audit.LayerPolicy {
		return
	}
	n.why.add(ev)
}

// startWhy serves nexus-why on the gateway address inside the network's stack.
func (n *network) startWhy() error {
	gw := tcpip.FullAddress{NIC: nicID, Addr: tcpip.AddrFrom4(gatewayAddr.As4()), Port: agentproto.WhyPort}
	ln, err := gonet.ListenTCP(n.stack, gw, ipv4.ProtocolNumber)
	if err != nil {
		return fmt.Errorf("nexus-why listener: %w", err)
	}
	mux := http.NewServeMux()
	mux.HandleFunc("GET "+agentproto.WhyPath, n.serveWhy)
	mux.HandleFunc("POST "+agentproto.WhyRequestPath, n.serveWhyRequest)
	n.whySrv = &http.Server{
		Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if !n.why.allow(time.Now()) {
				whyReply(w, http.StatusTooManyRequests, "too many nexus-why calls: wait a second")
				return
			}
			r.Body = http.MaxBytesReader(w, r.Body, maxWhyBody)
			mux.ServeHTTP(w, r)
		}),
		ReadHeaderTimeout: 2 * time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second,
		IdleTimeout: 10 * time.Second, MaxHeaderBytes: 4 << 10,
	}
	n.wg.Add(1)
	go func() {
		defer n.wg.Done()
		_ = n.whySrv.Serve(&limitListener{Listener: ln, sem: make(chan struct{}, maxWhyConns)})
	}()
	return nil
}

// limitListener accepts at most cap(sem) connections at once; past it a new one is closed.
type limitListener struct {
	net.Listener
	sem chan struct{}
}

func (l *limitListener) Accept() (net.Conn, error) {
	for {
		c, err := l.Listener.Accept()
		if err != nil {
			return nil, err
		}
		select {
		case l.sem <- struct{}{}:
			return &limitConn{Conn: c, release: func() { <-l.sem }}, nil
		default:
			c.Close()
		}
	}
}

type limitConn struct {
	net.Conn
	once    sync.Once
	release func()
}

func (c *limitConn) Close() error {
	c.once.Do(c.release)
	return c.Conn.Close()
}

func whyReply(w http.ResponseWriter, status int, msg string) {
	writeWhy(w, status, agentproto.WhyAnswer{Message: msg})
}

func writeWhy(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

func (n *network) serveWhy(w http.ResponseWriter, _ *http.Request) {
	pol, _ := n.policy()
	rep := agentproto.WhyReport{Sandbox: n.name, Mode: effectiveMode(pol, time.Now()), Ask: pol.Ask, Denials: []agentproto.WhyDenial{}}
	for _, ev := range n.why.recent() {
		rep.Denials = append(rep.Denials, agentproto.WhyDenial{Time: ev.Time, Layer: ev.Layer, Proto: ev.Proto, Host: ev.Host, IP: ev.IP,
			Port: ev.Port, Rule: ev.Rule, Reason: ev.Reason, Fix: n.fixFor(ev, pol)})
	}
	writeWhy(w, http.StatusOK, rep)
}

// fixFor says what would allow a refused ev: the owner's command or config key, or a request.
func (n *network) fixFor(ev audit.Event, pol Policy) string {
	target, port, dns := ev.Host, ev.Port, ev.Layer == audit.LayerDNS
	if dns {
		port = 0 // a name: every port of it is asked for with the name
	}
	if target == "" {
		target = ev.IP
	}
	if port != 0 && port != 443 && port != 80 {
		target = fmt.Sprintf("%s:%d", target, port)
	}
	switch {
	case pol.Mode == netstackapi.ModeNone:
		return "the sandbox has egress none; its owner creates it again with --allow-host"
	case ev.Rule == RuleMaxConns || ev.Rule == RuleConnRate || ev.Rule == RuleDNSRate:
		return "a limit (egress.limits in .nexus/config.yaml): slow down or open fewer connections"
	case ev.Rule == RuleAllowAllExpired:
		return "the allow-all window ended; its owner runs `nexus egress allow " + n.name + " HOST` for what is still needed"
	case ev.Rule == policy.RuleDenied:
		return "the owner denied " + ev.Host + "; only they lift it: `nexus egress revoke " + n.name + " " + ev.Host + "`"
	case ev.Rule == netaddr.Rule:
		return "a private or host address; it opens only with --allow-private at create"
	case target == "" || (dns && ev.IP != "" && ev.IP != GatewayIP) || (!dns && (ev.IP == GatewayIP || ev.Port == 53)):
		return "use the gateway resolver " + GatewayIP + " and names, not addresses"
	}
	fix := "its owner runs `nexus egress allow " + n.name + " " + target + "` (or adds it to egress.allow in .nexus/config.yaml and runs `nexus egress apply " + n.name + "`)"
	if pol.Ask {
		fix += "; or ask: `nexus-why request " + target + " \"why you need it\"`"
	}
	return fix
}

func (n *network) serveWhyRequest(w http.ResponseWriter, r *http.Request) {
	var req agentproto.WhyRequest
	if err := json.NewDecoder(r.Body).Decode(&req); err != nil {
		whyReply(w, http.StatusBadRequest, "not a request: send {\"host\":..., \"port\":..., \"reason\":...} of at most 1 KiB")
		return
	}
	host, err := policy.NormalizeHost(req.Host)
	if err != nil || req.Port < 0 || req.Port > 65535 {
		whyReply(w, http.StatusBadRequest, "not a host[:port] to request")
		return
	}
	pol, allow := n.policy()
	want := host
	if req.Port != 0 {
		want = fmt.Sprintf("%s:%d", host, req.Port)
	}
	_, allowed := allow.MatchName(host)
	if req.Port != 0 {
		_, allowed = allow.Match(host, req.Port)
	}
	switch _, denied := allow.Denied(host); {
	case allowed:
		whyReply(w, http.StatusOK, want+" is allowed already")
	case denied:
		whyReply(w, http.StatusForbidden, host+" is denied by the sandbox's owner; a request cannot lift that")
	case !pol.Ask || effectiveMode(pol, time.Now()) != netstackapi.ModeCurated:
		whyReply(w, http.StatusConflict, "this sandbox is not in ask mode: ask its owner to run `nexus egress allow "+n.name+" "+want+"`")
	default:
		if f := n.svc.cfg.OnRequest; f != nil {
			f(netstackapi.EgressRequest{SandboxID: n.id, SandboxName: n.name, Host: host, Port: req.Port, Reason: agentproto.CleanGuestText(req.Reason, agentproto.MaxWhyReason), Time: time.Now().UTC()})
		}
		whyReply(w, http.StatusAccepted, "asked for "+want+": the owner sees it with `nexus egress requests` and answers with `nexus egress approve|reject ID`")
	}
}
