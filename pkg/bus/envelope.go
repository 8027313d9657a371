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

// EncodeOK wraps data in a success envelope.
func EncodeOK(data any) ([]byte, error) {
	raw, err := json.Marshal(data)
	if err != nil {
		return nil, fmt.Errorf("encode reply: %w", err)
	}
	return json.Marshal(Envelope{OK: true, Data: raw})
}

// EncodeError translates err to its wire code once, here at the edge.
func EncodeError(err error) []byte {
	b, _ := json.Marshal(Envelope{Error: &WireError{Code: errdefs.Code(err), Message: err.Error()}})
	return b
}

// Decode unwraps an envelope into out (which may be nil) or returns the classified error.
func Decode(b []byte, out any) error {
	var env Envelope
	if err := json.Unmarshal(b, &env); err != nil {
		return fmt.Errorf("decode reply: %w", errors.Join(errdefs.ErrInternal, err))
	}
	if !env.OK {
		if env.Error == nil {
			return errdefs.New(errdefs.ErrInternal, "reply without ok or error")
		}
		return errdefs.FromCode(env.Error.Code, env.Error.Message)
	}
	if out == nil || len(env.Data) == 0 {
		return nil
	}
	if err := json.Unmarshal(env.Data, out); err != nil {
		return fmt.Errorf("decode reply data: %w", errors.Join(errdefs.ErrInternal, err))
	}
	return nil
}
