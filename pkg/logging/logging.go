// Package logging builds the zerolog logger every process injects into its services.
// Logs go to stderr; stdout carries only what a command was asked for.
package logging

import (
	"io"
	"os"
	"time"

	"github.com/rs/zerolog"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Field keys used across services.
const (
	FieldService = "service"
	FieldSandbox = "sandbox"
	FieldHost    = "host"
)

// New returns a logger writing to w (stderr when nil) at level in format "console" or "json".
func New(w io.Writer, level, format string) (zerolog.Logger, error) {
	if w == nil {
		w = os.Stderr
	}
	lvl, err := zerolog.ParseLevel(level)
	if err != nil || level == "" {
		return zerolog.Nop(), errdefs.Invalid("invalid --log-level %q: use debug, info, warn or error", level)
	}
	switch format {
	case "json":
	case "console":
		w = zerolog.ConsoleWriter{Out: w, TimeFormat: time.TimeOnly}
	default:
		return zerolog.Nop(), errdefs.Invalid("invalid --log-format %q: use json or console", format)
	}
	return zerolog.New(w).Level(lvl).With().Timestamp().Logger(), nil
}
