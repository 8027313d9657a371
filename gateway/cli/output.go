package cli

import (
	"encoding/json"
	"io"

	"github.com/spf13/cobra"
)

// jsonFlag is the one --json of the CLI: a persistent flag of the root, so `nexus --json ps`
// and `nexus ps --json` are the same.
const jsonFlag = "json"

func addJSONFlag(root *cobra.Command) {
	root.PersistentFlags().Bool(jsonFlag, false, "print JSON (stable field names) instead of human output")
}

// jsonOutput reports whether the command was asked for JSON.
func jsonOutput(cmd *cobra.Command) bool {
	v, _ := cmd.Flags().GetBool(jsonFlag)
	return v
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
