package gateway

import (
	"encoding/json"
	"testing"
	"time"
)

// TestSandboxPageEncodesAsViews: a page written from records kept encoded is byte for byte
// what encoding the views field by field writes (what older gateways sent and every client
// decodes), whichever of the view's own fields are set, and for an empty page.
func TestSandboxPageEncodesAsViews(t *testing.T) {
	at := time.Date(2026, 12, 2, 16, 0, 0, 0, time.UTC)
	sb := Sandbox{ID: "sb-1", Name: "p/a<b>", State: StateRunning, Labels: map[string]string{"team": "x&y"}, Revision: 7, CreatedAt: at,
		Egress: Egress{Mode: EgressCurated, Allow: []string{"pypi.org"}}}
	views := []SandboxView{
		{Sandbox: sb},
		{Sandbox: sb, RSSBytes: 123 << 20},
		{Sandbox: sb, AuditLimited: &AuditLimit{Last: at, Suppressed: 9}},
		{Sandbox: sb, RSSBytes: 1, AuditLimited: &AuditLimit{Last: at}, Containment: "less contained: no <seccomp>"},
		{Sandbox: Sandbox{}, Containment: "contained"},
	}
	want, err := json.Marshal(views)
	if err != nil {
		t.Fatal(err)
	}
	page := make(SandboxPage, len(views))
	copy(page, views)
	for i := range page {
		if i%2 == 0 { // half kept encoded, half not
			enc, err := json.Marshal(&page[i].Sandbox)
			if err != nil {
				t.Fatal(err)
			}
			page[i].UseEncoded(enc)
		}
	}
	got, err := json.Marshal(page)
	if err != nil {
		t.Fatal(err)
	}
	if string(got) != string(want) {
		t.Fatalf("page:\n%s\nviews:\n%s", got, want)
	}
	var back []SandboxView
	if err := json.Unmarshal(got, &back); err != nil || len(back) != len(views) || back[3].Containment != views[3].Containment || back[0].Revision != 7 {
		t.Fatalf("page decoded: %+v (%v)", back, err)
	}
	for _, p := range []SandboxPage{{}, nil} {
		got, _ := json.Marshal(p)
		want, _ := json.Marshal([]SandboxView(p))
		if string(got) != string(want) {
			t.Errorf("page %#v: %s, want %s", p, got, want)
		}
	}
}

// TestArrayElements: a reply's array is split into its elements as written, whatever strings
// with brackets, commas and escaped quotes they hold; what is not a list is an error.
func TestArrayElements(t *testing.T) {
	for raw, want := range map[string][]string{
		`[]`:    {},
		` [ ] `: {},
		`null`:  nil,
		`[{"name":"a,]}\"{","x":[1,{"y":"]"}]} , [1,[2]],"s\\\",2" ,3]`: {`{"name":"a,]}\"{","x":[1,{"y":"]"}]}`, `[1,[2]]`, `"s\\\",2"`, `3`},
	} {
		got, err := arrayElements([]byte(raw))
		if err != nil || len(got) != len(want) {
			t.Errorf("arrayElements(%s) = %q (%v), want %q", raw, got, err, want)
			continue
		}
		for i := range want {
			if string(got[i]) != want[i] {
				t.Errorf("arrayElements(%s)[%d] = %s, want %s", raw, i, got[i], want[i])
			}
		}
	}
	for _, raw := range []string{`{}`, `"x"`, `[1,`, `[1`, ``} {
		if got, err := arrayElements([]byte(raw)); err == nil {
			t.Errorf("arrayElements(%s) = %q, want an error", raw, got)
		}
	}
}
