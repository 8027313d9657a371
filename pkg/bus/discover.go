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
	inbox := nc.NewRespInbox()
	ch := make(chan *nats.Msg, 64)
	sub, err := nc.ChanSubscribe(inbox, ch)
	if err != nil {
		return nil, err
	}
	defer sub.Unsubscribe()
	if err := nc.PublishRequest("$SRV.INFO", inbox, nil); err != nil {
		return nil, err
	}
	var out []micro.Info
	names := map[string]bool{}
	timer := time.NewTimer(quiet)
	defer timer.Stop()
	for want == 0 || len(names) < want {
		select {
		case m := <-ch:
			var info micro.Info
			if json.Unmarshal(m.Data, &info) != nil || !strings.HasPrefix(info.Name, ServicePrefix) {
				continue
			}
			out = append(out, info)
			names[info.Name] = true
			timer.Reset(quiet)
		case <-timer.C:
			return out, nil
		case <-ctx.Done():
			return out, nil
		}
	}
	return out, nil
}
