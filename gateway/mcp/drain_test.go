package mcp

import (
	"bufio"
	"io"
	"strings"
	"testing"
	"time"
)

// TestEndOfInputWaitsForAnswers: the end of stdin reaches the stdio server only once every
// request read from it has been answered on stdout (notifications and answers to nothing are
// not waited for).
func TestEndOfInputWaitsForAnswers(t *testing.T) {
	f := newInflight()
	in := &drainReader{r: bufio.NewReader(strings.NewReader(
		`{"jsonrpc":"2.0","id":1,"method":"tools/call"}` + "\n" +
			`{"jsonrpc":"2.0","method":"notifications/initialized"}` + "\n" +
			`{"jsonrpc":"2.0","id":"b","method":"tools/call"}` + "\n")), f: f}
	var out strings.Builder
	w := &answerWriter{w: &out, f: f}

	eof := make(chan error, 1)
	go func() {
		_, err := io.ReadAll(in)
		eof <- err
	}()
	select {
	case err := <-eof:
		t.Fatalf("input ended (%v) with two requests unanswered", err)
	case <-time.After(100 * time.Millisecond):
	}
	io.WriteString(w, `{"jsonrpc":"2.0","method":"notifications/progress"}`+"\n")
	io.WriteString(w, `{"jsonrpc":"2.0","id":1,"result":{}}`+"\n")
	select {
	case err := <-eof:
		t.Fatalf("input ended (%v) with request \"b\" unanswered", err)
	case <-time.After(100 * time.Millisecond):
	}
	// An answer written in two pieces counts once its line is complete.
	io.WriteString(w, `{"jsonrpc":"2.0","id":"b",`)
	io.WriteString(w, `"error":{"code":1,"message":"x"}}`+"\n")
	select {
	case err := <-eof:
		if err != nil {
			t.Fatal(err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("input did not end after every request was answered")
	}
	if strings.Count(out.String(), "\n") != 3 {
		t.Fatalf("stdout not passed through: %q", out.String())
	}
}
