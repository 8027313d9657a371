package cli

import (
	"bytes"
	"os"
	"strings"
	"testing"
)

// Status 125 ("nexus failed, not your command") is documented where a user looks: in
// `nexus exec --help` and in the README, with the promise that a command whose caller's stream
// is lost is killed (issue 18).
func TestExecStatus125IsDocumented(t *testing.T) {
	root := NewRoot()
	var out bytes.Buffer
	root.SetOut(&out)
	root.SetErr(&out)
	root.SetArgs([]string{"exec", "--help"})
	if err := root.Execute(); err != nil {
		t.Fatal(err)
	}
	readme, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	for where, text := range map[string]string{"nexus exec --help": out.String(), "README.md": string(readme)} {
		flat := strings.Join(strings.Fields(text), " ")
		for _, want := range []string{"125 when nexus itself failed", "caller's stream is lost is killed, so a caller that retries after 125 never runs it twice"} {
			if !strings.Contains(flat, want) {
				t.Errorf("%s does not say %q", where, want)
			}
		}
	}
}
