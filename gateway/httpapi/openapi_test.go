package httpapi

import (
	"bytes"
	"encoding/json"
	"flag"
	"os"
	"regexp"
	"sort"
	"strconv"
	"strings"
	"testing"
)

var update = flag.Bool("update", false, "rewrite openapi.json from Routes")

// queryParams are each route's query parameters: name, type (string, boolean, integer; a
// leading * repeats it), description.
var queryParams = map[string][][3]string{
	"GET /v1/sandboxes":                      {{"selector", "*string", "label selector k=v, k!=v or k; all must hold"}, {"all", "boolean", "include stopped and failed sandboxes"}},
	"DELETE /v1/sandboxes/{name}":            {{"force", "boolean", "remove it even if it is running (default true)"}},
	"POST /v1/sandboxes/{name}/stop":         {{"force", "boolean", "kill the VM instead of a clean shutdown"}},
	"POST /v1/sandboxes/{name}/start":        {{"force", "boolean", "unused; accepted for symmetry"}},
	"POST /v1/sandboxes/{name}/pause":        {{"force", "boolean", "unused; accepted for symmetry"}},
	"POST /v1/sandboxes/{name}/resume":       {{"force", "boolean", "unused; accepted for symmetry"}},
	"GET /v1/sandboxes/{name}/exec/ws":       {{"ticket", "string", "a ticket from POST …/exec/ticket, instead of Authorization (browsers)"}, {"argv", "*string", "the command and its arguments, in order"}, {"env", "*string", "KEY=VALUE"}, {"workdir", "string", "working directory in the guest"}, {"tty", "boolean", "allocate a pty (stderr merged into stdout)"}, {"stdin", "boolean", "forward stdin frames"}, {"rows", "integer", "pty rows"}, {"cols", "integer", "pty columns"}, {"timeout", "string", "kill the command after this long (exit 124)"}},
	"GET /v1/sandboxes/{name}/logs":          {{"offset", "integer", "byte offset to read from"}, {"agent", "boolean", "the guest agent's own log"}, {"follow", "boolean", "Server-Sent Events of new chunks (event log, id = next offset)"}},
	"GET /v1/sandboxes/{name}/files":         {{"path", "string", "absolute guest path"}},
	"GET /v1/sandboxes/{name}/files/stat":    {{"path", "string", "absolute guest path"}},
	"GET /v1/sandboxes/{name}/files/content": {{"path", "string", "absolute guest path"}},
	"PUT /v1/sandboxes/{name}/files/content": {{"path", "string", "absolute guest path"}, {"mode", "string", "octal permission bits (default 644)"}},
	"GET /v1/sandboxes/{name}/files/tar":     {{"path", "string", "absolute guest directory"}},
	"PUT /v1/sandboxes/{name}/files/tar":     {{"path", "string", "absolute guest directory, created if missing"}},
	"POST /v1/sandboxes/{name}/files/mkdir":  {{"path", "string", "absolute guest path"}},
	"DELETE /v1/sandboxes/{name}/files":      {{"path", "string", "absolute guest path"}, {"recursive", "boolean", "remove a directory and everything in it"}},
	"GET /v1/stats":                          {{"name", "*string", "sandbox name"}, {"selector", "*string", "label selector"}},
	"GET /v1/audit":                          {{"sandbox", "*string", "sandbox name"}, {"denied", "boolean", "only denials"}, {"since", "string", "only decisions newer than this duration"}, {"follow", "boolean", "keep streaming new decisions (default true)"}, {"api", "boolean", "the API's request events instead of egress decisions (admin)"}, {"token", "*string", "with api: only requests made with this token"}},
	"POST /v1/images/{image}/build":          {{"force", "boolean", "rebuild an existing image"}},
	"DELETE /v1/images/{image}":              {{"force", "boolean", "remove it even if sandboxes use it"}},
	"POST /v1/builds/{image}":                {{"file", "string", "the Dockerfile's path in the context (default Dockerfile)"}, {"build_arg", "*string", "NAME=VALUE"}, {"allow_host", "*string", "HOST[:PORT] the builder sandbox may reach"}, {"memory_mib", "integer", "memory of the builder sandbox"}, {"no_cache", "boolean", "build every step again"}},
	"GET /v1/delegations/{sandbox}":          {{"commits", "integer", "how many recent commits (default 10, cap 100)"}},
	"DELETE /v1/delegations/{sandbox}":       {{"force", "boolean", "discard uncommitted changes"}},
}

