package bus_test

import (
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/nats-io/nats.go/jetstream"
	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/internal/testutil"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/home"
)

// benchAudit is how many audit events the single host of BenchmarkMigrate holds.
const benchAudit = 5000

// BenchmarkMigrate: migrating a single host's audit stream into a two-node cluster on loopback
// (migrate), against publishing as many events straight into the cluster's stream one by one
// with an ack each (publish): the ratio of their ns/event is what the migration adds to the
// copy itself (reading the store's copy, headers, progress).
func BenchmarkMigrate(b *testing.B) {
	testutil.IsolateHome(b)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	ha, hb := home.Dir(b.TempDir()), home.Dir(b.TempDir())
	single, err := bus.StartServer(ctx, bus.ServerConfig{Home: ha, Port: -1, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	admin, err := bus.Connect(ctx, bus.ConnectConfig{Home: ha, User: bus.UserAdmin, URL: single.URL()})
	if err != nil {
		b.Fatal(err)
	}
	js, _ := jetstream.New(admin)
	body := []byte(`{"sandbox":"sb1","layer":"l7","decision":"allow","host":"example.com","port":443,"time":"2026-01-01T00:00:00Z"}`)
	for i := range benchAudit {
		if _, err := js.PublishAsync(fmt.Sprintf("%s.egress.sb%d", bus.AuditPrefix, i%8), body); err != nil {
			b.Fatal(err)
		}
	}
	<-js.PublishAsyncComplete()
	admin.Close()
	single.Shutdown()
	port := func() int {
		p, err := testutil.BusPort()
		if err != nil {
			b.Fatal(err)
		}
		return p
	}
	if _, err := bus.Init(bus.InitConfig{Home: ha, Name: "t", Host: "a", Advertise: "127.0.0.1", Listen: "127.0.0.1", ClientPort: port(), RoutePort: port()}); err != nil {
		b.Fatal(err)
	}
	aside := bus.SingleHostStore(ha)
	// Moved away before the first start: the bus does not migrate it by itself here.
	if err := os.Rename(aside, aside+".bench"); err != nil {
		b.Fatal(err)
	}
	aside += ".bench"
	a, err := bus.StartServer(ctx, bus.ServerConfig{Home: ha, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	defer a.Shutdown()
	clA, _, _ := bus.LoadCluster(ha)
	_, token, err := bus.CreateToken(ha, []string{clA.ClientURL()}, time.Hour)
	if err != nil {
		b.Fatal(err)
	}
	testutil.WaitFor(b, time.Minute, func() error {
		_, err := bus.Join(ctx, bus.JoinConfig{Home: hb, Token: token, Host: "b", Advertise: "127.0.0.1", Listen: "127.0.0.1", ClientPort: port(), RoutePort: port()})
		return err
	})
	n, err := bus.StartServer(ctx, bus.ServerConfig{Home: hb, Log: zerolog.Nop()})
	if err != nil {
		b.Fatal(err)
	}
	defer n.Shutdown()
	if err := a.WaitStore(ctx); err != nil {
		b.Fatal(err)
	}
	nc, err := bus.Connect(ctx, bus.ConnectConfig{Home: ha, User: bus.UserAdmin, URL: a.URL()})
	if err != nil {
		b.Fatal(err)
	}
	defer nc.Close()
	djs, _ := jetstream.New(nc)

	b.Run("publish", func(b *testing.B) {
		for b.Loop() {
			for i := range benchAudit {
				if _, err := djs.Publish(ctx, fmt.Sprintf("%s.egress.sb%d", bus.AuditPrefix, i%8), body); err != nil {
					b.Fatal(err)
				}
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchAudit), "ns/event")
	})
	b.Run("migrate", func(b *testing.B) {
		for b.Loop() {
			os.Remove(bus.MigratedMarker(aside))
			st, err := bus.Migrate(ctx, bus.MigrateConfig{From: aside, To: nc, Host: "a", Log: zerolog.Nop()})
			if err != nil || st.Audit != benchAudit {
				b.Fatalf("%+v: %v", st, err)
			}
		}
		b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*benchAudit), "ns/event")
	})
}
