package bus

import (
	"context"
	"errors"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
)

// ConnectConfig says who connects to which bus.
type ConnectConfig struct {
	Home home.Dir
	User string
	URL  string // empty: ReadURL(Home, Port)
	Port int    // the bus port when the bus wrote no URL (it is down); 0: DefaultPort
	Name string // connection name shown by the server; defaults to the user
	// Log receives asynchronous bus errors (permission violations, slow consumers).
	Log zerolog.Logger
	// Reconnect keeps retrying forever after the first connection (long-running services).
	Reconnect bool
	// Watch makes each request on the connection watch the service that took it, and end at
	// once when that service is gone (the CLI's connection: see watchResponders).
	Watch bool
}

// Connect dials the bus as one user with that user's credentials and private inbox prefix.
// It fails with one clear sentence naming the bus URL when no bus answers.
func Connect(ctx context.Context, cfg ConnectConfig) (*nats.Conn, error) {
	url := cfg.URL
	if url == "" {
		url, _ = ReadURL(cfg.Home, cfg.Port)
	}
	creds, err := LoadCreds(cfg.Home.BusCreds(), cfg.User)
	if err != nil {
		return nil, errdefs.Unavailable("nexus: no bus credentials for %q under %s: start the bus first with `nexus up` (or `nexus serve bus`)", cfg.User, cfg.Home.BusCreds())
	}
	name := cfg.Name
	if name == "" {
		name = "nexus-" + cfg.User
	}
	opts := []nats.Option{
		nats.Name(name),
		nats.UserInfo(creds.User, creds.Password),
		nats.CustomInboxPrefix(InboxPrefix(cfg.User)),
		nats.Timeout(3 * time.Second),
		nats.ErrorHandler(func(_ *nats.Conn, sub *nats.Subscription, err error) {
			ev := cfg.Log.Warn().Err(err).Str("user", cfg.User)
			if sub != nil {
				ev = ev.Str("subject", sub.Subject)
			}
			ev.Msg("bus error")
		}),
		nats.ClosedHandler(func(nc *nats.Conn) { watchedConns.Delete(nc) }),
	}
	// A cluster node's bus speaks TLS only, on loopback too: trust its cluster's CA.
	if tlsCfg, err := ClientTLS(cfg.Home); err != nil {
		return nil, errdefs.Unavailable("nexus: %v", err)
	} else if tlsCfg != nil {
		opts = append(opts, nats.Secure(tlsCfg))
	}
	if cfg.Reconnect {
		opts = append(opts, nats.MaxReconnects(-1), nats.ReconnectWait(250*time.Millisecond), nats.RetryOnFailedConnect(false))
	} else {
		// Long enough to ride out a restart of the stack (about a second or two): a call in
		// flight then learns what became of it (watchResponders) instead of "connection closed".
		opts = append(opts, nats.MaxReconnects(16), nats.ReconnectWait(250*time.Millisecond))
	}
	nc, err := nats.Connect(url, opts...)
	if err != nil {
		if errors.Is(err, nats.ErrAuthorization) {
			return nil, errdefs.Refused("nexus: the bus at %s rejected the credentials of %q (were they regenerated? restart the services)", url, cfg.User)
		}
		return nil, errdefs.Unavailable("nexus: no bus at %s: start it with `nexus up` (or `nexus serve bus`)", url)
	}
	_ = ctx
	if cfg.Watch {
		watchedConns.Store(nc, struct{}{})
	}
	return nc, nil
}
