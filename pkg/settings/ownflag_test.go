package settings

import (
	"testing"

	"github.com/spf13/pflag"
)

// TestCommandsOwnFlagIsNotTheSetting: a command's own flag that shares a setting's name
// (`nexus secret set NAME --host h1,h2`) is that command's, not the setting (--host, the
// machine's bus name, which a CLI command does not declare).
func TestCommandsOwnFlagIsNotTheSetting(t *testing.T) {
	fs := pflag.NewFlagSet("secret set", pflag.ContinueOnError)
	AddFlags(fs, Global)
	var hosts []string
	fs.StringSliceVar(&hosts, "host", nil, "the secret's hosts")
	if err := fs.Parse([]string{"--host", "api.github.com,uploads.github.com"}); err != nil {
		t.Fatal(err)
	}
	v, err := Load(fs)
	if err != nil {
		t.Fatalf("Load: %v", err)
	}
	if v.Host != "" || len(hosts) != 2 {
		t.Fatalf("host setting %q, command's hosts %v", v.Host, hosts)
	}
}
