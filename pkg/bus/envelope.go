package bus

import (
	"encoding/json"
	"errors"
	"fmt"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Envelope is the one reply shape of every request on the bus:
// {"ok":true,"data":…} or {"ok":false,"error":{"code":"not_found","message":"…"}}.
type Envelope struct {
	OK    bool            `json:"ok"`
	Data  json.RawMessage `json:"data,omitempty"`
	Error *WireError      `json:"error,omitempty"`
}

// WireError is the error half of the envelope. Message is the user-facing sentence.
type WireError struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// JSONAppender is a reply that encodes itself: AppendJSON appends its JSON, valid and compact,
// to b. A large reply whose parts are kept encoded (a page of 2500 sandboxes) is then copied
// into its envelope rather than encoded again.
type JSONAppender interface {
	AppendJSON(b []byte) ([]byte, error)
}

// EncodeOK wraps data in a success envelope: {"ok":true,"data":…}, data as json.Marshal (or
// its AppendJSON) writes it.
func EncodeOK(data any) ([]byte, error) {
	b := []byte(`{"ok":true,"data":`)
	var err error
	if a, ok := data.(JSONAppender); ok {
		b, err = a.AppendJSON(b)
	} else {
		var raw []byte
		if raw, err = json.Marshal(data); err == nil {
			b = append(b, raw...)
		}
	}
	if err != nil {
		return nil, fmt.Errorf("encode reply: %w", err)
	}
	return append(b, '}'), nil
}

// EncodeError translates err to its wire code once, here at the edge.
func EncodeError(err error) []byte {
	b, _ := json.Marshal(Envelope{Error: &WireError{Code: errdefs.Code(err), Message: err.Error()}})
	return b
}

// Decode unwraps an envelope into out (which may be nil) or returns the classified error. The
// reply is read once: its data decoded into out as it is met.
func Decode(b []byte, out any) error {
	env := struct {
		OK    bool       `json:"ok"`
		Data  any        `json:"data,omitempty"`
		Error *WireError `json:"error,omitempty"`
	}{Data: new(skipped)}
	if out != nil {
		env.Data = out
	}
	if err := json.Unmarshal(b, &env); err != nil {
		var typeErr *json.UnmarshalTypeError
		if errors.As(err, &typeErr) {
			return fmt.Errorf("decode reply data: %w", errors.Join(errdefs.ErrInternal, err))
		}
		return fmt.Errorf("decode reply: %w", errors.Join(errdefs.ErrInternal, err))
	}
	if !env.OK {
		if env.Error == nil {
			return errdefs.New(errdefs.ErrInternal, "reply without ok or error")
		}
		return errdefs.FromCode(env.Error.Code, env.Error.Message)
	}
	return nil
}

// skipped is the data of a reply nobody reads: decoding it keeps nothing.
type skipped struct{}

func (skipped) UnmarshalJSON([]byte) error { return nil }
