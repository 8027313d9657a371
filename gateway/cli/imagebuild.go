package cli

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path"
	"path/filepath"
	"regexp"
	"strings"
	"time"

	"github.com/nats-io/nuid"
	"github.com/spf13/cobra"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/dockerfile"
	"github.com/IniZio/nexus/pkg/errdefs"
)

// dockerBuild is what `nexus image build -f` was asked.
type dockerBuild struct {
	file       string
	context    string
	tag        string
	buildArgs  []string
	allowHosts []string
	maxContext int64
	memoryMiB  int
	noCache    bool
}

// BuildProgress is one line of `nexus image build -f --json` on stderr: a step starting,
// cached, done or failed, or (Output) a chunk of a RUN's output.
type BuildProgress struct {
	Step        string  `json:"step"` // "2/5"
	Line        int     `json:"line,omitempty"`
	Instruction string  `json:"instruction,omitempty"`
	Status      string  `json:"status,omitempty"` // running, cached, done, failed
	Cached      bool    `json:"cached,omitempty"` // the step's result came from the build cache
	Seconds     float64 `json:"seconds,omitempty"`
	Output      string  `json:"output,omitempty"`
	Error       string  `json:"error,omitempty"`
}

// builderTTL bounds a builder sandbox's life should the CLI die mid-build.
const builderTTL = "2h"

// builderAllowAllFor is a builder sandbox's allow-all window.
const builderAllowAllFor = "24h"

// builder runs one Dockerfile build.
type builder struct {
	cmd   *cobra.Command
	c     *api.Client
	o     dockerBuild
	name  string // the builder sandbox, once created
	steps int
}

func (b *builder) report(p BuildProgress) {
	w := b.cmd.ErrOrStderr()
	if jsonOutput(b.cmd) {
		printJSONLine(w, p)
		return
	}
	switch {
	case p.Output != "":
		io.WriteString(w, p.Output)
	case p.Status == "running":
		fmt.Fprintf(w, "step %s  %s\n", p.Step, p.Instruction)
	case p.Status == "cached":
		fmt.Fprintf(w, "step %s  %s  (cached)\n", p.Step, p.Instruction)
	}
}

// buildOutput passes a RUN's output on: as is, or as Output progress lines under --json.
type buildOutput struct {
	b    *builder
	step string
	tail []byte // the last bytes, for the error of a failed step
}

func (o *buildOutput) Write(p []byte) (int, error) {
	o.tail = append(o.tail, p...)
	if len(o.tail) > 4<<10 {
		o.tail = o.tail[len(o.tail)-2<<10:]
	}
	o.b.report(BuildProgress{Step: o.step, Output: string(p)})
	return len(p), nil
}

func (o *buildOutput) lastLine() string {
	lines := strings.Split(strings.TrimSpace(string(o.tail)), "\n")
	return strings.TrimSpace(lines[len(lines)-1])
}

var tagChars = regexp.MustCompile(`[^a-z0-9._-]+`)

