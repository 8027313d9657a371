package httpapi

import (
	"encoding"
	"encoding/json"
	"reflect"
	"strings"
	"time"

	"github.com/IniZio/nexus/gateway/mcp"
	credapi "github.com/IniZio/nexus/pkg/api/credbroker"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	portfwdapi "github.com/IniZio/nexus/pkg/api/portfwd"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

// wire is a route's JSON request body and 2xx answer, as Go types the handlers decode and
// write; the OpenAPI schemas are generated from them by reflection.
type wire struct {
	req, resp reflect.Type
	status    int    // the success status; 0 is 200
	content   string // the answer's content type when it is not JSON
}

func typ[T any]() reflect.Type { return reflect.TypeFor[T]() }

// The wrappers the handlers answer as map[string]any, spelt as types for their schema.
type (
	portsBody struct {
		Ports []portfwdapi.Forward `json:"ports"`
	}
	statsBody struct {
		Stats []api.SandboxStats `json:"stats"`
	}
	snapshotsBody struct {
		Snapshots []api.SnapshotView `json:"snapshots"`
	}
	volumesBody struct {
		Volumes []api.VolumeView `json:"volumes"`
	}
	imagesBody struct {
		Images []vmmapi.ImageInfo `json:"images"`
	}
	dirBody struct {
		Path    string     `json:"path"`
		Entries []FileInfo `json:"entries"`
	}
	removedBody struct {
		Path    string `json:"path"`
		Removed bool   `json:"removed"`
	}
)

// wires are the routes with a JSON body or a JSON answer. The rest answer bytes (files, tar),
// event streams (logs, audit) or a WebSocket.
var wires = map[string]wire{
	"GET /v1/sandboxes":                        {resp: typ[listResult]()},
	"POST /v1/sandboxes":                       {req: typ[api.CreateRequest](), resp: typ[api.Sandbox](), status: 201},
	"GET /v1/sandboxes/{name}":                 {resp: typ[api.Sandbox]()},
	"DELETE /v1/sandboxes/{name}":              {resp: typ[api.Result]()},
	"POST /v1/sandboxes/{name}/start":          {resp: typ[api.Result]()},
	"POST /v1/sandboxes/{name}/stop":           {resp: typ[api.Result]()},
	"POST /v1/sandboxes/{name}/pause":          {resp: typ[api.Result]()},
	"POST /v1/sandboxes/{name}/resume":         {resp: typ[api.Result]()},
	"POST /v1/sandboxes/{name}/exec":           {req: typ[ExecBody](), resp: typ[mcp.ExecResult]()},
	"POST /v1/sandboxes/{name}/exec/stream":    {req: typ[ExecBody](), content: ExecStreamType},
	"POST /v1/sandboxes/{name}/exec/ticket":    {resp: typ[TicketBody]()},
	"GET /v1/sandboxes/{name}/ports":           {resp: typ[portsBody]()},
	"GET /v1/sandboxes/{name}/egress":          {resp: typ[api.EgressView]()},
	"POST /v1/sandboxes/{name}/egress/explain": {req: typ[api.ExplainRequest](), resp: typ[api.Explanation]()},
	"POST /v1/sandboxes/{name}/egress/allow":   {req: typ[EgressChangeBody](), resp: typ[api.EgressChange]()},
	"POST /v1/sandboxes/{name}/egress/revoke":  {req: typ[EgressChangeBody](), resp: typ[api.EgressChange]()},
	"POST /v1/sandboxes/{name}/egress/deny":    {req: typ[EgressChangeBody](), resp: typ[api.EgressChange]()},
	"POST /v1/sandboxes/{name}/egress/apply":   {req: typ[api.EgressApplyRequest](), resp: typ[api.EgressChange]()},
	"GET /v1/sandboxes/{name}/files":           {resp: typ[dirBody]()},
	"GET /v1/sandboxes/{name}/files/stat":      {resp: typ[FileInfo]()},
	"PUT /v1/sandboxes/{name}/files/content":   {resp: typ[FileInfo]()},
	"PUT /v1/sandboxes/{name}/files/tar":       {resp: typ[FileInfo]()},
	"POST /v1/sandboxes/{name}/files/mkdir":    {resp: typ[FileInfo]()},
	"DELETE /v1/sandboxes/{name}/files":        {resp: typ[removedBody]()},
	"POST /v1/sandboxes/{name}/snapshots":      {req: typ[api.SnapshotCreateRequest](), resp: typ[api.Snapshot](), status: 201},
	"GET /v1/ports":                            {resp: typ[portsBody]()},
	"GET /v1/stats":                            {resp: typ[statsBody]()},
	"GET /v1/snapshots":                        {resp: typ[snapshotsBody]()},
	"DELETE /v1/snapshots/{snapshot}":          {resp: typ[api.Empty]()},
	"POST /v1/forks":                           {req: typ[api.ForkRequest](), resp: typ[api.Sandbox](), status: 201},
	"GET /v1/volumes":                          {resp: typ[volumesBody]()},
	"DELETE /v1/volumes/{sandbox}/{volume}":    {resp: typ[api.Empty]()},
	"GET /v1/images":                           {resp: typ[imagesBody]()},
	"POST /v1/images/{image}/build":            {resp: typ[vmmapi.ImageInfo]()},
	"DELETE /v1/images/{image}":                {resp: typ[vmmapi.ImageInfo]()},
	"GET /v1/secrets":                          {resp: typ[credapi.SecretListResponse]()},
	"PUT /v1/secrets/{secret}":                 {req: typ[credapi.SecretSetRequest](), resp: typ[api.Empty]()},
	"DELETE /v1/secrets/{secret}":              {resp: typ[api.Empty]()},
	"POST /v1/delegations":                     {req: typ[api.DelegateCreateRequest](), resp: typ[api.WorktreeResult](), status: 201},
	"POST /v1/delegations/{sandbox}/dispatch":  {req: typ[api.DispatchRequest](), resp: typ[api.DispatchResult]()},
	"GET /v1/delegations/{sandbox}":            {resp: typ[api.PollResult]()},
	"DELETE /v1/delegations/{sandbox}":         {resp: typ[api.TeardownResult]()},
}

// schemas builds JSON Schemas (OpenAPI 3.0 flavour) of Go wire types as encoding/json encodes
// them: a named struct becomes a component referenced by $ref, named by its Go type (the
// package's name before it when two packages share a name).
type schemas struct {
	defs  map[string]any
	names map[reflect.Type]string
}

func newSchemas() *schemas {
	return &schemas{defs: map[string]any{}, names: map[reflect.Type]string{}}
}

var (
	timeType        = reflect.TypeFor[time.Time]()
	durationType    = reflect.TypeFor[time.Duration]()
	rawType         = reflect.TypeFor[json.RawMessage]()
	marshalerType   = reflect.TypeFor[json.Marshaler]()
	textMarshalType = reflect.TypeFor[encoding.TextMarshaler]()
)

func (s *schemas) of(ty reflect.Type) map[string]any {
	switch ty {
	case timeType:
		return map[string]any{"type": "string", "format": "date-time"}
	case durationType:
		return map[string]any{"type": "integer", "format": "int64", "description": "nanoseconds"}
	case rawType:
		return map[string]any{}
	}
	if ty.Kind() == reflect.Pointer {
		sc := s.of(ty.Elem())
		if _, isRef := sc["$ref"]; isRef {
			return map[string]any{"allOf": []any{sc}, "nullable": true}
		}
		out := map[string]any{"nullable": true}
		for k, v := range sc {
			out[k] = v
		}
		return out
	}
	if ty.Implements(marshalerType) || reflect.PointerTo(ty).Implements(marshalerType) {
		return map[string]any{"description": "custom JSON encoding of " + ty.String()}
	}
	if ty.Kind() != reflect.String && (ty.Implements(textMarshalType) || reflect.PointerTo(ty).Implements(textMarshalType)) {
		return map[string]any{"type": "string"}
	}
	switch ty.Kind() {
	case reflect.Bool:
		return map[string]any{"type": "boolean"}
	case reflect.Int, reflect.Int8, reflect.Int16, reflect.Int32, reflect.Int64,
		reflect.Uint, reflect.Uint8, reflect.Uint16, reflect.Uint32, reflect.Uint64:
		sc := map[string]any{"type": "integer"}
		if ty.Kind() >= reflect.Uint && ty.Kind() <= reflect.Uint64 {
			sc["minimum"] = 0
		}
		return sc
	case reflect.Float32, reflect.Float64:
		return map[string]any{"type": "number"}
	case reflect.String:
		return map[string]any{"type": "string"}
	case reflect.Slice, reflect.Array:
		if ty.Elem().Kind() == reflect.Uint8 && ty.Kind() == reflect.Slice {
			return map[string]any{"type": "string", "format": "byte"}
		}
		return map[string]any{"type": "array", "items": s.of(ty.Elem())}
	case reflect.Map:
		return map[string]any{"type": "object", "additionalProperties": s.of(ty.Elem())}
	case reflect.Struct:
		if ty.Name() == "" {
			return s.object(ty)
		}
		return s.ref(ty)
	}
	return map[string]any{} // interfaces: any JSON value
}

func (s *schemas) ref(ty reflect.Type) map[string]any {
	name, ok := s.names[ty]
	if !ok {
		name = strings.ToUpper(ty.Name()[:1]) + ty.Name()[1:]
		if _, taken := s.defs[name]; taken {
			pkg := ty.PkgPath()[strings.LastIndex(ty.PkgPath(), "/")+1:]
			name = strings.ToUpper(pkg[:1]) + pkg[1:] + name
		}
		s.names[ty] = name
		s.defs[name] = map[string]any{} // breaks recursion
		s.defs[name] = s.object(ty)
	}
	return map[string]any{"$ref": "#/components/schemas/" + name}
}

// object is a struct's schema: its exported fields by their JSON names (embedded structs'
// fields inline), the ones without omitempty required.
func (s *schemas) object(ty reflect.Type) map[string]any {
	props := map[string]any{}
	var required []string
	var walk func(reflect.Type)
	walk = func(ty reflect.Type) {
		for i := 0; i < ty.NumField(); i++ {
			f := ty.Field(i)
			tag := f.Tag.Get("json")
			if tag == "-" {
				continue
			}
			name, opts, _ := strings.Cut(tag, ",")
			if f.Anonymous && name == "" {
				et := f.Type
				if et.Kind() == reflect.Pointer {
					et = et.Elem()
				}
				if et.Kind() == reflect.Struct {
					walk(et)
					continue
				}
			}
			if !f.IsExported() {
				continue
			}
			if name == "" {
				name = f.Name
			}
			sc := s.of(f.Type)
			if strings.Contains(","+opts+",", ",string,") {
				sc = map[string]any{"type": "string"}
			}
			props[name] = sc
			if !strings.Contains(","+opts+",", ",omitempty,") && !strings.Contains(","+opts+",", ",omitzero,") {
				required = append(required, name)
			}
		}
	}
	walk(ty)
	out := map[string]any{"type": "object", "properties": props}
	if len(required) > 0 {
		out["required"] = required
	}
	return out
}
