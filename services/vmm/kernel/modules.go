package kernel

import (
	"bufio"
	"fmt"
	"os"
	"path"
	"path/filepath"
	"strings"

	"github.com/IniZio/nexus/pkg/errdefs"
)

// Module is one loadable module resolved against modules.dep.
type Module struct {
	Name string // normalised name: dashes become underscores (crc32c-intel → crc32c_intel)
	Path string // relative to ModulesDir, e.g. kernel/drivers/virtio/virtio.ko (possibly .ko.xz/.ko.zst)
}

// NormalizeName maps a module or file name to the kernel's module name.
func NormalizeName(s string) string {
	s = path.Base(s)
	for _, ext := range []string{".xz", ".zst", ".gz"} {
		s = strings.TrimSuffix(s, ext)
	}
	s = strings.TrimSuffix(s, ".ko")
	return strings.ReplaceAll(s, "-", "_")
}

// Resolve returns the loadable modules needed for names, dependencies first, each once, in a
// stable order. Names built into the kernel (modules.builtin) are skipped; a name that is neither
// a module nor built in is an invalid-argument error.
func (k *Kernel) Resolve(names []string) ([]Module, error) {
	deps, err := readDeps(filepath.Join(k.ModulesDir, "modules.dep"))
	if err != nil {
		return nil, err
	}
	builtin, err := readBuiltin(filepath.Join(k.ModulesDir, "modules.builtin"))
	if err != nil {
		return nil, err
	}
	var out []Module
	seen := map[string]bool{}
	var visit func(name string, stack []string) error
	visit = func(name string, stack []string) error {
		if seen[name] {
			return nil
		}
		e, ok := deps[name]
		if !ok {
			return fmt.Errorf("kernel: module %s: missing from modules.dep", name)
		}
		for _, s := range stack {
			if s == name {
				return fmt.Errorf("kernel: module dependency cycle through %s", name)
			}
		}
		// modules.dep lists the full closure with the deepest dependency last; walking it
		// backwards gives modprobe's order, and the recursion makes it correct regardless.
		for i := len(e.deps) - 1; i >= 0; i-- {
			if err := visit(NormalizeName(e.deps[i]), append(stack, name)); err != nil {
				return err
			}
		}
		seen[name] = true
		out = append(out, Module{Name: name, Path: e.path})
		return nil
	}
	for _, n := range names {
		name := NormalizeName(n)
		if _, ok := deps[name]; !ok {
			if builtin[name] {
				continue
			}
			return nil, errdefs.Invalid("kernel %s has no module %s (neither loadable nor built in)", k.Version, n)
		}
		if err := visit(name, nil); err != nil {
			return nil, err
		}
	}
	return out, nil
}

// Builtin reports whether a module name is compiled into the kernel.
func (k *Kernel) Builtin(name string) (bool, error) {
	b, err := readBuiltin(filepath.Join(k.ModulesDir, "modules.builtin"))
	if err != nil {
		return false, err
	}
	return b[NormalizeName(name)], nil
}

type depEntry struct {
	path string
	deps []string
}

// readDeps parses modules.dep: "kernel/a.ko: kernel/b.ko kernel/c.ko" per line.
func readDeps(file string) (map[string]depEntry, error) {
	f, err := os.Open(file)
	if err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	defer f.Close()
	m := map[string]depEntry{}
	sc := bufio.NewScanner(f)
	sc.Buffer(make([]byte, 64*1024), 1<<20)
	for sc.Scan() {
		line := sc.Text()
		mod, rest, ok := strings.Cut(line, ":")
		if !ok {
			continue
		}
		m[NormalizeName(mod)] = depEntry{path: strings.TrimSpace(mod), deps: strings.Fields(rest)}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("kernel: read modules.dep: %w", err)
	}
	return m, nil
}

func readBuiltin(file string) (map[string]bool, error) {
	b, err := os.ReadFile(file)
	if err != nil {
		return nil, fmt.Errorf("kernel: %w", err)
	}
	m := map[string]bool{}
	for _, l := range strings.Split(string(b), "\n") {
		if l = strings.TrimSpace(l); l != "" {
			m[NormalizeName(l)] = true
		}
	}
	return m, nil
}
