package mcp

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"math"
	"slices"
	"strings"

	mcpgo "github.com/mark3labs/mcp-go/mcp"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// aliasSandbox is accepted wherever a tool takes the sandbox as "name": agents that read
// "sandbox" in a result (sandbox_run, egress_audit, the delegate_* tools) pass it back so.
const aliasSandbox = "sandbox"

// checkArgs checks a call's arguments against the tool's input schema before any handler
// sees them, so every tool refuses the same way and in the caller's terms: "sandbox" becomes
// "name", a null is an absent argument, an unknown argument or a value of the wrong type is
// refused by name, and a missing required argument is named. It returns the arguments the
// handler decodes.
func checkArgs(tool mcpgo.Tool, refuse map[string]string, raw any) (map[string]any, error) {
	// Arguments arrive decoded from JSON, or as Go values from an in-process client: one
	// JSON round trip gives both the same form.
	var decoded map[string]any
	if raw != nil {
		b, err := json.Marshal(raw)
		if err != nil || json.Unmarshal(b, &decoded) != nil {
			return nil, errdefs.Invalid("the arguments of %s must be an object", tool.Name)
		}
	}
	args := map[string]any{}
	for k, v := range decoded {
		if v != nil {
			args[k] = v
		}
	}
	props := tool.InputSchema.Properties
	if _, takesName := props["name"]; takesName {
		if _, own := props[aliasSandbox]; !own {
			if v, ok := args[aliasSandbox]; ok {
				if n, both := args["name"]; both && !sameSandbox(n, v) {
					return nil, errdefs.Invalid("give the sandbox once: name and its alias sandbox disagree")
				}
				args["name"] = v
				delete(args, aliasSandbox)
			}
		}
	}
	for _, k := range slices.Sorted(maps.Keys(args)) {
		if msg, ok := refuse[k]; ok {
			return nil, errdefs.Invalid("%s", msg)
		}
		p, ok := props[k].(map[string]any)
		if !ok {
			return nil, errdefs.Invalid("unknown argument %q: %s takes %s", k, tool.Name, strings.Join(argNames(tool), ", "))
		}
		if err := checkType(k, p, args[k]); err != nil {
			return nil, err
		}
	}
	for _, k := range tool.InputSchema.Required {
		if _, ok := args[k]; !ok {
			return nil, errdefs.Invalid("%s is required", k)
		}
	}
	return args, nil
}

// sameSandbox says whether two name arguments name one sandbox ("t1" and "default/t1" do).
func sameSandbox(a, b any) bool {
	as, _ := a.(string)
	bs, _ := b.(string)
	an, aerr := api.ParseName(as)
	bn, berr := api.ParseName(bs)
	return a == b || (aerr == nil && berr == nil && an == bn)
}

// argNames lists a tool's arguments, required ones first.
func argNames(tool mcpgo.Tool) []string {
	names := slices.Clone(tool.InputSchema.Required)
	for _, k := range slices.Sorted(maps.Keys(tool.InputSchema.Properties)) {
		if !slices.Contains(names, k) {
			names = append(names, k)
		}
	}
	return names
}

// checkType checks one value against its property's JSON Schema type (the subset the tools
// use: string, integer, number, boolean, arrays of strings, objects of strings).
func checkType(name string, prop map[string]any, v any) error {
	want, _ := prop["type"].(string)
	ok := true
	switch want {
	case "string":
		_, ok = v.(string)
	case "boolean":
		_, ok = v.(bool)
	case "number":
		_, ok = v.(float64)
	case "integer":
		f, isNum := v.(float64)
		ok = isNum && f == math.Trunc(f) && math.Abs(f) < 1<<53
	case "array":
		var items []any
		if items, ok = v.([]any); ok {
			for _, it := range items {
				if _, s := it.(string); !s {
					ok = false
				}
			}
		}
	case "object":
		var m map[string]any
		if m, ok = v.(map[string]any); ok {
			for _, it := range m {
				if _, s := it.(string); !s {
					ok = false
				}
			}
		}
	}
	if !ok {
		return errdefs.Invalid("invalid argument %s: want %s, got %s", name, typeWords(want), valueWords(v))
	}
	return nil
}

func typeWords(t string) string {
	switch t {
	case "array":
		return "a list of strings"
	case "object":
		return "an object of string values"
	case "integer":
		return "a whole number"
	case "string", "boolean", "number":
		return "a " + t
	}
	return t
}

func valueWords(v any) string {
	switch x := v.(type) {
	case string:
		return fmt.Sprintf("the string %q", x)
	case bool:
		return fmt.Sprintf("%v", x)
	case float64:
		return fmt.Sprintf("%v", x)
	case []any:
		return "a list holding a non-string"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}

// bind decodes the (checked) tool arguments into v. checkArgs already refused what the
// schema does not describe; a decoding error left here is still said in the caller's terms.
func bind(req mcpgo.CallToolRequest, v any) error {
	if req.GetRawArguments() == nil {
		return nil
	}
	b, err := json.Marshal(req.GetRawArguments())
	if err != nil {
		return errdefs.Invalid("invalid arguments: %v", err)
	}
	if err := json.Unmarshal(b, v); err != nil {
		var te *json.UnmarshalTypeError
		if errors.As(err, &te) && te.Field != "" {
			return errdefs.Invalid("invalid argument %s: got %s", te.Field, te.Value)
		}
		return errdefs.Invalid("invalid arguments")
	}
	return nil
}

// flagTerms maps the CLI flags a gateway message may name to the tool arguments an MCP
// caller sets instead: the gateway's messages are written for `nexus create`.
var flagTerms = strings.NewReplacer(
	"use rm --force", "pass force: true",
	"--allow-private", "allow_private",
	"--allow-host", "allowed_hosts",
	"--idle-timeout", "idle_timeout",
	"--disk-bps", "disk_bps",
	"--disk-iops", "disk_iops",
	"--mount-named", "mount_named",
	"--memory", "memory",
	"--vcpus", "vcpus",
	"--cpus", "cpus",
	"--egress", "egress",
	"--secret", "secrets",
	"--repo", "repos",
	"--label", "labels",
	"--ttl", "ttl",
	"--mount", "mounts",
	"--image", "image",
	"--agent", "agent",
	"--config", "config",
	"-l key=value", "selector",
)

// userTerms rewrites a message for an MCP caller, outside `quoted commands` (which the user
// may run as they are).
func userTerms(msg string) string {
	parts := strings.Split(msg, "`")
	for i := 0; i < len(parts); i += 2 {
		parts[i] = flagTerms.Replace(parts[i])
	}
	return strings.Join(parts, "`")
}
