package bus

import (
	"context"
	"encoding/json"
	"strings"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/nats-io/nats.go/micro"
)

// ServicePrefix starts the bus name of every nexus service (ServiceName).
const ServicePrefix = "nexus-"

// Discover asks every service on the bus for its identity ($SRV.INFO) and collects the nexus
// services' answers until quiet passes with no new one, want distinct services answered (0: no
// such bound), or ctx ends.
func Discover(ctx context.Context, nc *nats.Conn, quiet time.Duration, want int) ([]micro.Info, error) {
	names := map[string]bool{}
	return collectInfo(ctx, nc, "$SRV.INFO", quiet, func(info micro.Info) (keep, enough bool) {
		if !strings.HasPrefix(info.Name, ServicePrefix) {
			return false, false
		}
		names[info.Name] = true
		return true, want > 0 && len(names) >= want
	})
}

// instances are the $SRV.INFO answers of the instances of the micro service name, collected
// until quiet passes without a new one or ctx ends (at most 64).
func instances(ctx context.Context, nc *nats.Conn, name string, quiet time.Duration) []micro.Info {
	n := 0
	out, _ := collectInfo(ctx, nc, "$SRV.INFO."+name, quiet, func(info micro.Info) (keep, enough bool) {
		if info.Name != name {
			return false, false
		}
		n++
		return true, n >= 64
	})
	return out
}

// collectInfo sends one request on subject (a $SRV.INFO one) and collects the answers take
// keeps, until quiet passes with no new answer, take says it has enough, or ctx ends.
func collectInfo(ctx context.Context, nc *nats.Conn, subject string, quiet time.Duration, take func(micro.Info) (keep, enough bool)) ([]micro.Info, error) {
	inbox := nc.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest(subject, inbox, nil); err != nil {
		return nil, err
	}
	var out []micro.Info
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	for {
		select {
		case m := <-ch:
			var info micro.Info
			if json.Unmarshal(m.Data, &info) != nil {
				continue
			}
			keep, enough := take(info)
			if keep {
				out = append(out, info)
				timer.Reset(quiet)
			}
			if enough {
				return out, nil
			}
		case <-timer.C:
			return out, nil
		case <-ctx.Done():
			return out, nil
		}
	}
}
