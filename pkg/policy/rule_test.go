package policy

import "testing"

func TestRuleStringRoundTrips(t *testing.T) {
	for _, in := range []string{"api.example.com", "db.example.com:5432", "*.example.org", "10.0.0.1:22"} {
		r, err := ParseRule(in)
		if err != nil {
			t.Fatal(err)
		}
		back, err := ParseRule(r.String())
		if err != nil || back.String() != r.String() {
			t.Errorf("%s → %s → %v %v", in, r.String(), back, err)
		}
	}
}
