package httppolicy

import (
	"bytes"
	"encoding/json"
	"io"
)

// IsViewerLoginDocument reports whether a GraphQL document is exactly one query operation whose
// selection is `viewer { login }`: what `gh auth status` sends. The lexer follows the GraphQL
// spec's ignored tokens (whitespace, line terminators, commas, comments, a byte order mark);
// the optional `query` keyword may carry an operation name, and nothing else: no variables,
// directives, aliases, arguments, fragments or further fields or operations.
func IsViewerLoginDocument(doc string) bool {
	toks, ok := lexNamesAndBraces(doc)
	if !ok {
		return false
	}
	want := []string{"{", "viewer", "{", "login", "}", "}"}
	if len(toks) > 0 && toks[0] == "query" {
		toks = toks[1:]
		if len(toks) > 0 && toks[0] != "{" {
			toks = toks[1:] // the operation name
		}
	}
	if len(toks) != len(want) {
		return false
	}
	for i := range want {
		if toks[i] != want[i] {
			return false
		}
	}
	return true
}

// operationName returns the operation name of a document IsViewerLoginDocument accepted.
func operationName(doc string) string {
	toks, _ := lexNamesAndBraces(doc)
	if len(toks) > 1 && toks[0] == "query" && toks[1] != "{" {
		return toks[1]
	}
	return ""
}

// lexNamesAndBraces splits a document into Name and brace tokens, skipping ignored tokens. Any
// other character (punctuators, strings, numbers, non-ASCII) fails: none can appear in the probe.
func lexNamesAndBraces(doc string) ([]string, bool) {
	var toks []string
	for i := 0; i < len(doc); {
		c := doc[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == ',':
			i++
		case c == '#':
			for i < len(doc) && doc[i] != '\n' && doc[i] != '\r' {
				i++
			}
		case c == 0xEF && i+2 < len(doc) && doc[i+1] == 0xBB && doc[i+2] == 0xBF:
			i += 3 // U+FEFF
		case c == '{' || c == '}':
			toks = append(toks, doc[i:i+1])
			i++
		case c == '_' || c >= 'A' && c <= 'Z' || c >= 'a' && c <= 'z':
			j := i + 1
			for j < len(doc) && (doc[j] == '_' || doc[j] >= 'A' && doc[j] <= 'Z' || doc[j] >= 'a' && doc[j] <= 'z' || doc[j] >= '0' && doc[j] <= '9') {
				j++
			}
			toks = append(toks, doc[i:j])
			if len(toks) > 16 {
				return nil, false
			}
			i = j
		default:
			return nil, false
		}
	}
	return toks, true
}

// IsViewerLoginRequest reports whether a GraphQL-over-HTTP JSON body is the viewer login probe:
// one JSON object with "query" (a viewer-login document), and optionally "operationName"
// (null, or the document's own name) and "variables" (null or {}). Duplicate or other keys,
// trailing data and batches are refused, so no parser upstream can read a different query
// out of the same bytes.
func IsViewerLoginRequest(body []byte) bool {
	dec := json.NewDecoder(bytes.NewReader(body))
	if t, err := dec.Token(); err != nil || t != json.Delim('{') {
		return false
	}
	seen := map[string]json.RawMessage{}
	for dec.More() {
		t, err := dec.Token()
		if err != nil {
			return false
		}
		key, ok := t.(string)
		if !ok || (key != "query" && key != "operationName" && key != "variables") {
			return false
		}
		if _, dup := seen[key]; dup {
			return false
		}
		var v json.RawMessage
		if err := dec.Decode(&v); err != nil {
			return false
		}
		seen[key] = v
	}
	if t, err := dec.Token(); err != nil || t != json.Delim('}') {
		return false
	}
	if _, err := dec.Token(); err != io.EOF {
		return false
	}
	var query string
	if raw, ok := seen["query"]; !ok || json.Unmarshal(raw, &query) != nil || !IsViewerLoginDocument(query) {
		return false
	}
	if raw, ok := seen["variables"]; ok {
		var vars map[string]json.RawMessage
		if json.Unmarshal(raw, &vars) != nil || len(vars) != 0 {
			return false
		}
	}
	if raw, ok := seen["operationName"]; ok && !bytes.Equal(bytes.TrimSpace(raw), []byte("null")) {
		var name string
		if json.Unmarshal(raw, &name) != nil || name != operationName(query) {
			return false
		}
	}
	return true
}