// bodies are the request bodies: content type and what it holds (the bus request's JSON, see
// pkg/api/gateway).
var bodies = map[string][2]string{
	"POST /v1/sandboxes":                       {"application/json", "CreateRequest: name, image, labels, memory_mib, vcpus, cpus, agent, egress_mode, allow_hosts, allow_private, repos, secrets, mounts, mount_named, no_port_forward, ephemeral, ttl, idle_timeout, limits, config"},
	"POST /v1/sandboxes/{name}/exec":           {"application/json", "argv, env, workdir, stdin (text, then closed), timeout"},
	"POST /v1/sandboxes/{name}/exec/stream":    {"application/json", "argv, env, workdir, stdin (text, then closed), timeout"},
	"POST /v1/sandboxes/{name}/egress/explain": {"application/json", "method, url, body"},
	"PUT /v1/sandboxes/{name}/files/content":   {"application/octet-stream", "the file's bytes"},
	"PUT /v1/sandboxes/{name}/files/tar":       {"application/x-tar", "a tar archive"},
	"POST /v1/builds/{image}":                  {"application/x-tar", "the build context as a tar archive, the Dockerfile in it"},
	"POST /v1/sandboxes/{name}/egress/allow":   {"application/json", "host (HOST[:PORT,…]), for (a duration; empty: until revoked)"},
	"POST /v1/sandboxes/{name}/egress/revoke":  {"application/json", "host"},
	"POST /v1/sandboxes/{name}/egress/deny":    {"application/json", "host (a name, *.domain or an IPv4 address), for"},
	"POST /v1/sandboxes/{name}/egress/apply":   {"application/json", "config (the parsed .nexus/config.yaml), dry_run"},
	"POST /v1/sandboxes/{name}/snapshots":      {"application/json", "snapshot: the snapshot's name"},
	"POST /v1/forks":                           {"application/json", "source (snapshot or sandbox), name, labels"},
	"PUT /v1/secrets/{secret}":                 {"application/json", "value or command, hosts"},
	"POST /v1/delegations":                     {"application/json", "repo_path, name, base, project, image, memory, vcpus, agent, egress, allowed_hosts"},
	"POST /v1/delegations/{sandbox}/dispatch":  {"application/json", "brief, command"},
}

var wildcardRE = regexp.MustCompile(`\{([a-z_]+)\}`)

func param(in, name, typ, desc string) map[string]any {
	schema := map[string]any{"type": strings.TrimPrefix(typ, "*")}
	if strings.HasPrefix(typ, "*") {
		schema = map[string]any{"type": "array", "items": schema}
	}
	p := map[string]any{"name": name, "in": in, "schema": schema, "description": desc}
	if in == "path" {
		p["required"] = true
	}
	return p
}

