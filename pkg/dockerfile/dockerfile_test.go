package dockerfile

import (
	"slices"
	"strings"
	"testing"
)

func parse(t *testing.T, src string) []Instruction {
	t.Helper()
	ins, err := Parse("Dockerfile", strings.NewReader(src))
	if err != nil {
		t.Fatal(err)
	}
	return ins
}

func TestParseContinuationsCommentsAndForms(t *testing.T) {
	ins := parse(t, "# syntax=docker/dockerfile:1\nFROM nexus-mini AS base\n\nRUN echo a \\\n  # inside\n  && echo b\nCMD [\"cat\", \"x\"]\ncopy --chown=1:1 a b /d/\n")
	if len(ins) != 4 {
		t.Fatalf("%d instructions: %+v", len(ins), ins)
	}
	if ins[1].Cmd != "RUN" || ins[1].Line != 4 || ins[1].Exec != nil || !strings.Contains(ins[1].Rest, "echo a") || !strings.Contains(ins[1].Rest, "&& echo b") {
		t.Errorf("RUN: %+v", ins[1])
	}
	if !slices.Equal(ins[2].Exec, []string{"cat", "x"}) {
		t.Errorf("CMD exec form: %+v", ins[2])
	}
	if ins[3].Cmd != "COPY" || ins[3].Flags["chown"] != "1:1" || ins[3].Line != 8 {
		t.Errorf("COPY: %+v", ins[3])
	}
}

func TestParseRefusals(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"FROM a\nHEALTHCHECK CMD true\n", "Dockerfile:2: HEALTHCHECK is not supported"},
		{"FROM a\n\nFROBNICATE x\n", `Dockerfile:3: unknown instruction "FROBNICATE"`},
		{"FROM a\nCOPY --from=b x y\n", "Dockerfile:2: COPY --from is not supported"},
		{"FROM a\nRUN --mount=type=cache x\n", "Dockerfile:2: RUN --mount is not supported"},
		{"FROM a\nCMD [\"x\",\n", "Dockerfile:2: CMD: bad JSON array"},
		{"FROM a\nWORKDIR\n", "Dockerfile:2: WORKDIR needs an argument"},
		{"# only a comment\n", "no instructions"},
		{"FROM a\n" + strings.Repeat("x", MaxSize), "larger than"},
	} {
		_, err := Parse("Dockerfile", strings.NewReader(c.src))
		if err == nil || !strings.Contains(err.Error(), c.want) || strings.Contains(err.Error(), "\n") {
			t.Errorf("%q: %v, want %q", c.src[:min(len(c.src), 40)], err, c.want)
		}
	}
}

func TestWordsAndExpand(t *testing.T) {
	env := map[string]string{"A": "1", "EMPTY": ""}
	look := lookupIn(env)
	w, err := Words(`K=$A "two words" 'no $A' ${B:-def} ${A:+alt} ${EMPTY:-e} \$A x\ y`, look)
	if err != nil {
		t.Fatal(err)
	}
	want := []string{"K=1", "two words", "no $A", "def", "alt", "e", "$A", "x y"}
	if !slices.Equal(w, want) {
		t.Errorf("Words = %q, want %q", w, want)
	}
	if _, err := Words(`"open`, look); err == nil {
		t.Error("an unterminated quote was accepted")
	}
	if s, _ := Expand("/srv/${A}/$A$", look); s != "/srv/1/1$" {
		t.Errorf("Expand = %q", s)
	}
}

func TestPlan(t *testing.T) {
	src := `ARG V=1
FROM img:${V}
ARG WHO=world
ENV HOME_DIR=/srv PATH=/usr/bin:/bin
ENV LEGACY the old form
WORKDIR $HOME_DIR
WORKDIR app
COPY a b ./
COPY ["x y", "/dst"]
RUN echo $WHO
USER app:app
LABEL a=b "c d"="e f"
EXPOSE 80 53/udp
ENTRYPOINT ["/bin/run"]
`
	ins := parse(t, src)
	from, _, err := From("Dockerfile", ins, map[string]string{"V": "2"})
	if err != nil || from != "img:2" {
		t.Fatalf("From = %q, %v", from, err)
	}
	steps, err := Plan("Dockerfile", ins, map[string]string{"WHO": "you", "UNUSED": "x"}, Config{Env: []string{"PATH=/old"}, Cmd: []string{"base-cmd"}})
	if err != nil {
		t.Fatal(err)
	}
	byCmd := func(cmd string, n int) Step {
		for _, s := range steps {
			if s.Cmd == cmd {
				if n == 0 {
					return s
				}
				n--
			}
		}
		t.Fatalf("no %s", cmd)
		return Step{}
	}
	if w := byCmd("WORKDIR", 1); w.Mkdir != "/srv/app" {
		t.Errorf("relative WORKDIR: %+v", w)
	}
	if c := byCmd("COPY", 0); c.Dest != "/srv/app/" || !slices.Equal(c.Sources, []string{"a", "b"}) {
		t.Errorf("COPY to ./: %+v", c)
	}
	if c := byCmd("COPY", 1); c.Dest != "/dst" || !slices.Equal(c.Sources, []string{"x y"}) {
		t.Errorf("COPY JSON form: %+v", c)
	}
	r := byCmd("RUN", 0)
	if !slices.Equal(r.Argv, []string{"/bin/sh", "-c", "echo $WHO"}) || r.Dir != "/srv/app" || !slices.Contains(r.Env, "WHO=you") ||
		!slices.Contains(r.Env, "PATH=/usr/bin:/bin") || slices.Contains(r.Env, "UNUSED=x") {
		t.Errorf("RUN: %+v", r)
	}
	c := steps[len(steps)-1].Config
	if c.User != "app:app" || c.Labels["c d"] != "e f" || !slices.Equal(c.ExposedPorts, []string{"80/tcp", "53/udp"}) ||
		!slices.Equal(c.Entrypoint, []string{"/bin/run"}) || c.Cmd != nil || !slices.Contains(c.Env, "LEGACY=the old form") ||
		slices.Contains(c.Env, "WHO=you") {
		t.Errorf("final config: %+v (a new ENTRYPOINT drops the base's CMD; ARGs are not kept)", c)
	}
}

func TestPlanRefusals(t *testing.T) {
	for _, c := range []struct{ src, want string }{
		{"RUN x\nFROM a\n", "Dockerfile:1: RUN before FROM"},
		{"FROM a\nFROM b\n", "Dockerfile:2: a second FROM"},
		{"FROM scratch\n", "FROM scratch is not supported"},
		{"FROM --platform=linux/arm64 a\n", "linux/amd64"},
		{"FROM a\nADD https://example.com/x /x\n", "Dockerfile:2: ADD: https://example.com/x is a URL"},
		{"FROM a\nADD x.tar.gz /x\n", "is an archive"},
		{"FROM a\nEXPOSE 99999\n", "bad port"},
		{"FROM a\nCOPY x\n", "needs a source and a destination"},
		{"FROM a\nCOPY --chmod=rwx x /y\n", "octal mode"},
		{"FROM a\nLABEL novalue\n", "is not KEY=VALUE"},
	} {
		ins, err := Parse("Dockerfile", strings.NewReader(c.src))
		if err == nil {
			_, _, err = From("Dockerfile", ins, nil)
		}
		if err == nil {
			_, err = Plan("Dockerfile", ins, nil, Config{})
		}
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%q: %v, want %q", c.src, err, c.want)
		}
	}
}
