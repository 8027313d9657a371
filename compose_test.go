package main

import (
	"bytes"
	"os"
	"strings"
	"testing"

	"github.com/spf13/cobra"

	"github.com/IniZio/nexus/gateway/cli"
	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/settings"
)

// root is the nexus command as main builds it.
func root() *cobra.Command {
	r := cli.NewRoot()
	r.AddCommand(upCommand(), serveCommand())
	return r
}

// TestHelpListsEverySetting: `nexus up --help` and `nexus serve --help` document every
// setting of the table, with its flag and its environment variable.
func TestHelpListsEverySetting(t *testing.T) {
	for _, args := range [][]string{{"up", "--help"}, {"serve", "--help"}} {
		r := root()
		var out bytes.Buffer
		r.SetOut(&out)
		r.SetArgs(args)
		if err := r.Execute(); err != nil {
			t.Fatalf("nexus %v: %v", args, err)
		}
		for _, s := range settings.Table {
			if !strings.Contains(out.String(), "--"+s.Flag+" ") || !strings.Contains(out.String(), "$"+s.Env) {
				t.Errorf("nexus %s does not list --%s ($%s):\n%s", strings.Join(args, " "), s.Flag, s.Env, out.String())
			}
		}
	}
}

// TestPortIsBusPort: --port, the old flag of up and serve, still sets the bus port.
func TestPortIsBusPort(t *testing.T) {
	t.Setenv("NEXUS_BUS_PORT", "")
	for _, name := range []string{"up", "serve"} {
		r := root()
		cmd, _, err := r.Find([]string{name})
		if err != nil {
			t.Fatal(err)
		}
		cmd.InheritedFlags() // merges the root's persistent flags, as Execute does
		if err := cmd.ParseFlags([]string{"--port", "4999"}); err != nil {
			t.Fatalf("%s --port: %v", name, err)
		}
		g, err := cli.Globals(cmd)
		if err != nil {
			t.Fatal(err)
		}
		if g.Settings.BusPort != 4999 {
			t.Errorf("%s --port 4999: bus port %d", name, g.Settings.BusPort)
		}
	}
}

// TestEveryServiceComposed: the root knows how to run every service of bus.Services, and no
// other.
func TestEveryServiceComposed(t *testing.T) {
	runs := runners()
	for _, name := range bus.Services {
		if _, ok := runs[name]; !ok && name != bus.UserBus {
			t.Errorf("bus.Services lists %s, which the composition root does not run", name)
		}
	}
	if len(runs) != len(bus.Services)-1 {
		t.Errorf("the root runs %d services, bus.Services lists %d besides the bus", len(runs), len(bus.Services)-1)
	}
	if got := len(components()); got != len(bus.Services)-1 {
		t.Errorf("components() = %d services, want %d", got, len(bus.Services)-1)
	}
}

// TestProcfile: the Procfile runs every service of bus.Services once, and the HTTP API, as
// `name: bin/nexus serve name`, and nothing else.
func TestProcfile(t *testing.T) {
	b, err := os.ReadFile("Procfile")
	if err != nil {
		t.Fatal(err)
	}
	got := map[string]int{}
	for i, line := range strings.Split(string(b), "\n") {
		if strings.TrimSpace(line) == "" || strings.HasPrefix(strings.TrimSpace(line), "#") {
			continue
		}
		name, cmd, ok := strings.Cut(line, ":")
		if !ok || strings.TrimSpace(cmd) != "bin/nexus serve "+name {
			t.Errorf("Procfile line %d %q: want `name: bin/nexus serve name`", i+1, line)
			continue
		}
		got[name]++
	}
	for _, name := range append(append([]string{}, bus.Services...), apiName) {
		if got[name] != 1 {
			t.Errorf("Procfile runs %s %d times, want once", name, got[name])
		}
		delete(got, name)
	}
	for name := range got {
		t.Errorf("Procfile runs %s, which is not in bus.Services (nor the API)", name)
	}
}
