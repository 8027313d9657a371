package cli

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"

	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// jsonFlag is the one --json of the CLI: a persistent flag of the root, so `nexus --json ps`
// and `nexus ps --json` are the same.
const jsonFlag = "json"

func addJSONFlag(root *cobra.Command) {
	root.PersistentFlags().Bool(jsonFlag, false, "print JSON (stable field names) instead of human output; errors as {\"error\":{\"code\",\"message\"}} on stderr")
}

// jsonOutput reports whether the command was asked for JSON.
func jsonOutput(cmd *cobra.Command) bool {
	v, _ := cmd.Flags().GetBool(jsonFlag)
	return v
}

// jsonAsked reports whether the command line asked for JSON, also when its flags could not be
// parsed (a usage error still answers in JSON).
func jsonAsked(cmd *cobra.Command, args []string) bool {
	if cmd != nil && jsonOutput(cmd) {
		return true
	}
	for _, a := range args {
		if a == "--" {
			break
		}
		if a == "--"+jsonFlag || a == "--"+jsonFlag+"=true" {
			return true
		}
	}
	return false
}

// printedJSON prints v on stdout as indented JSON when the command was asked for JSON, and
// says whether it did; the caller prints its human output otherwise.
func printedJSON(cmd *cobra.Command, v any) bool {
	if !jsonOutput(cmd) {
		return false
	}
	printJSON(cmd.OutOrStdout(), v)
	return true
}

func printJSON(w io.Writer, v any) {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	enc.Encode(v)
}

// printRawJSON prints raw, JSON as a service encoded it, as printJSON prints a value: indented
// by two spaces, one newline after it.
func printRawJSON(w io.Writer, raw []byte) error {
	var b bytes.Buffer
	b.Grow(len(raw) + len(raw)/2)
	if err := json.Indent(&b, raw, "", "  "); err != nil {
		return fmt.Errorf("the gateway's reply is not JSON: %w", err)
	}
	b.WriteByte('\n')
	_, err := w.Write(b.Bytes())
	return err
}

// ErrorJSON is how a failure is printed on stderr under --json.
type ErrorJSON struct {
	Error ErrorBody `json:"error"`
}

// ErrorBody is the code (pkg/errdefs: invalid, not_found, conflict, refused, unavailable,
// internal) and the one-line message of a failure.
type ErrorBody struct {
	Code    string `json:"code"`
	Message string `json:"message"`
}

// errorJSON is err as ErrorJSON: usage errors are invalid.
func errorJSON(err error, msg string) ErrorJSON {
	code := errdefs.Code(err)
	var ue usageError
	if errors.As(err, &ue) || isCobraUsage(err) {
		code = errdefs.CodeInvalid
	}
	return ErrorJSON{Error: ErrorBody{Code: code, Message: strings.TrimPrefix(msg, "nexus: ")}}
}

// refuseJSON is the error of an interactive command asked for --json.
func refuseJSON(cmd *cobra.Command, what string) error {
	if !jsonOutput(cmd) {
		return nil
	}
	return usageError{errors.New(cmd.Name() + " is interactive (" + what + "): it has no --json output; use `nexus exec --json NAME CMD…` to capture a command's output")}
}

// done prints the outcome of a command on one named thing: {"name","state"} under --json (as
// rm --json prints each sandbox), the human line otherwise.
func done(cmd *cobra.Command, name, state, format string, a ...any) {
	if !printedJSON(cmd, api.Result{Name: name, State: api.State(state)}) {
		fmt.Fprintf(cmd.OutOrStdout(), format, a...)
	}
}

// VolumeResult is what `nexus volume rm --json` prints.
type VolumeResult struct {
	Sandbox string `json:"sandbox"`
	Volume  string `json:"volume"`
	State   string `json:"state"`
}

// printJSONLine prints v as one line of JSON (for streams: one value per line).
func printJSONLine(w io.Writer, v any) {
	json.NewEncoder(w).Encode(v)
}
