// Package dockerfile parses the subset of the Dockerfile language `nexus image build -f` builds:
// one stage of FROM, RUN, COPY, ADD (context files only), ENV, ARG, WORKDIR, USER, ENTRYPOINT,
// CMD, LABEL and EXPOSE. Anything else is refused with its line number, so a build never
// silently means something other than what docker would do.
//
// A Dockerfile is user input: its size, the number of instructions and the length of a line
// are bounded, and every error is one line naming the line it is about.
package dockerfile

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strings"
)

// Bounds on a Dockerfile.
const (
	MaxSize         = 1 << 20
	MaxInstructions = 4096
)

// Supported lists the instructions nexus builds, in the order the help names them.
var Supported = []string{"FROM", "RUN", "COPY", "ADD", "ENV", "ARG", "WORKDIR", "USER", "ENTRYPOINT", "CMD", "LABEL", "EXPOSE"}

// refused are docker instructions nexus knows and does not build.
var refused = map[string]string{
	"HEALTHCHECK": "nexus runs no health checks",
	"ONBUILD":     "triggers are not built",
	"STOPSIGNAL":  "sandboxes are stopped by nexus, not by a signal to an init",
	"SHELL":       "RUN's shell form always runs /bin/sh -c",
	"VOLUME":      "use nexus create --mount-named for volumes",
}

// Instruction is one instruction of a Dockerfile.
type Instruction struct {
	Line int    // the line it starts on (1-based)
	Cmd  string // upper case: RUN, COPY, ...
	// Flags are the --name=value options before the arguments (COPY --chown, FROM --platform).
	Flags map[string]string
	// Rest is the text after the instruction and its flags, joined across continuation lines.
	Rest string
	// Exec is the JSON array of an exec-form RUN, CMD or ENTRYPOINT (nil for the shell form).
	Exec []string
}

// Error is a parse or build error about one line.
type Error struct {
	File string
	Line int
	Msg  string
}

func (e *Error) Error() string { return fmt.Sprintf("%s:%d: %s", e.File, e.Line, e.Msg) }

// Errorf returns an Error about the instruction's line.
func (in Instruction) Errorf(file, format string, args ...any) error {
	return &Error{File: file, Line: in.Line, Msg: fmt.Sprintf(format, args...)}
}

// Parse reads a Dockerfile (named file in errors).
func Parse(file string, r io.Reader) ([]Instruction, error) {
	b, err := io.ReadAll(io.LimitReader(r, MaxSize+1))
	if err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if len(b) > MaxSize {
		return nil, fmt.Errorf("%s: larger than %d bytes", file, MaxSize)
	}
	var out []Instruction
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(make([]byte, 64<<10), MaxSize)
	var cur strings.Builder
	start, line := 0, 0
	flush := func() error {
		text := strings.TrimSpace(cur.String())
		cur.Reset()
		if text == "" {
			return nil
		}
		in, err := parseLine(file, start, text)
		if err != nil {
			return err
		}
		if len(out) >= MaxInstructions {
			return &Error{File: file, Line: start, Msg: fmt.Sprintf("more than %d instructions", MaxInstructions)}
		}
		out = append(out, in)
		return nil
	}
	for sc.Scan() {
		line++
		l := strings.TrimRight(sc.Text(), " \t\r")
		trimmed := strings.TrimSpace(l)
		if strings.HasPrefix(trimmed, "#") { // comments (and parser directives, ignored)
			continue
		}
		if trimmed == "" { // also inside a continuation, as docker reads it
			continue
		}
		if cur.Len() == 0 {
			start = line
		}
		if cont, ok := strings.CutSuffix(l, "\\"); ok {
			cur.WriteString(cont)
			cur.WriteByte(' ')
			continue
		}
		cur.WriteString(l)
		if err := flush(); err != nil {
			return nil, err
		}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("%s: %w", file, err)
	}
	if err := flush(); err != nil {
		return nil, err
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("%s: no instructions", file)
	}
	return out, nil
}

func parseLine(file string, line int, text string) (Instruction, error) {
	word, rest, _ := strings.Cut(text, " ")
	if i := strings.IndexByte(word, '\t'); i >= 0 {
		word, rest = word[:i], word[i+1:]+" "+rest
	}
	in := Instruction{Line: line, Cmd: strings.ToUpper(word)}
	rest = strings.TrimSpace(rest)
	bad := func(format string, args ...any) (Instruction, error) {
		return in, &Error{File: file, Line: line, Msg: fmt.Sprintf(format, args...)}
	}
	if why, ok := refused[in.Cmd]; ok {
		return bad("%s is not supported (%s); nexus image build supports %s", in.Cmd, why, strings.Join(Supported, ", "))
	}
	if in.Cmd == "MAINTAINER" { // deprecated: a label, as docker records it
		in.Cmd, rest = "LABEL", "maintainer="+quote(rest)
	}
	known := false
	for _, s := range Supported {
		known = known || s == in.Cmd
	}
	if !known {
		return bad("unknown instruction %q; nexus image build supports %s", word, strings.Join(Supported, ", "))
	}
	for strings.HasPrefix(rest, "--") {
		f, r, _ := strings.Cut(rest, " ")
		k, v, _ := strings.Cut(f[2:], "=")
		if in.Flags == nil {
			in.Flags = map[string]string{}
		}
		in.Flags[k] = v
		rest = strings.TrimSpace(r)
	}
	if err := checkFlags(in); err != "" {
		return bad("%s", err)
	}
	in.Rest = rest
	switch in.Cmd {
	case "RUN", "CMD", "ENTRYPOINT":
		if strings.HasPrefix(rest, "[") {
			var argv []string
			if err := json.Unmarshal([]byte(rest), &argv); err != nil {
				return bad("%s: bad JSON array: %v", in.Cmd, err)
			}
			if argv == nil {
				argv = []string{}
			}
			in.Exec = argv
		}
		if in.Cmd == "RUN" && rest == "" {
			return bad("RUN needs a command")
		}
	default:
		if rest == "" {
			return bad("%s needs an argument", in.Cmd)
		}
	}
	return in, nil
}

