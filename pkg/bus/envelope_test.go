package bus_test

import (
	"encoding/json"
	"errors"
	"testing"

	"github.com/IniZio/nexus/pkg/bus"
	"github.com/IniZio/nexus/pkg/errdefs"
)

type appended []string

func (a appended) AppendJSON(b []byte) ([]byte, error) {
	raw, err := json.Marshal([]string(a))
	return append(b, raw...), err
}

// TestEnvelopeRoundTrip: a reply encoded by EncodeOK (marshalled, or appending itself) is valid
// JSON with ok and data, and decodes in one read into the caller's value; an error reply
// decodes to its classified error; a reply of the wrong shape is an internal error.
func TestEnvelopeRoundTrip(t *testing.T) {
	type rec struct {
		Name string `json:"name"`
		N    int    `json:"n"`
	}
	for _, v := range []any{[]rec{{"a", 1}, {"b<&>", 2}}, appended{"x", "y"}} {
		b, err := bus.EncodeOK(v)
		if err != nil {
			t.Fatal(err)
		}
		var env bus.Envelope
		if err := json.Unmarshal(b, &env); err != nil || !env.OK {
			t.Fatalf("EncodeOK(%v) = %s: not an ok envelope (%v)", v, b, err)
		}
		want, _ := json.Marshal(v)
		if _, ok := v.(appended); ok {
			want, _ = json.Marshal([]string(v.(appended)))
		}
		if string(env.Data) != string(want) {
			t.Errorf("EncodeOK(%v) data %s, want %s", v, env.Data, want)
		}
		if err := bus.Decode(b, nil); err != nil {
			t.Errorf("Decode into nil: %v", err)
		}
	}
	b, _ := bus.EncodeOK([]rec{{"a", 1}, {"b", 2}})
	var got []rec
	if err := bus.Decode(b, &got); err != nil || len(got) != 2 || got[1] != (rec{"b", 2}) {
		t.Errorf("Decode: %v %v", got, err)
	}
	var wrong map[string]int
	if err := bus.Decode(b, &wrong); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("Decode of a list into a map: %v, want an internal error", err)
	}
	err := bus.Decode(bus.EncodeError(errdefs.NotFound("no sandbox named x")), &got)
	if !errors.Is(err, errdefs.ErrNotFound) || err.Error() != "no sandbox named x" {
		t.Errorf("Decode of an error reply: %v", err)
	}
	if err := bus.Decode([]byte(`{"ok":false}`), &got); !errors.Is(err, errdefs.ErrInternal) {
		t.Errorf("Decode of a reply without ok or error: %v", err)
	}
}
