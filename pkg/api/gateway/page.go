package gateway

import (
	"encoding/json"
	"errors"
	"strconv"
)

// SandboxPage is one List reply: sandbox views in name order, on the wire a JSON array of them.
// A page of views whose records the gateway keeps encoded (UseEncoded) is written by copying
// those bytes (bus.JSONAppender), not by encoding 2500 records field by field per call.
type SandboxPage []SandboxView

// UseEncoded says that sandboxJSON is v.Sandbox as json.Marshal writes it, so that a page
// copies it rather than encoding the record again. v.Sandbox must not change afterwards.
func (v *SandboxView) UseEncoded(sandboxJSON []byte) { v.encoded = sandboxJSON }

// AppendJSON appends the page as json.Marshal([]SandboxView(p)) writes it.
func (p SandboxPage) AppendJSON(b []byte) ([]byte, error) {
	if p == nil {
		return append(b, "null"...), nil
	}
	b = append(b, '[')
	for i := range p {
		if i > 0 {
			b = append(b, ',')
		}
		var err error
		if b, err = p[i].appendJSON(b); err != nil {
			return nil, err
		}
	}
	return append(b, ']'), nil
}

// MarshalJSON is AppendJSON for json.Marshal.
func (p SandboxPage) MarshalJSON() ([]byte, error) { return p.AppendJSON(nil) }

// appendJSON appends v as json.Marshal writes a SandboxView: the embedded Sandbox's fields,
// then the view's own, each left out when empty (omitempty).
func (v *SandboxView) appendJSON(b []byte) ([]byte, error) {
	sb := v.encoded
	if len(sb) < 2 || sb[0] != '{' || sb[len(sb)-1] != '}' {
		var err error
		if sb, err = json.Marshal(&v.Sandbox); err != nil {
			return nil, err
		}
	}
	b = append(b, sb[:len(sb)-1]...)
	more := len(sb) > 2 // a field of the record came before
	field := func(name string) {
		if more {
			b = append(b, ',')
		}
		more = true
		b = append(b, '"')
		b = append(b, name...)
		b = append(b, `":`...)
	}
	if v.RSSBytes != 0 {
		field("rss_bytes")
		b = strconv.AppendInt(b, v.RSSBytes, 10)
	}
	if v.AuditLimited != nil {
		raw, err := json.Marshal(v.AuditLimited)
		if err != nil {
			return nil, err
		}
		field("audit_limited")
		b = append(b, raw...)
	}
	if v.Containment != "" {
		raw, err := json.Marshal(v.Containment)
		if err != nil {
			return nil, err
		}
		field("containment")
		b = append(b, raw...)
	}
	return append(b, '}'), nil
}

// arrayElements splits raw, a valid JSON array (a reply the bus decoder has checked), into its
// elements, each as it is written there; anything but an array is an error.
func arrayElements(raw []byte) ([][]byte, error) {
	i := skipSpace(raw, 0)
	if i == len(raw) || raw[i] != '[' {
		if string(raw[i:]) == "null" {
			return nil, nil
		}
		return nil, errors.New("the reply is not a list")
	}
	var out [][]byte
	i = skipSpace(raw, i+1)
	if i < len(raw) && raw[i] == ']' {
		return out, nil
	}
	for i < len(raw) {
		start, depth, inString := i, 0, false
	elem:
		for ; i < len(raw); i++ {
			c := raw[i]
			switch {
			case inString && c == '\\':
				i++ // the escaped byte
			case inString:
				inString = c != '"'
			case c == '"':
				inString = true
			case c == '{' || c == '[':
				depth++
			case c == '}' || c == ']':
				if depth == 0 {
					break elem // the array's own ]
				}
				depth--
			case c == ',' && depth == 0:
				break elem
			}
		}
		end := i
		for end > start && isSpace(raw[end-1]) {
			end--
		}
		if i == len(raw) || end == start {
			return nil, errors.New("the reply is not a well-formed list")
		}
		out = append(out, raw[start:end])
		if raw[i] == ']' {
			return out, nil
		}
		i = skipSpace(raw, i+1)
	}
	return nil, errors.New("the reply is not a well-formed list")
}

func skipSpace(b []byte, i int) int {
	for i < len(b) && isSpace(b[i]) {
		i++
	}
	return i
}

func isSpace(c byte) bool { return c == ' ' || c == '\t' || c == '\n' || c == '\r' }
