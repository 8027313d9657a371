package mitm

import (
	"strings"
	"testing"
)

func FuzzBasicAuth(f *testing.F) {
	f.Add("Basic " + "cHJvai9zYjE6dG9rZW4=")
	f.Add("basic Og==")
	f.Add("Basic !!!")
	f.Add("Bearer x")
	f.Fuzz(func(t *testing.T, h string) {
		user, pass, ok := basicAuth(h)
		if !ok && (user != "" || pass != "") {
			t.Fatal("failed parse returned values")
		}
	})
}

func FuzzNormalizeHost(f *testing.F) {
	for _, s := range []string{"API.Example.COM.", "[::1]", "127.0.0.1", "a..b", "evil\r\nx", ""} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		h, err := normalizeHost(s)
		if err != nil {
			return
		}
		if strings.ContainsAny(h, "\r\n \t:/") && !strings.Contains(h, ":") {
			t.Fatalf("unsafe host %q", h)
		}
		for _, c := range []byte(h) {
			if c < 0x21 || c > 0x7e {
				t.Fatalf("unprintable host %q", h)
			}
		}
		if h2, err := normalizeHost(h); err != nil || h2 != h {
			t.Fatalf("not idempotent: %q -> %q (%v)", h, h2, err)
		}
	})
}

func FuzzEachHex64(f *testing.F) {
	f.Add("x" + placeholder + "y")
	f.Add(placeholder + placeholder)
	f.Add(strings.Repeat("a", 63))
	f.Fuzz(func(t *testing.T, s string) {
		eachHex64(s, func(tok string) bool {
			if len(tok) != 64 || !strings.Contains(s, tok) {
				t.Fatalf("bad token %q", tok)
			}
			return true
		})
	})
}

func FuzzRequestHost(f *testing.F) {
	f.Add("api.example.com", "", "443")
	f.Add("api.example.com:8443", "api.example.com", "443")
	f.Add("[::1]:443", "", "443")
	f.Fuzz(func(t *testing.T, host, urlHost, port string) {
		h, ok := requestHost(host, urlHost, port)
		if ok && h == "" {
			t.Fatal("ok with empty host")
		}
		if ok && host != "" && urlHost != "" {
			a, _ := requestHost(host, "", port)
			b, _ := requestHost("", urlHost, port)
			if a != b {
				t.Fatalf("Host %q and URL host %q disagree but were taken", host, urlHost)
			}
		}
	})
}
