package agentproto

import (
	"regexp"
	"strings"
	"time"
	"unicode"
	"unicode/utf8"
)

// nexus-why (issue 26): inside the guest, `nexus-why` (a name of the agent binary in
// GuestBinDir) asks why the sandbox's connections were refused. It dials host port WhyPort
// through the agent's host-dial socket (HostDialSocket), so the call travels over the agent
// channel; the host (vmm) serves it for the sandbox of that channel, whatever the guest says,
// from the sandbox's audit events of every layer. It forwards nothing, so it is no path out.
const (
	// WhyPort is the host port of nexus-why on the agent channel (one HTTP/1.0 exchange).
	WhyPort = 4180
	// WhyPath lists the recent denials (GET, a WhyReport); WhyRequestPath files a request
	// (POST a WhyRequest, answered with a WhyAnswer).
	WhyPath        = "/v1/why"
	WhyRequestPath = "/v1/request"
	// MaxWhyReason bounds a request's reason (bytes, after control characters are stripped).
	MaxWhyReason = 200
)

// WhyReport is what nexus-why shows: the sandbox and its most recent refusals, newest last.
type WhyReport struct {
	Sandbox string      `json:"sandbox"`
	Mode    string      `json:"mode"`
	Ask     bool        `json:"ask,omitempty"`
	Denials []WhyDenial `json:"denials"`
}

// WhyDenial is one refusal, with what would allow it.
type WhyDenial struct {
	Time   time.Time `json:"time"`
	Layer  string    `json:"layer"`
	Proto  string    `json:"proto,omitempty"`
	Host   string    `json:"host,omitempty"`
	IP     string    `json:"ip,omitempty"`
	Port   int       `json:"port,omitempty"`
	Method string    `json:"method,omitempty"`
	Path   string    `json:"path,omitempty"`
	Rule   string    `json:"rule,omitempty"`
	Reason string    `json:"reason"`
	// Fix is what the sandbox's owner (or, in ask mode, a request) would do to allow it.
	Fix string `json:"fix"`
}

// WhyRequest asks the owner of an ask-mode sandbox for a host (`nexus-why request HOST[:PORT] REASON`).
type WhyRequest struct {
	Host   string `json:"host"`
	Port   int    `json:"port,omitempty"`
	Reason string `json:"reason,omitempty"`
}

// WhyAnswer is the one-line outcome of a WhyRequest or the error of any nexus-why call.
type WhyAnswer struct {
	Message string `json:"message"`
}

// longHex is a run of hex digits as long as a credential placeholder (64) or longer.
var longHex = regexp.MustCompile(`[0-9a-fA-F]{64,}`)

// CleanGuestText bounds untrusted text from a guest to max bytes (whole runes) with control
// characters and invalid UTF-8 dropped, spaces folded, and anything shaped like a credential
// placeholder (64 hex digits or more) replaced: guest text is shown, logged and audited, where
// no placeholder may appear.
func CleanGuestText(s string, max int) string {
	s = strings.ToValidUTF8(s, "")
	s = strings.Map(func(r rune) rune {
		switch {
		case r == '\t' || r == '\n' || r == '\r':
			return ' '
		case unicode.IsControl(r) || r == utf8.RuneError || unicode.Is(unicode.Cf, r):
			return -1
		}
		return r
	}, s)
	s = strings.Join(strings.Fields(s), " ")
	s = longHex.ReplaceAllLiteralString(s, "[hex]")
	for len(s) > max {
		_, size := utf8.DecodeLastRuneInString(s)
		s = s[:len(s)-size]
	}
	return s
}
