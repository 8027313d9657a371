package agentproto_test

import (
	"strings"
	"testing"
	"unicode/utf8"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// Guest text (a request's reason, a process's command line) is bounded, has no control or
// format characters, and never carries a credential placeholder into the host's logs and audit.
func TestCleanGuestText(t *testing.T) {
	placeholder := strings.Repeat("0123456789abcdef", 4)
	for _, c := range []struct{ in, want string }{
		{"need the\x1b[31m SDK\r\ndocs\u202e\x00", "need the[31m SDK docs"},
		{"token " + placeholder[:30] + "\u200b" + placeholder[30:] + " here", "token [hex] here"},
		{"git checkout " + placeholder[:40], "git checkout " + placeholder[:40]}, // a commit id stays
		{"\xff\xfeok", "ok"},
	} {
		if got := agentproto.CleanGuestText(c.in, 200); got != c.want {
			t.Errorf("CleanGuestText(%q) = %q, want %q", c.in, got, c.want)
		}
	}
	long := strings.Repeat("é", 300)
	if got := agentproto.CleanGuestText(long, agentproto.MaxWhyReason); len(got) > agentproto.MaxWhyReason || !utf8.ValidString(got) {
		t.Fatalf("%d bytes, valid %v", len(got), utf8.ValidString(got))
	}
}
