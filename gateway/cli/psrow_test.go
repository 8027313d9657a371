package cli

import (
	"reflect"
	"strings"
	"testing"

	api "github.com/IniZio/nexus/pkg/api/gateway"
)

// TestPSRowMirrorsSandboxView: each column ps decodes (psRow) is a field of the view the gateway
// sends, under the same JSON name and of the same type, so that a renamed field cannot leave a
// column of the table silently empty.
func TestPSRowMirrorsSandboxView(t *testing.T) {
	fields := map[string]reflect.Type{}
	var walk func(reflect.Type)
	walk = func(ty reflect.Type) {
		for i := range ty.NumField() {
			f := ty.Field(i)
			if f.Anonymous {
				walk(f.Type)
				continue
			}
			if name, _, _ := strings.Cut(f.Tag.Get("json"), ","); name != "" && name != "-" {
				fields[name] = f.Type
			}
		}
	}
	walk(reflect.TypeFor[api.SandboxView]())
	row := reflect.TypeFor[psRow]()
	for i := range row.NumField() {
		f := row.Field(i)
		name, _, _ := strings.Cut(f.Tag.Get("json"), ",")
		if ty, ok := fields[name]; !ok || ty != f.Type {
			t.Errorf("psRow.%s reads %q as %s; SandboxView has %v there", f.Name, name, f.Type, ty)
		}
	}
}