// runDockerBuild builds o.file over the context into an image and returns its record.
func runDockerBuild(cmd *cobra.Command, o dockerBuild) (vmmapi.ImageInfo, error) {
	c, _, err := dial(cmd)
	if err != nil {
		return vmmapi.ImageInfo{}, err
	}
	ctxDir, err := filepath.Abs(o.context)
	if err != nil {
		return vmmapi.ImageInfo{}, err
	}
	if fi, err := os.Stat(ctxDir); err != nil || !fi.IsDir() {
		return vmmapi.ImageInfo{}, errdefs.Invalid("image build: the context %s is not a directory", o.context)
	}
	if o.file == "" {
		o.file = filepath.Join(ctxDir, "Dockerfile")
	}
	if o.tag == "" {
		o.tag = strings.Trim(tagChars.ReplaceAllString(strings.ToLower(filepath.Base(ctxDir)), "-"), "-._")
		if o.tag == "" {
			o.tag = "build"
		}
	}
	args := map[string]string{}
	for _, a := range o.buildArgs {
		k, v, ok := strings.Cut(a, "=")
		if !ok {
			v, ok = os.LookupEnv(k) // as docker: --build-arg NAME takes the value from the environment
		}
		if k == "" || !ok {
			return vmmapi.ImageInfo{}, usageError{fmt.Errorf("--build-arg %q: give NAME=VALUE (or NAME set in the environment)", a)}
		}
		args[k] = v
	}
	var f io.ReadCloser
	if o.file == "-" {
		f = io.NopCloser(cmd.InOrStdin())
	} else if f, err = os.Open(o.file); err != nil {
		return vmmapi.ImageInfo{}, errdefs.Invalid("image build: %v", err)
	}
	label := filepath.Base(o.file)
	ins, err := dockerfile.Parse(label, f)
	f.Close()
	if err != nil {
		return vmmapi.ImageInfo{}, errdefs.Invalid("image build: %v", err)
	}
	fromRef, fromIns, err := dockerfile.From(label, ins, args)
	if err != nil {
		return vmmapi.ImageInfo{}, errdefs.Invalid("image build: %v", err)
	}
	b := &builder{cmd: cmd, c: c, o: o}
	base, err := b.baseImage(fromRef)
	if err != nil {
		return vmmapi.ImageInfo{}, fmt.Errorf("image build: %s:%d: FROM %s: %w", label, fromIns.Line, fromRef, err)
	}
	steps, err := dockerfile.Plan(label, ins, args, *base.ImageConfig())
	if err != nil {
		return vmmapi.ImageInfo{}, errdefs.Invalid("image build: %v", err)
	}
	b.steps = len(steps) + 1

	// The context is read only when something is copied from it.
	var bc *buildContext
	copies := make([][]copyItem, len(steps))
	for i, st := range steps {
		if st.Cmd != "COPY" && st.Cmd != "ADD" {
			continue
		}
		if bc == nil {
			if bc, err = loadContext(ctxDir, o.maxContext); err != nil {
				return vmmapi.ImageInfo{}, errdefs.Invalid("image build: %v", err)
			}
			defer bc.Close()
		}
		if copies[i], err = bc.copyPlan(st); err != nil {
			return vmmapi.ImageInfo{}, errdefs.Invalid("image build: %s:%d: %s: %v", label, st.Line, st.Cmd, err)
		}
	}

	// Cache keys: each step's hashes the one before, the step and what it copies. A build of
	// which a prefix was built before (by this Dockerfile or one it extends) starts there.
	keys := make([]string, len(steps))
	prev := "FROM " + base.Key
	for i, st := range steps {
		h := sha256.New()
		j, _ := json.Marshal(st)
		fmt.Fprintf(h, "%s\n%s\n", prev, j)
		if copies[i] != nil {
			d, err := bc.copyDigest(copies[i])
			if err != nil {
				return vmmapi.ImageInfo{}, fmt.Errorf("image build: %s:%d: %s: %w", label, st.Line, st.Cmd, err)
			}
			fmt.Fprintf(h, "%s\n", d)
		}
		prev = hex.EncodeToString(h.Sum(nil))
		keys[i] = prev
	}
	b.report(BuildProgress{Step: b.stepOf(0), Line: fromIns.Line, Instruction: "FROM " + fromRef, Status: "done"})
	// Where to start: the latest step whose result is here, as the image an earlier build of
	// this prefix made, or as the build cache layer a step that changed the root left.
	start, from := -1, base.Key
	if !o.noCache {
		for i := len(steps) - 1; i >= 0 && start < 0; i-- {
			key := vmmapi.ImageKey(vmmapi.BuildDigest(keys[i]))
			if _, err := c.Image(cmd.Context(), vmmapi.ImageRequest{Op: "inspect", Name: key}); err == nil {
				start, from = i, key
			} else if steps[i].NeedsBuilder() {
				key = layerKey(keys[i])
				if _, err := c.Image(cmd.Context(), vmmapi.ImageRequest{Op: "inspect", Name: key}); err == nil {
					start, from = i, key
				}
			}
		}
	}
	for i := 0; i <= start; i++ {
		b.report(BuildProgress{Step: b.stepOf(i + 1), Line: steps[i].Line, Instruction: steps[i].Text, Status: "cached", Cached: true})
	}
	final := steps[len(steps)-1].Config
	commit := vmmapi.ImageRequest{Op: "commit", Name: o.tag, BuildKey: keys[len(keys)-1], Source: "build " + label, Config: &final}
	needVM := false
	for _, st := range steps[start+1:] {
		needVM = needVM || st.NeedsBuilder()
	}
	if !needVM { // only the config changes: the new image has the root of where it starts
		for i := start + 1; i < len(steps); i++ {
			b.report(BuildProgress{Step: b.stepOf(i + 1), Line: steps[i].Line, Instruction: steps[i].Text, Status: "done"})
		}
		commit.Base = from
		ctx, cancel := context.WithTimeout(cmd.Context(), api.ImageTimeout)
		defer cancel()
		return c.Image(ctx, commit)
	}

	defer b.removeBuilder()
	if err := b.createBuilder(from); err != nil {
		return vmmapi.ImageInfo{}, fmt.Errorf("image build: starting the builder sandbox: %w", err)
	}
	for i := start + 1; i < len(steps); i++ {
		st := steps[i]
		p := BuildProgress{Step: b.stepOf(i + 1), Line: st.Line, Instruction: st.Text, Status: "running"}
		b.report(p)
		t0 := time.Now()
		err := b.runStep(st, bc, copies[i], p.Step)
		if err == nil && st.NeedsBuilder() {
			err = b.saveLayer(keys[i])
		}
		p.Seconds = time.Since(t0).Seconds()
		if err != nil {
			p.Status, p.Error = "failed", err.Error()
			b.report(p)
			return vmmapi.ImageInfo{}, fmt.Errorf("image build: step %s (%s:%d) %s: %w", p.Step, label, st.Line, st.Text, err)
		}
		p.Status = "done"
		b.report(p)
	}
	if err := b.stopBuilder(); err != nil {
		return vmmapi.ImageInfo{}, fmt.Errorf("image build: stopping the builder sandbox: %w", err)
	}
	commit.Sandbox = b.name
	ctx, cancel := context.WithTimeout(cmd.Context(), api.ImageTimeout)
	defer cancel()
	info, err := c.Image(ctx, commit)
	if err != nil {
		return info, fmt.Errorf("image build: committing the result: %w", err)
	}
	return info, nil
}