// generate builds the document from Routes.
func generate() ([]byte, error) {
	errResp := map[string]any{"description": "error", "content": map[string]any{"application/json": map[string]any{"schema": map[string]any{"$ref": "#/components/schemas/Error"}}}}
	paths := map[string]map[string]any{}
	sc := newSchemas()
	for _, rt := range Routes {
		key := rt.Method + " " + rt.Path
		var params []any
		for _, m := range wildcardRE.FindAllStringSubmatch(rt.Path, -1) {
			desc := m[1]
			if m[1] == "name" {
				desc = "sandbox name: name, or project%2Fname"
			}
			params = append(params, param("path", m[1], "string", desc))
		}
		for _, q := range queryParams[key] {
			params = append(params, param("query", q[0], q[1], q[2]))
		}
		wt := wires[key]
		ok := map[string]any{"description": "ok"}
		if wt.resp != nil {
			ok["content"] = map[string]any{"application/json": map[string]any{"schema": sc.of(wt.resp)}}
		}
		if wt.content != "" {
			ok["content"] = map[string]any{wt.content: map[string]any{"schema": map[string]any{"type": "string", "format": "binary"}}}
		}
		status := "200"
		if wt.status != 0 {
			status = strconv.Itoa(wt.status)
		}
		op := map[string]any{
			"summary":       rt.Summary,
			"operationId":   operationID(rt),
			"x-nexus-scope": string(rt.Scope),
			"responses": map[string]any{
				status: ok, "400": errResp, "401": errResp, "403": errResp,
				"404": errResp, "409": errResp, "500": errResp, "503": errResp,
			},
		}
		if params != nil {
			op["parameters"] = params
		}
		if b, ok := bodies[key]; ok {
			body := map[string]any{}
			switch {
			case wt.req != nil:
				body = sc.of(wt.req)
			case b[0] != "application/json":
				body = map[string]any{"type": "string", "format": "binary"}
			}
			op["requestBody"] = map[string]any{"description": b[1], "required": true, "content": map[string]any{b[0]: map[string]any{"schema": body}}}
		}
		if paths[rt.Path] == nil {
			paths[rt.Path] = map[string]any{}
		}
		paths[rt.Path][strings.ToLower(rt.Method)] = op
	}
	sc.defs["Error"] = map[string]any{"type": "object", "properties": map[string]any{"error": map[string]any{
		"type": "object", "properties": map[string]any{
			"code":    map[string]any{"type": "string", "enum": []string{"invalid", "not_found", "conflict", "refused", "unavailable", "internal"}},
			"message": map[string]any{"type": "string"},
		}}}}
	doc := map[string]any{
		"openapi": "3.0.3",
		"info": map[string]any{"title": "nexus API", "version": "1",
			"description": "Sandboxes, exec, files, logs, egress and audit of a nexus host. Every request needs Authorization: Bearer <token> (nexus token create); x-nexus-scope is the scope each route needs. MCP (streamable HTTP) is served at /mcp with the same tokens."},
		"security": []any{map[string]any{"bearer": []any{}}},
		"paths":    paths,
		"components": map[string]any{
			"securitySchemes": map[string]any{"bearer": map[string]any{"type": "http", "scheme": "bearer"}},
			"schemas":         sc.defs,
		},
	}
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetIndent("", "  ")
	enc.SetEscapeHTML(false)
	err := enc.Encode(doc)
	return buf.Bytes(), err
}

func operationID(rt route) string {
	p := strings.NewReplacer("/v1/", "", "/", "_", "{", "", "}", "").Replace(rt.Path)
	return strings.ToLower(rt.Method) + "_" + p
}

// The committed document and the route table agree: every route is in the document with its
// scope, and the document has no route the server lacks.
func TestOpenAPI(t *testing.T) {
	want, err := generate()
	if err != nil {
		t.Fatal(err)
	}
	if *update {
		if err := os.WriteFile("openapi.json", want, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	var doc struct {
		Paths map[string]map[string]struct {
			Scope string `json:"x-nexus-scope"`
		} `json:"paths"`
	}
	if err := json.Unmarshal(OpenAPI, &doc); err != nil {
		t.Fatalf("openapi.json: %v", err)
	}
	inDoc := map[string]string{}
	for p, ops := range doc.Paths {
		for m, op := range ops {
			inDoc[strings.ToUpper(m)+" "+p] = op.Scope
		}
	}
	inTable := map[string]string{}
	for _, rt := range Routes {
		inTable[rt.Method+" "+rt.Path] = string(rt.Scope)
	}
	var missing, extra []string
	for k, scope := range inTable {
		if got, ok := inDoc[k]; !ok || got != scope {
			missing = append(missing, k+" ("+scope+")")
		}
	}
	for k := range inDoc {
		if _, ok := inTable[k]; !ok {
			extra = append(extra, k)
		}
	}
	sort.Strings(missing)
	sort.Strings(extra)
	if len(missing) > 0 || len(extra) > 0 {
		t.Fatalf("openapi.json and Routes disagree (go test -run TestOpenAPI -update):\nnot in the document, or another scope: %v\nnot served: %v", missing, extra)
	}
	if !bytes.Equal(OpenAPI, want) {
		t.Fatal("openapi.json is not what Routes generate: go test ./gateway/httpapi -run TestOpenAPI -update")
	}
	for k := range queryParams {
		if _, ok := inTable[k]; !ok {
			t.Errorf("queryParams names %s, which is no route", k)
		}
	}
	for k, b := range bodies {
		if _, ok := inTable[k]; !ok {
			t.Errorf("bodies names %s, which is no route", k)
		}
		if b[0] == "application/json" && wires[k].req == nil {
			t.Errorf("%s takes a JSON body but wires gives no request type for its schema", k)
		}
	}
	for k, w := range wires {
		if _, ok := inTable[k]; !ok {
			t.Errorf("wires names %s, which is no route", k)
		}
		if _, ok := bodies[k]; w.req != nil && !ok {
			t.Errorf("wires gives %s a request type but bodies does not describe it", k)
		}
	}
}
