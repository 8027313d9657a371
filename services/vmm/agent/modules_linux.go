package agent

import (
	"bufio"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"golang.org/x/sys/unix"

	"github.com/IniZio/nexus/pkg/agentproto"
)

// moduleName is the kernel's name for a module file: its base name without ".ko", '-' as '_'.
func moduleName(path string) string {
	base := filepath.Base(path)
	base, _, _ = strings.Cut(base, ".ko")
	return normModule(base)
}

// LoadModules loads every module listed in list (absolute paths in dependency order, one a
// line; blank lines and #comments skipped; those after the agentproto.SharesModulesMarker line
// only when the command line says the VM has host shares), with parameters from the command
// line. A module already loaded (or built in) is fine. It tries every module and reports all
// failures.
func LoadModules(list string, cmd Cmdline) (loaded int, err error) {
	f, err := os.Open(list)
	if err != nil {
		if errors.Is(err, os.ErrNotExist) {
			return 0, nil
		}
		return 0, fmt.Errorf("modules: %w", err)
	}
	defer f.Close()
	var errs []error
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		path := strings.TrimSpace(sc.Text())
		if path == agentproto.SharesModulesMarker && cmd.Get(agentproto.CmdlineShares) == "" {
			break
		}
		if path == "" || strings.HasPrefix(path, "#") {
			continue
		}
		if err := loadModule(path, cmd.ModuleParams(moduleName(path))); err != nil {
			errs = append(errs, err)
			continue
		}
		loaded++
	}
	if err := sc.Err(); err != nil {
		errs = append(errs, fmt.Errorf("modules: %s: %w", list, err))
	}
	return loaded, errors.Join(errs...)
}

func loadModule(path, params string) error {
	fd, err := unix.Open(path, unix.O_RDONLY|unix.O_CLOEXEC, 0)
	if err != nil {
		return fmt.Errorf("module %s: %w", path, err)
	}
	defer unix.Close(fd)
	for {
		err = unix.FinitModule(fd, params, 0)
		if err != unix.EINTR {
			break
		}
	}
	if err != nil && err != unix.EEXIST {
		return fmt.Errorf("module %s: %w", path, err)
	}
	return nil
}