// layerKey is the vmm's key of the build cache layer of the step with cache key step
// (image.LayerKey).
func layerKey(step string) string { return "layer-" + step }

// saveLayer keeps the builder's disk as the build cache layer of the step just run.
func (b *builder) saveLayer(step string) error {
	ctx, cancel := context.WithTimeout(b.cmd.Context(), api.ImageTimeout)
	defer cancel()
	if _, err := b.c.Image(ctx, vmmapi.ImageRequest{Op: "layer-save", Sandbox: b.name, BuildKey: step}); err != nil {
		return fmt.Errorf("keeping the step in the build cache: %w", err)
	}
	return nil
}

func (b *builder) stepOf(i int) string { return fmt.Sprintf("%d/%d", i+1, b.steps) }

// baseImage finds the FROM image, building a built-in one or pulling a registry one first.
func (b *builder) baseImage(ref string) (vmmapi.ImageInfo, error) {
	info, err := b.c.Image(b.cmd.Context(), vmmapi.ImageRequest{Op: "inspect", Name: ref})
	if !errors.Is(err, errdefs.ErrNotFound) {
		return info, err
	}
	op := "pull"
	if !strings.ContainsAny(strings.SplitN(ref, "/", 2)[0], ".:") || !strings.Contains(ref, "/") {
		op = "build" // a built-in image not built yet (inspect refuses other unknown local names)
		ref = strings.SplitN(ref, ":", 2)[0]
	}
	return imageWithProgress(b.cmd, vmmapi.ImageRequest{Op: op, Name: ref}, op+"ing "+ref)
}

func (b *builder) createBuilder(image string) error {
	b.name = "nexus-build/b" + strings.ToLower(nuid.Next())[:16]
	// Cold: a builder's disk is an overlay on the image or layer itself, never on a template's
	// disk, so the layers kept of it depend only on what the build cache knows.
	r := api.CreateRequest{Name: b.name, Image: image, Labels: map[string]string{"nexus.build": "1"}, MemoryMiB: b.o.memoryMiB,
		AllowHosts: b.o.allowHosts, TTL: builderTTL, NoPortForward: true, Cold: true}
	if len(r.AllowHosts) == 0 {
		// The spec's builder VMs: allow-all for a bounded window (AllowAllFor(24h); the TTL
		// ends the builder first), audited, still refused private addresses, no MITM and no
		// credentials. --allow-host opts into default-deny with only the hosts it names.
		r.EgressMode = api.EgressAllowAll + "=" + builderAllowAllFor
	}
	ctx, cancel := context.WithTimeout(b.cmd.Context(), api.CreateTimeout)
	defer cancel()
	_, err := b.c.Create(ctx, r)
	return err
}

