package credbroker

import (
	"os"
	"path/filepath"
	"testing"

	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
)

// The credentials file is live-mounted into guests, so its bytes are untrusted.
func FuzzReadCreds(f *testing.F) {
	f.Add([]byte(`{"claudeAiOauth":{"accessToken":"a","refreshToken":"r","expiresAt":1}}`))
	f.Add([]byte(`{"claudeAiOauth":[]}`))
	f.Add([]byte(`{"claudeAiOauth":{"expiresAt":"soon"}}`))
	f.Add([]byte(`null`))
	f.Add([]byte(`{"claudeAiOauth":null}`))
	dir := f.TempDir()
	f.Fuzz(func(t *testing.T, b []byte) {
		path := filepath.Join(dir, "c.json")
		if err := os.WriteFile(path, b, 0o600); err != nil {
			t.Fatal(err)
		}
		top, oauth, _, _, err := readCreds(path)
		if err == nil && (top == nil || oauth == nil) {
			t.Fatal("nil maps without an error")
		}
	})
}

func FuzzHostEnvPrefix(f *testing.F) {
	f.Add("api.github.com")
	f.Add("xn--bcher-kva.example")
	f.Fuzz(func(t *testing.T, h string) {
		p := credapi.HostEnvPrefix(h)
		for _, c := range p {
			if !(c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '_') {
				t.Fatalf("bad env name %q", p)
			}
		}
	})
}
