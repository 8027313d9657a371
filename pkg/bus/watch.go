package bus

import (
	"context"
	"encoding/json"
	"errors"
	"strings"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// A request that waits for its reply watches the service that took it: the instances of the
// service that answered a ping shortly after the request was sent are pinged again each
// WatchEvery; once none of them exists any more (the service was killed, or restarted with a
// new identity), the reply can never come and the request ends at once instead of waiting out
// its deadline. A ping that goes unanswered (a loaded host) proves nothing and is ignored; only
// the bus's "no responders" counts.
var (
	// WatchAfter is how long a request waits before it looks for the instances that may have
	// taken it: a quick call costs nothing extra.
	WatchAfter = 250 * time.Millisecond
	// WatchEvery is how often those instances are pinged while the request waits.
	WatchEvery = time.Second
)

// errGone is the cause of a request ended because every instance that could answer it is gone.
type errGone struct {
	service     string // "the gateway service"
	replaced    bool   // another instance serves the subject now
	reconnected bool   // the bus connection was re-established meanwhile (a read is sent again)
}

func (e errGone) Error() string {
	if e.reconnected {
		return "the bus connection was re-established while this request waited"
	}
	if e.replaced {
		return e.service + " restarted while this request waited; its answer is lost"
	}
	return e.service + " stopped while this request waited"
}

// watched connections: those made with ConnectConfig.Watch (the CLI's, the MCP server's).
var watchedConns sync.Map // *nats.Conn → struct{}

// watched reports whether a request on nc to subject watches its responder, and the micro
// service name to ping.
func watched(nc *nats.Conn, subject string) (string, bool) {
	if _, ok := watchedConns.Load(nc); !ok {
		return "", false
	}
	if name := serviceName(subject); name != "" {
		return ServiceName(name), true
	}
	return "", false
}

// serviceName is the name of the service (as `nexus serve` knows it) behind a nexus subject.
func serviceName(subject string) string {
	scope := scopeOf(subject)
	if name, ok := scopeServices[scope]; ok {
		return name
	}
	return scope
}

// scopeServices names the service behind an API scope whose name differs from it.
var scopeServices = map[string]string{CredAPI.Name: "credbroker"}

// scopeOf is the scope of a nexus subject: nexus.gateway.sandbox.create → gateway.
func scopeOf(subject string) string {
	rest, ok := strings.CutPrefix(subject, "nexus.")
	if !ok {
		return ""
	}
	scope, _, _ := strings.Cut(rest, ".")
	return scope
}

// watchResponders pings the instances of the micro service name until ctx ends or all of them
// are gone; then it calls gone with the reason. For a read (again), a re-established bus
// connection ends the wait too: a reply sent meanwhile was lost.
func watchResponders(ctx context.Context, nc *nats.Conn, name, service string, again bool, gone func(errGone)) {
	t := time.NewTimer(WatchAfter)
	defer t.Stop()
	var ids []string
	reconnects := nc.Stats().Reconnects
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		t.Reset(WatchEvery)
		if !nc.IsConnected() {
			continue // the connection is being re-established; a closed one ends the request itself
		}
		if again && nc.Stats().Reconnects != reconnects {
			gone(errGone{service: service, reconnected: true})
			return
		}
		if ids == nil {
			found, none := pingAll(ctx, nc, "$SRV.PING."+name)
			if none {
				gone(errGone{service: service})
				return
			}
			ids = found // empty: the pings went unanswered; look again next time
			continue
		}
		if anyAlive(ctx, nc, name, ids) {
			continue
		}
		_, none := pingAll(ctx, nc, "$SRV.PING."+name)
		gone(errGone{service: service, replaced: !none})
		return
	}
}

// anyAlive reports whether any of the instances ids of service name may still be there: one
// that answers, or one whose ping is not refused for want of a responder.
func anyAlive(ctx context.Context, nc *nats.Conn, name string, ids []string) bool {
	for _, id := range ids {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := nc.RequestWithContext(pctx, "$SRV.PING."+name+"."+id, nil)
		cancel()
		if !errors.Is(err, nats.ErrNoResponders) {
			return true
		}
	}
	return false
}

// pingAll collects the ids of the instances answering subject: the replies that come within
// two seconds, until 50 ms pass without a new one. none says the bus itself answered that
// nobody serves it.
func pingAll(ctx context.Context, nc *nats.Conn, subject string) (ids []string, none bool) {
	inbox := nc.NewRespInbox()
	ch := make(chan *nats.Msg, 16)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, false
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, false
	}
	wait := time.NewTimer(2 * time.Second)
	defer wait.Stop()
	ids = []string{}
	for {
		select {
		case <-ctx.Done():
			return ids, false
		case <-wait.C:
			return ids, false
		case m := <-ch:
			if m.Header.Get("Status") == "503" {
				return nil, len(ids) == 0
			}
			var p micro.Ping
			if json.Unmarshal(m.Data, &p) == nil && p.ID != "" {
				ids = append(ids, p.ID)
				wait.Reset(50 * time.Millisecond)
			}
		}
	}
}

// lostReply turns the end of a request whose reply can no longer come into one sentence for
// the user: what happened and what to do.
func lostReply(subject string, err error) error {
	var gone errGone
	switch {
	case errors.As(err, &gone) && gone.replaced:
		return errdefs.Unavailable("%s restarted while it handled this request (%s), so its answer is lost: check the outcome (nexus ps) and run the command again", gone.service, subject)
	case errors.As(err, &gone):
		return errdefs.Unavailable("%s is not running: it stopped while it handled this request (%s); start it with `nexus up` (or `nexus serve %s`)", gone.service, subject, serviceName(subject))
	}
	return errdefs.Unavailable("lost the connection to the bus while waiting for %s (%s): nexus is not running; start it with `nexus up`", serviceOf(subject), subject)
}