func (b *builder) stopBuilder() error {
	ctx, cancel := context.WithTimeout(b.cmd.Context(), time.Minute)
	defer cancel()
	res, err := b.c.Apply(ctx, api.Stop, api.NamesRequest{Names: []string{b.name}})
	if err == nil && len(res) == 1 && res[0].Error != "" {
		err = errors.New(res[0].Error)
	}
	return err
}

// removeBuilder removes the builder sandbox, whatever happened (its TTL is the backstop).
func (b *builder) removeBuilder() {
	if b.name == "" {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	b.c.Apply(ctx, api.Remove, api.NamesRequest{Names: []string{b.name}, Force: true})
}

// runStep runs one step in the builder: a RUN's command, a COPY's files, a WORKDIR's mkdir.
func (b *builder) runStep(st dockerfile.Step, bc *buildContext, items []copyItem, step string) error {
	ctx := b.cmd.Context()
	switch st.Cmd {
	case "RUN":
		out := &buildOutput{b: b, step: step}
		req := api.ExecRequest{Name: b.name, Argv: st.Argv, Env: st.Env, Dir: st.Dir, User: st.User}
		exit, err := b.c.Run(ctx, req, api.IO{Stdin: strings.NewReader(""), Stdout: out, Stderr: out})
		if err != nil {
			return err
		}
		if exit.Code != 0 {
			why := fmt.Sprintf("exit status %d", exit.Code)
			if exit.Error != "" {
				why = strings.TrimPrefix(exit.Error, "nexus: ")
			}
			if l := out.lastLine(); l != "" {
				why += ": " + l
			}
			return errors.New(why)
		}
		return nil
	case "WORKDIR":
		return b.guest([]string{"mkdir", "-p", "--", st.Mkdir}, nil)
	case "COPY", "ADD":
		dir := st.Dest
		if !strings.HasSuffix(dir, "/") && !(len(items) > 0 && items[0].dst != st.Dest) {
			dir = path.Dir(st.Dest)
		}
		pr, pw := io.Pipe()
		go func() { pw.CloseWithError(bc.writeTar(pw, items, false)) }()
		err := b.guest([]string{"sh", "-c", `mkdir -p -- "$1" && exec tar -x -f - -C /`, "sh", dir}, pr)
		pr.Close()
		if err != nil {
			return err
		}
		for _, ch := range []struct{ tool, spec string }{{"chown", st.Chown}, {"chmod", st.Chmod}} {
			if ch.spec == "" {
				continue
			}
			var list strings.Builder
			for _, it := range items {
				list.WriteString(it.dst + "\n")
			}
			flag := "-h"
			if ch.tool == "chmod" {
				flag = "--"
			}
			script := `while IFS= read -r p; do ` + ch.tool + ` ` + flag + ` "$1" "$p" || exit 1; done`
			if ch.tool == "chmod" {
				script = `while IFS= read -r p; do [ -L "$p" ] || chmod "$1" "$p" || exit 1; done`
			}
			if err := b.guest([]string{"sh", "-c", script, "sh", ch.spec}, strings.NewReader(list.String())); err != nil {
				return fmt.Errorf("--%s=%s: %w", ch.tool, ch.spec, err)
			}
		}
	}
	return nil
}

// guest runs argv as root in the builder; a failure is its first line of stderr.
func (b *builder) guest(argv []string, stdin io.Reader) error {
	code, msg, err := guestRunAs(b.cmd.Context(), b.c, api.ExecRequest{Name: b.name, Argv: argv, User: "root", Dir: "/"}, stdin, io.Discard)
	if err == nil && code != 0 {
		err = fmt.Errorf("exit status %d: %s", code, msg)
	}
	return err
}
