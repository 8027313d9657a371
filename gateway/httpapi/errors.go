package httpapi

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strings"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// ErrorBody is the body of every failed request: {"error":{"code","message"}}, the code one of
// the bus envelope's (pkg/errdefs).
type ErrorBody struct {
	Error struct {
		Code    string `json:"code"`
		Message string `json:"message"`
	} `json:"error"`
}

// Status is the HTTP status of an error's class: the one place the classes become statuses.
func Status(err error) int {
	if errors.Is(err, errUnauthenticated) {
		return http.StatusUnauthorized
	}
	switch errdefs.Code(err) {
	case errdefs.CodeInvalid:
		return http.StatusBadRequest
	case errdefs.CodeNotFound:
		return http.StatusNotFound
	case errdefs.CodeConflict:
		return http.StatusConflict
	case errdefs.CodeRefused:
		return http.StatusForbidden
	case errdefs.CodeUnavailable:
		return http.StatusServiceUnavailable
	}
	return http.StatusInternalServerError
}

// writeError answers err: its status, and its code and one-line message in the body.
func writeError(w http.ResponseWriter, err error) {
	var body ErrorBody
	body.Error.Code = errdefs.Code(err)
	if errors.Is(err, errUnauthenticated) {
		body.Error.Code = errdefs.CodeRefused
		w.Header().Set("WWW-Authenticate", `Bearer realm="nexus"`)
	}
	body.Error.Message = oneLine(err.Error())
	writeJSON(w, Status(err), body)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("X-Content-Type-Options", "nosniff")
	w.WriteHeader(status)
	enc := json.NewEncoder(w)
	enc.SetEscapeHTML(false) // messages quote <token>, paths with &: keep them readable
	enc.Encode(v)
}

func oneLine(s string) string {
	s = strings.TrimPrefix(strings.TrimSpace(s), "nexus: ")
	return strings.ToValidUTF8(strings.Join(strings.Fields(s), " "), "?")
}

// maxJSONBody bounds a JSON request body (a worktree brief is at most 1 MiB).
const maxJSONBody = 2 << 20

// decode reads a JSON body into v: bounded, unknown fields refused (a misspelt option must not
// be dropped silently). An empty body leaves v as it is.
func decode(w http.ResponseWriter, r *http.Request, v any) error {
	dec := json.NewDecoder(http.MaxBytesReader(w, r.Body, maxJSONBody))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		if errors.Is(err, io.EOF) {
			return nil
		}
		var tooBig *http.MaxBytesError
		if errors.As(err, &tooBig) {
			return errdefs.Invalid("the request body is larger than %d bytes", maxJSONBody)
		}
		return errdefs.Invalid("invalid request body: %v", err)
	}
	if dec.More() {
		return errdefs.Invalid("invalid request body: more than one JSON value")
	}
	return nil
}
