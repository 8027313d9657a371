package config

import (
	"reflect"
	"strings"
	"testing"
)

func TestAllowPrivate(t *testing.T) {
	c, err := Parse("c.yaml", []byte("version: 1\negress:\n  allow: [db.internal:5432]\n  allow_private:\n    - 10.20.0.0/16\n    - 100.64.0.9\n"))
	if err != nil {
		t.Fatal(err)
	}
	if want := []string{"10.20.0.0/16", "100.64.0.9"}; !reflect.DeepEqual(c.Egress.AllowPrivate, want) {
		t.Errorf("allow_private = %v, want %v", c.Egress.AllowPrivate, want)
	}
	if err := c.Validate(); err != nil {
		t.Errorf("Validate: %v", err)
	}
	for yaml, want := range map[string]string{
		"version: 1\negress:\n  allow_private: [0.0.0.0/0]\n":       "nexus config: c.yaml:3: egress.allow_private: invalid --allow-private \"0.0.0.0/0\": it reaches public addresses",
		"version: 1\negress:\n  allow_private:\n    - nope\n":       "nexus config: c.yaml:4: egress.allow_private: invalid --allow-private \"nope\"",
		"version: 1\negress:\n  allow_private: 10.0.0.0/8\n":        "nexus config: c.yaml:3: egress.allow_private: want a list",
		"version: 1\negress:\n  allow_private: [8.8.8.8]\n":         "egress.allow_private: invalid --allow-private \"8.8.8.8\"",
		"version: 1\negress:\n  allow_private: [\"fd00::/8\", x]\n": "nexus config: c.yaml:3: egress.allow_private: invalid --allow-private \"x\"",
	} {
		_, err := Parse("c.yaml", []byte(yaml))
		if err == nil || !strings.HasPrefix(err.Error(), want) && !strings.Contains(err.Error(), want) {
			t.Errorf("%q: %v, want %q", yaml, err, want)
		}
	}
	bad := &Config{Version: 1, Egress: Egress{AllowPrivate: []string{"8.8.0.0/16"}}}
	if err := bad.Validate(); err == nil || !strings.Contains(err.Error(), "egress.allow_private") {
		t.Errorf("Validate of a public allow_private: %v", err)
	}
}
