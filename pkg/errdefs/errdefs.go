// Package errdefs holds the small fixed set of error classes that cross process boundaries.
//
// Code wraps one of the sentinels (fmt.Errorf("create %s: %w", name, errdefs.ErrConflict) or
// errdefs.Conflict("…")); the bus edge translates the class to the wire code of DESIGN §2 once,
// and the client side turns the code back into the same sentinel so errors.Is works across a hop.
package errdefs

import (
	"errors"
	"fmt"
	"strings"
)

var (
	ErrInvalid     = errors.New("invalid")
	ErrNotFound    = errors.New("not found")
	ErrConflict    = errors.New("conflict")
	ErrRefused     = errors.New("refused")
	ErrUnavailable = errors.New("unavailable")
	ErrInternal    = errors.New("internal")
)

// Wire codes, in the envelope's error.code.
const (
	CodeInvalid     = "invalid"
	CodeNotFound    = "not_found"
	CodeConflict    = "conflict"
	CodeRefused     = "refused"
	CodeUnavailable = "unavailable"
	CodeInternal    = "internal"
)

// classed is an error whose message is exactly the user-facing sentence, with a class attached.
type classed struct {
	class error
	msg   string
}

func (e *classed) Error() string        { return e.msg }
func (e *classed) Is(target error) bool { return target == e.class }

// New returns an error whose Error() is msg and which errors.Is the given class.
func New(class error, msg string) error { return &classed{class: class, msg: msg} }

func Invalid(format string, a ...any) error  { return New(ErrInvalid, fmt.Sprintf(format, a...)) }
func NotFound(format string, a ...any) error { return New(ErrNotFound, fmt.Sprintf(format, a...)) }
func Conflict(format string, a ...any) error { return New(ErrConflict, fmt.Sprintf(format, a...)) }
func Refused(format string, a ...any) error  { return New(ErrRefused, fmt.Sprintf(format, a...)) }
func Unavailable(format string, a ...any) error {
	return New(ErrUnavailable, fmt.Sprintf(format, a...))
}

// Code maps an error to its wire code; unclassified errors are internal.
func Code(err error) string {
	switch {
	case err == nil:
		return ""
	case errors.Is(err, ErrInvalid):
		return CodeInvalid
	case errors.Is(err, ErrNotFound):
		return CodeNotFound
	case errors.Is(err, ErrConflict):
		return CodeConflict
	case errors.Is(err, ErrRefused):
		return CodeRefused
	case errors.Is(err, ErrUnavailable):
		return CodeUnavailable
	default:
		return CodeInternal
	}
}

// FromCode rebuilds an error of the class named by a wire code with the given message.
func FromCode(code, msg string) error {
	class := ErrInternal
	switch code {
	case CodeInvalid:
		class = ErrInvalid
	case CodeNotFound:
		class = ErrNotFound
	case CodeConflict:
		class = ErrConflict
	case CodeRefused:
		class = ErrRefused
	case CodeUnavailable:
		class = ErrUnavailable
	}
	return New(class, msg)
}

// FirstLine is s cut to its first line, trimmed, as valid UTF-8: how an untrusted or multi-line
// message (a tool's stderr, a parser's error) is shown in a one-line error.
func FirstLine(s string) string {
	s = strings.TrimSpace(s)
	if i := strings.IndexAny(s, "\r\n"); i >= 0 {
		s = s[:i]
	}
	return strings.ToValidUTF8(s, "?")
}
