package main

import (
	"context"

	"github.com/nats-io/nats.go"

	"github.com/IniZio/nexus/gateway/cli"
	"github.com/IniZio/nexus/gateway/httpapi"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/settings"
	"github.com/IniZio/nexus/pkg/version"
)

// apiName is `nexus serve api`: the HTTP API, a client of the gateway like the CLI (bus user
// cli), so it is not one of bus.Services and `nexus up` runs it only when --api is given.
const apiName = "api"

// runAPI serves the HTTP API at addr (the settings' --api, else its default), dialling the bus
// at url (empty: the one the settings find) as user cli.
func runAPI(ctx context.Context, g *cli.Global, url string) error {
	addr := g.Settings.APIAddr
	if addr == "" {
		addr = settings.DefaultAPIAddr
	}
	log := g.Log.With().Str("service", apiName).Logger()
	svc, err := httpapi.New(httpapi.Config{
		Addr: addr, TLSCert: g.Settings.APITLSCert, TLSKey: g.Settings.APITLSKey,
		Home: g.Home, Log: log, Version: version.Version,
		Dial: func(ctx context.Context) (*nats.Conn, error) {
			cfg := g.Bus(bus.UserCLI)
			cfg.Reconnect = true
			if url != "" {
				cfg.URL = url
			}
			return bus.Connect(ctx, cfg)
		},
	})
	if err != nil {
		return cli.StartupError(err)
	}
	return svc.Run(ctx)
}
