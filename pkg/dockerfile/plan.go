package dockerfile

import (
	"encoding/json"
	"fmt"
	"path"
	"slices"
	"strconv"
	"strings"

	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

// Config is an image's config as a build leaves it: the defaults of nexus exec, as the vmm
// records them.
type Config = vmmapi.ImageConfig

func cloneConfig(c Config) Config {
	c.Env, c.Entrypoint, c.Cmd, c.ExposedPorts = slices.Clone(c.Env), slices.Clone(c.Entrypoint), slices.Clone(c.Cmd), slices.Clone(c.ExposedPorts)
	if c.Labels != nil {
		l := make(map[string]string, len(c.Labels))
		for k, v := range c.Labels {
			l[k] = v
		}
		c.Labels = l
	}
	return c
}

// Step is one instruction after FROM with everything it needs resolved: what runs in the
// builder (RUN), what is copied (COPY, ADD), the directory WORKDIR makes, and the image config
// after it.
type Step struct {
	Line int    `json:"-"`
	Text string `json:"text"` // the instruction as written, on one line (progress, errors)
	Cmd  string `json:"cmd"`
	// RUN: the command, its environment (ENV and ARG values), directory and user.
	Argv []string `json:"argv,omitempty"`
	Env  []string `json:"env,omitempty"`
	Dir  string   `json:"dir,omitempty"`
	User string   `json:"user,omitempty"`
	// COPY and ADD: source patterns in the context, the destination in the image (absolute;
	// a directory when it ends in /), and --chown/--chmod.
	Sources []string `json:"sources,omitempty"`
	Dest    string   `json:"dest,omitempty"`
	Chown   string   `json:"chown,omitempty"`
	Chmod   string   `json:"chmod,omitempty"`
	// Mkdir is the directory WORKDIR makes.
	Mkdir  string `json:"mkdir,omitempty"`
	Config Config `json:"config"`
}

// NeedsBuilder says whether the step changes the root, so it runs in a builder sandbox.
func (s Step) NeedsBuilder() bool {
	return s.Cmd == "RUN" || s.Cmd == "COPY" || s.Cmd == "ADD" || s.Mkdir != ""
}

// From returns the image the Dockerfile starts from, with the ARGs declared before FROM (and
// their --build-arg values) expanded, and the instruction.
func From(file string, ins []Instruction, buildArgs map[string]string) (string, Instruction, error) {
	args := map[string]string{}
	for _, in := range ins {
		switch in.Cmd {
		case "ARG":
			if err := declareArgs(file, in, args, buildArgs, nil); err != nil {
				return "", in, err
			}
		case "FROM":
			if p, ok := in.Flags["platform"]; ok && p != "linux/amd64" {
				return "", in, in.Errorf(file, "FROM --platform=%s: nexus guests run linux/amd64", p)
			}
			w, err := Words(in.Rest, lookupIn(args))
			if err != nil {
				return "", in, in.Errorf(file, "FROM: %v", err)
			}
			if len(w) != 1 && (len(w) != 3 || !strings.EqualFold(w[1], "AS")) {
				return "", in, in.Errorf(file, "FROM takes one image (FROM IMAGE [AS NAME])")
			}
			if w[0] == "scratch" {
				return "", in, in.Errorf(file, "FROM scratch is not supported: RUN needs a shell; start from nexus-mini or an image with one")
			}
			return w[0], in, nil
		default:
			return "", in, in.Errorf(file, "%s before FROM: only ARG may come before FROM", in.Cmd)
		}
	}
	return "", Instruction{}, fmt.Errorf("%s: no FROM", file)
}

func lookupIn(maps ...map[string]string) func(string) (string, bool) {
	return func(k string) (string, bool) {
		for _, m := range maps {
			if v, ok := m[k]; ok {
				return v, true
			}
		}
		return "", false
	}
}

// declareArgs handles ARG NAME[=DEFAULT]...: a --build-arg value wins over the default.
func declareArgs(file string, in Instruction, args, buildArgs map[string]string, env map[string]string) error {
	w, err := Words(in.Rest, lookupIn(env, args))
	if err != nil {
		return in.Errorf(file, "ARG: %v", err)
	}
	for _, a := range w {
		k, v, _ := strings.Cut(a, "=")
		if !validName(k) {
			return in.Errorf(file, "ARG: bad name %q", k)
		}
		if bv, ok := buildArgs[k]; ok {
			v = bv
		}
		args[k] = v
	}
	return nil
}

func validName(k string) bool {
	if k == "" {
		return false
	}
	for i, c := range k {
		if !(c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || i > 0 && c >= '0' && c <= '9') {
			return false
		}
	}
	return true
}

// Plan resolves the instructions after FROM over the base image's config.
func Plan(file string, ins []Instruction, buildArgs map[string]string, base Config) ([]Step, error) {
	i := slices.IndexFunc(ins, func(in Instruction) bool { return in.Cmd == "FROM" })
	if i < 0 {
		return nil, fmt.Errorf("%s: no FROM", file)
	}
	cfg := cloneConfig(base)
	args := map[string]string{} // ARGs of this stage
	cmdSet := false
	var steps []Step
	for _, in := range ins[i+1:] {
		env := envMap(cfg.Env)
		look := lookupIn(env, args)
		st := Step{Line: in.Line, Cmd: in.Cmd, Text: oneLine(in)}
		bad := func(format string, a ...any) error {
			return in.Errorf(file, "%s: %s", in.Cmd, fmt.Sprintf(format, a...))
		}
		switch in.Cmd {
		case "FROM":
			return nil, in.Errorf(file, "a second FROM: multi-stage builds are not supported")
		case "ARG":
			if err := declareArgs(file, in, args, buildArgs, env); err != nil {
				return nil, err
			}
		case "ENV":
			kv, err := pairs(in.Rest, look, true)
			if err != nil {
				return nil, bad("%v", err)
			}
			for _, p := range kv {
				cfg.Env = setEnv(cfg.Env, p[0], p[1])
			}
		case "LABEL":
			kv, err := pairs(in.Rest, look, false)
			if err != nil {
				return nil, bad("%v", err)
			}
			if cfg.Labels == nil {
				cfg.Labels = map[string]string{}
			}
			for _, p := range kv {
				cfg.Labels[p[0]] = p[1]
			}
		case "WORKDIR":
			d, err := Expand(in.Rest, look)
			if err != nil {
				return nil, bad("%v", err)
			}
			if !path.IsAbs(d) {
				d = path.Join("/", cfg.WorkingDir, d)
			}
			cfg.WorkingDir = path.Clean(d)
			st.Mkdir = cfg.WorkingDir
		case "USER":
			u, err := Expand(in.Rest, look)
			if err != nil || strings.ContainsAny(u, " \t") || u == "" {
				return nil, bad("takes one USER[:GROUP]")
			}
			cfg.User = u
		case "EXPOSE":
			w, err := Words(in.Rest, look)
			if err != nil {
				return nil, bad("%v", err)
			}
			for _, p := range w {
				port, proto, _ := strings.Cut(p, "/")
				n, err := strconv.Atoi(port)
				if err != nil || n < 1 || n > 65535 || (proto != "" && proto != "tcp" && proto != "udp") {
					return nil, bad("bad port %q (PORT[/tcp|/udp])", p)
				}
				if proto == "" {
					proto = "tcp"
				}
				if p := port + "/" + proto; !slices.Contains(cfg.ExposedPorts, p) {
					cfg.ExposedPorts = append(cfg.ExposedPorts, p)
				}
			}
		case "CMD", "ENTRYPOINT":
			argv := in.Exec
			if argv == nil {
				argv = []string{"/bin/sh", "-c", in.Rest}
			}
			if in.Cmd == "CMD" {
				cfg.Cmd, cmdSet = argv, true
			} else {
				cfg.Entrypoint = argv
				if !cmdSet { // as docker: a new entrypoint drops the base's CMD
					cfg.Cmd = nil
				}
			}
		case "RUN":
			st.Argv = in.Exec
			if st.Argv == nil {
				st.Argv = []string{"/bin/sh", "-c", in.Rest}
			}
			st.Env = slices.Clone(cfg.Env)
			for _, k := range sortedKeys(args) {
				if _, ok := env[k]; !ok {
					st.Env = append(st.Env, k+"="+args[k])
				}
			}
			st.Dir, st.User = cfg.WorkingDir, cfg.User
		case "COPY", "ADD":
			var w []string
			if strings.HasPrefix(in.Rest, "[") {
				if err := jsonArray(in.Rest, &w); err != nil {
					return nil, bad("bad JSON array: %v", err)
				}
			} else {
				var err error
				if w, err = Words(in.Rest, look); err != nil {
					return nil, bad("%v", err)
				}
			}
			if len(w) < 2 {
				return nil, bad("needs a source and a destination")
			}
			st.Sources, st.Dest = w[:len(w)-1], w[len(w)-1]
			for _, s := range st.Sources {
				if strings.Contains(s, "://") || strings.HasPrefix(s, "git@") {
					return nil, bad("%s is a URL: only files of the build context are copied; fetch it in a RUN (with --allow-host)", s)
				}
				if in.Cmd == "ADD" && isArchive(s) {
					return nil, bad("%s is an archive, which ADD would unpack and nexus does not: COPY it and unpack it in a RUN", s)
				}
			}
			dir := strings.HasSuffix(st.Dest, "/") || len(st.Sources) > 1
			if !path.IsAbs(st.Dest) {
				st.Dest = path.Join("/", cfg.WorkingDir, st.Dest)
			}
			st.Dest = path.Clean(st.Dest)
			if dir && st.Dest != "/" {
				st.Dest += "/"
			}
			st.Chown, st.Chmod = in.Flags["chown"], in.Flags["chmod"]
			if st.Chmod != "" {
				if _, err := strconv.ParseUint(st.Chmod, 8, 32); err != nil {
					return nil, bad("--chmod=%s: an octal mode, like 0755", st.Chmod)
				}
			}
			if strings.ContainsAny(st.Chown, " \t'\"$;") {
				return nil, bad("--chown=%s: USER[:GROUP]", st.Chown)
			}
		}
		st.Config = cloneConfig(cfg)
		steps = append(steps, st)
	}
	return steps, nil
}

func jsonArray(s string, out *[]string) error { return json.Unmarshal([]byte(s), out) }

func isArchive(s string) bool {
	for _, ext := range []string{".tar", ".tar.gz", ".tgz", ".tar.bz2", ".tbz2", ".tar.xz", ".txz", ".tar.zst"} {
		if strings.HasSuffix(strings.ToLower(s), ext) {
			return true
		}
	}
	return false
}

// pairs reads K=V words (LABEL, ENV). legacy allows ENV's old form, "ENV K the rest".
func pairs(rest string, look func(string) (string, bool), legacy bool) ([][2]string, error) {
	w, err := Words(rest, look)
	if err != nil {
		return nil, err
	}
	if len(w) > 0 && !strings.Contains(w[0], "=") {
		if !legacy {
			return nil, fmt.Errorf("%q is not KEY=VALUE", w[0])
		}
		k, v, _ := strings.Cut(strings.TrimSpace(rest), " ")
		vw, err := Words(strings.TrimSpace(v), look)
		if err != nil {
			return nil, err
		}
		if !validName(k) {
			return nil, fmt.Errorf("bad name %q", k)
		}
		return [][2]string{{k, strings.Join(vw, " ")}}, nil
	}
	var out [][2]string
	for _, kv := range w {
		k, v, ok := strings.Cut(kv, "=")
		if !ok || k == "" {
			return nil, fmt.Errorf("%q is not KEY=VALUE", kv)
		}
		if legacy && !validName(k) {
			return nil, fmt.Errorf("bad name %q", k)
		}
		out = append(out, [2]string{k, v})
	}
	return out, nil
}

func envMap(env []string) map[string]string {
	m := map[string]string{}
	for _, kv := range env {
		if k, v, ok := strings.Cut(kv, "="); ok {
			m[k] = v
		}
	}
	return m
}

func setEnv(env []string, k, v string) []string {
	for i, kv := range env {
		if strings.HasPrefix(kv, k+"=") {
			env[i] = k + "=" + v
			return env
		}
	}
	return append(env, k+"="+v)
}

func sortedKeys(m map[string]string) []string {
	out := make([]string, 0, len(m))
	for k := range m {
		out = append(out, k)
	}
	slices.Sort(out)
	return out
}

func oneLine(in Instruction) string {
	s := in.Cmd
	for _, k := range sortedKeys(in.Flags) {
		s += " --" + k + "=" + in.Flags[k]
	}
	s += " " + strings.Join(strings.Fields(in.Rest), " ")
	if len(s) > 120 {
		s = s[:117] + "..."
	}
	return s
}