// flags lists the options each instruction takes.
var flags = map[string][]string{"FROM": {"platform"}, "COPY": {"chown", "chmod"}, "ADD": {"chown", "chmod"}}

func checkFlags(in Instruction) string {
	for k := range in.Flags {
		ok := false
		for _, f := range flags[in.Cmd] {
			ok = ok || f == k
		}
		switch {
		case ok:
		case k == "from" && (in.Cmd == "COPY" || in.Cmd == "ADD"):
			return in.Cmd + " --from is not supported: nexus builds one stage"
		case k == "mount" && in.Cmd == "RUN":
			return "RUN --mount is not supported"
		default:
			return fmt.Sprintf("%s has no option --%s", in.Cmd, k)
		}
	}
	return ""
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// Words splits s into words as the shell would for ENV, LABEL, COPY and the like: quotes and
// backslashes group and escape, and $NAME, ${NAME}, ${NAME:-default} and ${NAME:+alt} expand
// with lookup (not inside single quotes). Unset names expand to nothing.
func Words(s string, lookup func(string) (string, bool)) ([]string, error) {
	var out []string
	var cur strings.Builder
	inWord := false
	quote := byte(0)
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case quote == '\'':
			if c == '\'' {
				quote = 0
			} else {
				cur.WriteByte(c)
			}
		case c == '\\' && i+1 < len(s) && (quote == 0 || strings.IndexByte(`"\$`, s[i+1]) >= 0):
			i++
			cur.WriteByte(s[i])
			inWord = true
		case c == '"':
			if quote == '"' {
				quote = 0
			} else {
				quote = '"'
			}
			inWord = true
		case c == '\'' && quote == 0:
			quote, inWord = '\'', true
		case c == '$' && lookup != nil:
			v, n, err := expandAt(s[i:], lookup)
			if err != nil {
				return nil, err
			}
			cur.WriteString(v)
			i += n - 1
			inWord = true
		case (c == ' ' || c == '\t') && quote == 0:
			if inWord {
				out = append(out, cur.String())
				cur.Reset()
				inWord = false
			}
		default:
			cur.WriteByte(c)
			inWord = true
		}
	}
	if quote != 0 {
		return nil, fmt.Errorf("unterminated %c quote", quote)
	}
	if inWord {
		out = append(out, cur.String())
	}
	return out, nil
}

// Expand replaces variables in s as Words does, keeping quotes and spaces as they are (for a
// path or a user name that is one word).
func Expand(s string, lookup func(string) (string, bool)) (string, error) {
	var out strings.Builder
	for i := 0; i < len(s); i++ {
		if s[i] == '\\' && i+1 < len(s) && s[i+1] == '$' {
			out.WriteByte('$')
			i++
			continue
		}
		if s[i] != '$' {
			out.WriteByte(s[i])
			continue
		}
		v, n, err := expandAt(s[i:], lookup)
		if err != nil {
			return "", err
		}
		out.WriteString(v)
		i += n - 1
	}
	return out.String(), nil
}

// expandAt expands the variable reference at the start of s ("$..."), returning its value and
// how many bytes it took.
func expandAt(s string, lookup func(string) (string, bool)) (string, int, error) {
	isName := func(c byte, first bool) bool {
		return c == '_' || c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || !first && c >= '0' && c <= '9'
	}
	if len(s) > 1 && s[1] == '{' {
		end := strings.IndexByte(s, '}')
		if end < 0 {
			return "", 0, fmt.Errorf("unterminated ${ in %q", s)
		}
		body := s[2:end]
		name, word, op := body, "", ""
		if i := strings.Index(body, ":-"); i >= 0 {
			name, word, op = body[:i], body[i+2:], "-"
		} else if i := strings.Index(body, ":+"); i >= 0 {
			name, word, op = body[:i], body[i+2:], "+"
		}
		for j := 0; j < len(name); j++ {
			if !isName(name[j], j == 0) {
				return "", 0, fmt.Errorf("bad variable name in ${%s}", body)
			}
		}
		if name == "" {
			return "", 0, fmt.Errorf("empty variable name in ${}")
		}
		v, set := lookup(name)
		switch {
		case op == "-" && (!set || v == ""):
			v = word
		case op == "+":
			if set && v != "" {
				v = word
			} else {
				v = ""
			}
		}
		return v, end + 1, nil
	}
	n := 1
	for n < len(s) && isName(s[n], n == 1) {
		n++
	}
	if n == 1 {
		return "$", 1, nil
	}
	v, _ := lookup(s[1:n])
	return v, n, nil
}
