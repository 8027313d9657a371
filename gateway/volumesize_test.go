package gateway

import (
	"errors"
	"strings"
	"testing"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// --mount-named takes size=SIZE in the units --memory takes; without it a volume is 8 GiB.
func TestNamedMountSize(t *testing.T) {
	vols, err := parseNamedMounts([]string{"deps:/deps,kind=disk,size=2g", "cache:/cache,size=512", "tmp:/t"})
	if err != nil {
		t.Fatal(err)
	}
	if vols[0].SizeMiB != 2048 || vols[1].SizeMiB != 512 || vols[2].SizeMiB != 8192 {
		t.Fatalf("sizes %+v", vols)
	}
	if vv := vmmVolumes(vols); vv[0].SizeMiB != 2048 {
		t.Fatalf("the vmm is asked for %+v", vv)
	}
	for _, bad := range []string{"d:/d,size=", "d:/d,size=lots", "d:/d,size=8m", "d:/d,size=5t", "d:/d,size=1.5m"} {
		_, err := parseNamedMounts([]string{bad})
		if !errors.Is(err, errdefs.ErrInvalid) || !strings.Contains(err.Error(), "size must be 16 MiB to 4 TiB, as in size=2g") {
			t.Errorf("%q: %v", bad, err)
		}
	}
}
