package netstack

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/rs/zerolog"

	netapi "github.com/IniZio/nexus/pkg/api/netstack"
	"github.com/IniZio/nexus/pkg/audit"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/pkg/records"
)

type nopSink struct{}

func (nopSink) Emit(context.Context, audit.Event) {}

// TestRestoreRecordsOfEarlierBuilds: a restarted netstack brings back the network whose record
// an earlier build wrote ($NEXUS_HOME/netstack/<id>.json, compact JSON, written as <id>.json.tmp
// and renamed), and skips, logs and counts a torn record and a leftover temp file.
func TestRestoreRecordsOfEarlierBuilds(t *testing.T) {
	h := home.Dir(t.TempDir())
	dir := h.Networks()
	if err := os.MkdirAll(dir, 0o700); err != nil {
		t.Fatal(err)
	}
	sockDir, err := os.MkdirTemp("", "nsr")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { os.RemoveAll(sockDir) })
	sock := filepath.Join(sockDir, "net.sock")
	old := `{"sandbox_id":"sb-0a1b2c3d4e5f","sandbox_name":"default/old","mode":"curated","allow":[{"host":"api.test","ports":[8080]},{"host":"web.test"}],"repos":["acme/app"],"socket_path":"` + sock + `","proxy_token":"tok-old","dial":true}`
	for name, body := range map[string]string{
		"sb-0a1b2c3d4e5f.json":     old,
		"sb-torn00000000.json":     old[:len(old)/2],
		"sb-0a1b2c3d4e5f.json.tmp": old, // an interrupted write of an earlier build
	} {
		if err := os.WriteFile(filepath.Join(dir, name), []byte(body), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	var logs bytes.Buffer
	log := zerolog.New(&logs)
	svc, err := NewManager(ManagerConfig{Logger: zerolog.Nop(), Audit: nopSink{}, UpstreamDNS: "127.0.0.1:53"})
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(svc.Close)
	store, err := records.Open[netapi.Spec](dir, log)
	if err != nil {
		t.Fatal(err)
	}
	restore(context.Background(), svc, store, log)

	info, err := svc.Show("sb-0a1b2c3d4e5f")
	if err != nil {
		t.Fatalf("the earlier build's network was not restored: %v\n%s", err, logs.String())
	}
	if info.SandboxName != "default/old" || info.Mode != netapi.ModeCurated || len(info.Rules) != 2 || info.SocketPath != sock ||
		len(info.Repos) != 1 || info.Repos[0] != "acme/app" {
		t.Errorf("restored network: %+v", info)
	}
	if _, err := svc.Show("sb-torn00000000"); err == nil {
		t.Error("a network came back from a torn record")
	}
	// The restore removed the temp file: a second load skips only the torn record.
	loaded, err := store.Load()
	if err != nil || loaded.Skipped != 1 || len(loaded.Records) != 1 || loaded.Records[0].Value.ProxyToken != "tok-old" || !loaded.Records[0].Value.Dial {
		t.Errorf("load = %+v, %v; want the old record and 1 skipped", loaded, err)
	}
	if _, err := os.Stat(filepath.Join(dir, "sb-0a1b2c3d4e5f.json.tmp")); !os.IsNotExist(err) {
		t.Errorf("the interrupted write of the earlier build is left: %v", err)
	}
	if !strings.Contains(logs.String(), `"skipped":2`) || !strings.Contains(logs.String(), "network records skipped") {
		t.Errorf("the skips are not logged and counted:\n%s", logs.String())
	}
	if strings.Contains(logs.String(), "tok-old") {
		t.Error("the proxy token appears in the log")
	}
	// The record is rewritten in the new layout, still one 0600 file that loads.
	if err := store.Update("sb-0a1b2c3d4e5f", func(s *netapi.Spec) error { s.Mode = netapi.ModeNone; return nil }); err != nil {
		t.Fatal(err)
	}
	fi, err := os.Stat(filepath.Join(dir, "sb-0a1b2c3d4e5f.json"))
	if err != nil || fi.Mode().Perm() != 0o600 {
		t.Fatalf("record mode: %v, %v", fi, err)
	}
	if s, err := store.Get("sb-0a1b2c3d4e5f"); err != nil || s.Mode != netapi.ModeNone || s.ProxyToken != "tok-old" {
		t.Errorf("updated record: %+v, %v", s, err)
	}
}
