package cli

import (
	"strconv"

	"github.com/spf13/pflag"

	"github.com/IniZio/nexus/pkg/bytesize"
)

// mibValue is a size flag held in MiB: --memory 4g, 512m, or plain MiB.
type mibValue struct{ p *int }

func (v mibValue) String() string {
	if v.p == nil || *v.p == 0 {
		return ""
	}
	return strconv.Itoa(*v.p)
}
func (v mibValue) Type() string { return "size" }
func (v mibValue) Set(s string) error {
	n, err := bytesize.ParseMiB(s)
	if err != nil {
		return err
	}
	*v.p = n
	return nil
}

// memoryFlag declares --memory on f, into p (MiB).
func memoryFlag(f *pflag.FlagSet, p *int) {
	f.Var(mibValue{p}, "memory", "memory: a size such as 512m or 4g, or plain MiB (default 1024 MiB)")
}
