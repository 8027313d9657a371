package httppolicy

import (
	"encoding/json"
	"strings"
	"testing"
)

func TestIsViewerLoginDocument(t *testing.T) {
	for _, tc := range []struct {
		doc  string
		want bool
	}{
		{"{viewer{login}}", true},
		{"{ viewer { login } }", true},
		{"query{viewer{login}}", true},
		{"query UserCurrent{viewer{login}}", true},
		{"query UserCurrent { viewer { login } }\n", true},
		{"\ufeff  query\n\tQ,{,viewer,{login},}", true},
		{"# gh auth status\nquery Q { viewer { login } } # trailing", true},
		{"query\r\nQ\r{viewer{login}}", true},
		{"", false},
		{"query", false},
		{"{viewer{login}", false},
		{"{viewer{login}}}", false},
		{"{viewer{login email}}", false},
		{"{viewer{login} repository{id}}", false},
		{"{viewer{l:login}}", false},
		{"{viewer{login @include(if:true)}}", false},
		{"query Q($x:Int){viewer{login}}", false},
		{"query Q @dir {viewer{login}}", false},
		{"mutation{viewer{login}}", false},
		{"subscription{viewer{login}}", false},
		{"queryQ{viewer{login}}", false},
		{"query A B{viewer{login}}", false},
		{"{viewer{login}} {viewer{login}}", false},
		{"query A{viewer{login}} mutation B{x}", false},
		{"{viewer{...F}} fragment F on User{login}", false},
		{"{viewer{login}}\x00", false},
		{"{ viewer { login } } #\n mutation{x}", false},
		{"{ viewer { lógin } }", false},
		{"{ \"viewer\" { login } }", false},
		{strings.Repeat(" ", 1000) + "{viewer{login}}", true},
	} {
		if got := IsViewerLoginDocument(tc.doc); got != tc.want {
			t.Errorf("IsViewerLoginDocument(%q) = %v, want %v", tc.doc, got, tc.want)
		}
	}
}

func TestIsViewerLoginRequest(t *testing.T) {
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`{"query":"query UserCurrent{viewer{login}}"}`, true},
		{`{"query":"{viewer{login}}","variables":null,"operationName":null}`, true},
		{`{"query":"query Q{viewer{login}}","variables":{},"operationName":"Q"}`, true},
		{` {"query":"\u007bviewer{login}}"} `, true},
		{`{"query":"query Q{viewer{login}}","operationName":"R"}`, false},
		{`{"query":"{viewer{login}}","operationName":"R"}`, false},
		{`{"query":"{viewer{login}}","variables":{"a":1}}`, false},
		{`{"query":"{viewer{login}}","extensions":{}}`, false},
		{`{"query":"mutation{x}","query":"{viewer{login}}"}`, false},
		{`{"query":"{viewer{login}}","query":"mutation{x}"}`, false},
		{`{"Query":"{viewer{login}}"}`, false},
		{`[{"query":"{viewer{login}}"}]`, false},
		{`{"query":"{viewer{login}}"}{"query":"mutation{x}"}`, false},
		{`{"query":"{viewer{login}}"`, false},
		{`{"query":null}`, false},
		{`{"query":1}`, false},
		{`{}`, false},
		{``, false},
	} {
		if got := IsViewerLoginRequest([]byte(tc.body)); got != tc.want {
			t.Errorf("IsViewerLoginRequest(%s) = %v, want %v", tc.body, got, tc.want)
		}
	}
}

func FuzzViewerLogin(f *testing.F) {
	f.Add(`{"query":"query UserCurrent{viewer{login}}"}`)
	f.Add(`{"query":"{viewer{login email}}"}`)
	f.Add(`{"query":"# c\n{viewer{login}}","variables":{},"operationName":null}`)
	f.Add(`[{"query":"{viewer{login}}"}]`)
	f.Fuzz(func(t *testing.T, body string) {
		if !IsViewerLoginRequest([]byte(body)) {
			return
		}
		// Whatever was accepted, the only names in its query are query, an operation name,
		// viewer and login, and its only punctuation is braces.
		var q struct{ Query string }
		if err := jsonUnmarshal(body, &q); err != nil {
			t.Fatalf("accepted body that is not JSON: %v", err)
		}
		toks, ok := lexNamesAndBraces(q.Query)
		if !ok {
			t.Fatalf("accepted query that does not lex: %q", q.Query)
		}
		names := 0
		for _, tk := range toks {
			if tk != "{" && tk != "}" {
				names++
			}
		}
		if names < 2 || names > 4 || !IsViewerLoginDocument(q.Query) {
			t.Fatalf("accepted %q", q.Query)
		}
	})
}

func jsonUnmarshal(s string, v any) error { return json.Unmarshal([]byte(s), v) }
