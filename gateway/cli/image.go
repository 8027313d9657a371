package cli

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"strings"
	"text/tabwriter"

	"github.com/schollz/progressbar/v3"
	"github.com/spf13/cobra"
	"golang.org/x/term"

	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/stream"
)

func imageCommand() *cobra.Command {
	img := &cobra.Command{Use: "image", Short: "Build, pull, import, list, inspect and remove root images"}
	var force bool
	var db dockerBuild
	build := &cobra.Command{
		Use:   "build NAME | build -f DOCKERFILE [-t NAME[:TAG]] [CONTEXT]",
		Short: "Build a built-in root image (nexus-base, nexus-mini), or an image from a Dockerfile",
		Long: "Without -f, build a built-in root image. A build is tagged with its date (nexus-base:20260807) and\n" +
			"latest; one build of each image is kept.\n\n" +
			"With -f, build a Dockerfile over the CONTEXT directory (default .). The subset built: one stage of\n" +
			dockerfileHelp,
		Example: "  nexus image build nexus-mini\n  nexus image build nexus-base --force\n" +
			"  nexus image build -f Dockerfile -t myimg:1 .\n" +
			"  nexus image build -f Dockerfile --build-arg VERSION=2 --allow-host deb.debian.org -t tools:dev ./ctx",
		Args: cobra.RangeArgs(0, 1),
		RunE: func(cmd *cobra.Command, args []string) error {
			if db.file != "" {
				o := db
				o.context = "."
				if len(args) == 1 {
					o.context = args[0]
				}
				info, err := runDockerBuild(cmd, o)
				if err != nil {
					return err
				}
				return printImage(cmd, info)
			}
			if len(args) != 1 {
				return usageError{errors.New("image build: name a built-in image (nexus-base, nexus-mini, nexus-agent-base), or give -f DOCKERFILE")}
			}
			info, err := imageWithProgress(cmd, vmmapi.ImageRequest{Op: "build", Name: args[0], Force: force}, "building "+args[0])
			if err != nil {
				return err
			}
			if printedJSON(cmd, info) {
				return nil
			}
			fmt.Fprintf(cmd.OutOrStdout(), "%s: %d MiB, built %s\n", imageRef(info), info.SizeBytes>>20, info.Built.Local().Format("2006-01-02 15:04:05"))
			return nil
		},
	}
	build.Flags().BoolVar(&force, "force", false, "rebuild even if the image exists")
	bf := build.Flags()
	bf.StringVarP(&db.file, "file", "f", "", "build this Dockerfile (- reads it from stdin)")
	bf.StringVarP(&db.tag, "tag", "t", "", "name the image NAME[:TAG] (default: the context directory's name, tag latest)")
	bf.StringArrayVar(&db.buildArgs, "build-arg", nil, "set an ARG: NAME=VALUE, or NAME to take it from the environment (repeatable)")
	bf.StringArrayVar(&db.allowHosts, "allow-host", nil, "let the builder sandbox reach only HOST[:PORT] (repeatable; without any, RUN has allow-all egress for the build)")
	bf.Int64Var(&db.maxContext, "max-context", 0, "refuse a build context larger than this many bytes (default 1 GiB)")
	bf.IntVar(&db.memoryMiB, "memory", 0, "memory of the builder sandbox in MiB (default: a sandbox's)")
	bf.BoolVar(&db.noCache, "no-cache", false, "build every step again, even if an earlier build made the same")

	var pr vmmapi.ImageRequest
	var passwordStdin bool
	pull := &cobra.Command{
		Use:   "pull REF",
		Short: "Pull an image from an OCI or Docker registry",
		Long: "Pull an image by tag or digest (a multi-arch index gives its linux/amd64 image) and convert it\n" +
			"into a root image. Credentials come from ~/.docker/config.json (and its credential helpers)\n" +
			"unless --username is given. Layers are cached by digest; pulling a digest already here is\n" +
			"instant. A re-pulled tag that moved leaves the old digest for the sandboxes that use it.",
		Example: "  nexus image pull ghcr.io/org/img:1.2\n  nexus image pull docker.io/library/alpine@sha256:…\n" +
			"  echo $TOKEN | nexus image pull --username me --password-stdin ghcr.io/org/private:1\n" +
			"  nexus image pull --insecure 127.0.0.1:5000/dev/img:latest",
		Args: cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := pr
			r.Op, r.Name = "pull", args[0]
			if passwordStdin {
				if r.Username == "" {
					return usageError{errors.New("--password-stdin needs --username")}
				}
				b, err := io.ReadAll(io.LimitReader(cmd.InOrStdin(), 64<<10))
				if err != nil {
					return err
				}
				r.Password = strings.TrimRight(string(b), "\r\n")
			}
			info, err := imageWithProgress(cmd, r, "pulling "+args[0])
			if err != nil {
				return err
			}
			return printImage(cmd, info)
		},
	}
	pull.Flags().StringVar(&pr.Username, "username", "", "registry user name (with --password-stdin)")
	pull.Flags().BoolVar(&passwordStdin, "password-stdin", false, "read the registry password or token from stdin")
	pull.Flags().BoolVar(&pr.Insecure, "insecure", false, "talk plain HTTP to the registry (a local registry)")
	imageLimitFlags(pull, &pr)

	var ir vmmapi.ImageRequest
	imp := &cobra.Command{
		Use:   "import FILE|- [NAME[:TAG]]",
		Short: "Import a docker save tarball, an OCI layout directory or an OCI archive",
		Long: "Import an image from a file (- reads it from stdin). Without NAME, the archive's own name is\n" +
			"used (docker save's tag). The tag defaults to latest.",
		Example: "  docker save myimg:1 | nexus image import -\n  nexus image import ./layout myimg:dev",
		Args:    cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			r := ir
			r.Op = "import"
			if len(args) == 2 {
				r.Name = args[1]
			}
			file := args[0]
			if file == "-" { // streamed to the vmm, wherever it runs
				c, _, err := dial(cmd)
				if err != nil {
					return err
				}
				r.SID = stream.NewID()
				sess, err := stream.Client(c.Conn(), r.SID)
				if err != nil {
					return err
				}
				defer sess.Close()
				go sendArchive(sess, cmd.InOrStdin())
				info, err := imageWithProgress(cmd, r, "importing stdin")
				if err != nil {
					return err
				}
				return printImage(cmd, info)
			}
			abs, err := filepath.Abs(file)
			if err != nil {
				return err
			}
			if _, err := os.Stat(abs); err != nil {
				return errdefs.Invalid("image import: %v", err)
			}
			r.File = abs
			info, err := imageWithProgress(cmd, r, "importing "+filepath.Base(args[0]))
			if err != nil {
				return err
			}
			return printImage(cmd, info)
		},
	}
	imageLimitFlags(imp, &ir)

	ls := &cobra.Command{
		Use:     "ls",
		Short:   "List images: name, tag, digest, size, created, source, booted templates (memory/vCPUs)",
		Example: "  nexus image ls\n  nexus image ls --json",
		Args:    cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			list, err := c.Images(cmd.Context())
			if err != nil {
				return err
			}
			if printedJSON(cmd, list) {
				return nil
			}
			tw := tabwriter.NewWriter(cmd.OutOrStdout(), 0, 4, 2, ' ', 0)
			fmt.Fprintln(tw, "NAME\tTAG\tDIGEST\tSIZE\tCREATED\tSOURCE\tTEMPLATES")
			for _, i := range list {
				tags := i.Tags
				if len(tags) == 0 {
					tags = []string{"<none>"}
				}
				digest := "-"
				if i.Digest != "" {
					digest = shortImageDigest(i.Digest)
				}
				created := "-"
				if !i.Created.IsZero() {
					created = age(i.Created) + " ago"
				}
				warm := []string{}
				for _, t := range i.Templates {
					if !t.Stale {
						warm = append(warm, templateShape(t))
					}
				}
				if len(warm) == 0 {
					warm = append(warm, "-")
				}
				for _, t := range tags {
					fmt.Fprintf(tw, "%s\t%s\t%s\t%dMiB\t%s\t%s\t%s\n", i.Name, t, digest, i.SizeBytes>>20, created, i.Source, strings.Join(warm, ","))
				}
			}
			return tw.Flush()
		},
	}
	inspect := &cobra.Command{
		Use:     "inspect NAME[:TAG|@DIGEST]",
		Short:   "Show an image's record: digest, config (env, workdir, user, entrypoint, cmd), labels, users",
		Example: "  nexus image inspect nexus-base\n  nexus image inspect ghcr.io/org/img:1.2",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			info, err := imageOp(cmd.Context(), c, vmmapi.ImageRequest{Op: "inspect", Name: args[0]})
			if err != nil {
				return err
			}
			printJSON(cmd.OutOrStdout(), info) // like docker inspect: JSON either way
			return nil
		},
	}
	rm := &cobra.Command{
		Use:   "rm NAME[:TAG|@DIGEST]",
		Short: "Remove an image (NAME:TAG of an image with other tags removes only the tag)",
		Long: "Remove an image. It is refused while a sandbox's disk or a snapshot is based on it.\n" +
			"NAME:TAG of an image that has other tags takes only that tag away.",
		Example: "  nexus image rm nexus-agent-base\n  nexus image rm ghcr.io/org/img@sha256:…",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			c, _, err := dial(cmd)
			if err != nil {
				return err
			}
			if _, err := imageOp(cmd.Context(), c, vmmapi.ImageRequest{Op: "rm", Name: args[0]}); err != nil {
				return err
			}
			done(cmd, args[0], "removed", "%s removed\n", args[0])
			return nil
		},
	}
	var shape vmmapi.TemplateShape
	var noNet bool
	warm := &cobra.Command{
		Use:   "warm NAME[:TAG|@DIGEST]",
		Short: "Boot a template of an image and save it, so that creates of that image and size restore it",
		Long: "Boot a sandbox VM of the image to \"agent ready\" and save it as a template under $NEXUS_HOME/templates.\n" +
			"nexus create restores the template of its image, memory, vCPUs and disk size instead of booting\n" +
			"(--cold boots anyway); the first create of a shape builds its template in the background, so\n" +
			"this only saves that one cold boot. A template holds no secret, placeholder, CA or mount: a\n" +
			"restored sandbox gets its own hostname, machine-id, reseeded RNG, clock, env, CA and mounts.",
		Example: "  nexus image warm nexus-base\n  nexus image warm nexus-mini --memory 512",
		Args:    cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			sh := shape
			sh.Net = !noNet
			info, err := imageWithProgress(cmd, vmmapi.ImageRequest{Op: "warm", Name: args[0], Warm: &sh}, "warming "+args[0])
			if err != nil {
				return err
			}
			if printedJSON(cmd, info) {
				return nil
			}
			for _, t := range info.Templates {
				fmt.Fprintf(cmd.OutOrStdout(), "%s: template %s (%s), %dMiB of RAM data\n", args[0], t.Key[:12], templateShape(t), t.RAMDataBytes>>20)
			}
			return nil
		},
	}
	warm.Flags().IntVar(&shape.MemoryMiB, "memory", 0, "memory in MiB of the sandboxes it serves (default 1024)")
	warm.Flags().IntVar(&shape.VCPUs, "vcpus", 0, "virtual CPUs of the sandboxes it serves (default 1)")
	warm.Flags().IntVar(&shape.DiskMiB, "disk", 0, "root disk size in MiB of the sandboxes it serves (default: the image's)")
	warm.Flags().BoolVar(&noNet, "egress-none", false, "for sandboxes created with --egress none (no network device)")
	img.AddCommand(build, pull, imp, saveCommand(), ls, inspect, rm, warm)
	return img
}

func imageLimitFlags(cmd *cobra.Command, r *vmmapi.ImageRequest) {
	cmd.Flags().Int64Var(&r.MaxBytes, "max-size", 0, "refuse an image that unpacks to more bytes than this (default 16 GiB)")
	cmd.Flags().Int64Var(&r.MaxInodes, "max-inodes", 0, "refuse an image with more files than this (default 1048576)")
}

// templateShape names a template by what it serves: 1024M/1cpu, with /net-none, /disk=… and
// /shares=N where they are not the default.
func templateShape(t vmmapi.TemplateInfo) string {
	s := fmt.Sprintf("%dM/%dcpu", t.MemoryMiB, t.VCPUs)
	if t.DiskMiB > 0 {
		s += fmt.Sprintf("/disk=%dM", t.DiskMiB)
	}
	if !t.Net {
		s += "/net-none"
	}
	if t.Shares > 0 {
		s += fmt.Sprintf("/shares=%d", t.Shares)
	}
	return s
}

func shortImageDigest(d string) string {
	if alg, hx, ok := strings.Cut(d, ":"); ok && len(hx) > 12 {
		return alg + ":" + hx[:12]
	}
	return d
}

func imageRef(i vmmapi.ImageInfo) string {
	if len(i.Tags) > 0 {
		return i.Name + ":" + i.Tags[0]
	}
	return i.Name + "@" + i.Digest
}

func printImage(cmd *cobra.Command, info vmmapi.ImageInfo) error {
	if printedJSON(cmd, info) {
		return nil
	}
	fmt.Fprintf(cmd.OutOrStdout(), "%s: %s, %d MiB\n", imageRef(info), info.Digest, info.SizeBytes>>20)
	return nil
}

// imageWithProgress runs an image operation, showing its progress: a bar on a terminal, a line
// per step and per layer otherwise, and under --json one ImageProgress object per line on
// stderr.
func imageWithProgress(cmd *cobra.Command, req vmmapi.ImageRequest, what string) (vmmapi.ImageInfo, error) {
	c, _, err := dial(cmd)
	if err != nil {
		return vmmapi.ImageInfo{}, err
	}
	var bar *progressbar.ProgressBar
	interactive := false
	if f, ok := cmd.ErrOrStderr().(*os.File); ok && term.IsTerminal(int(f.Fd())) && !jsonOutput(cmd) {
		interactive = true
		bar = progressbar.NewOptions(1000, progressbar.OptionSetWriter(f), progressbar.OptionSetWidth(30),
			progressbar.OptionSetDescription(what), progressbar.OptionClearOnFinish(), progressbar.OptionShowElapsedTimeOnFinish())
	}
	lastStage, lastTenth := "", -1
	lastLayer := map[string]int{}
	progress := stream.NewID()
	sub, err := stream.Follow(c.Conn(), "", progress, func(data []byte) {
		var p vmmapi.ImageProgress
		if json.Unmarshal(data, &p) != nil {
			return
		}
		if jsonOutput(cmd) {
			b, _ := json.Marshal(p)
			fmt.Fprintf(cmd.ErrOrStderr(), "%s\n", b)
			return
		}
		if p.Layer != "" {
			pct := 100
			if p.Total > 0 {
				pct = int(p.Done * 100 / p.Total)
			}
			if interactive {
				bar.Describe(fmt.Sprintf("%-28s", fmt.Sprintf("%s %d%%", p.Step, pct)))
				return
			}
			if q, seen := lastLayer[p.Layer]; !seen || pct/25 != q/25 {
				lastLayer[p.Layer] = pct
				fmt.Fprintf(cmd.ErrOrStderr(), "  %s: %d/%d MiB\n", p.Step, p.Done>>20, p.Total>>20)
			}
			return
		}
		if interactive {
			bar.Describe(fmt.Sprintf("%-28s", p.Step))
			bar.Set(int(p.Fraction * 1000))
			return
		}
		// Not a terminal (CI, logs): one line per stage and per tenth of the way.
		stage, _, _ := strings.Cut(p.Step, ":")
		if tenth := int(p.Fraction * 10); stage != lastStage || tenth != lastTenth {
			lastStage, lastTenth = stage, tenth
			fmt.Fprintf(cmd.ErrOrStderr(), "  %3.0f%%  %s\n", p.Fraction*100, p.Step)
		}
	})
	if err == nil {
		defer sub.Unsubscribe()
		req.Progress = progress
	}
	ctx, cancel := context.WithTimeout(cmd.Context(), api.ImageTimeout)
	defer cancel()
	info, err := imageOp(ctx, c, req)
	if bar != nil {
		bar.Finish()
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return info, fmt.Errorf("%s: gave up after %v", what, api.ImageTimeout)
	}
	return info, err
}

func imageOp(ctx context.Context, c *api.Client, r vmmapi.ImageRequest) (vmmapi.ImageInfo, error) {
	return c.Image(ctx, r)
}

const dockerfileHelp = `FROM (a built-in, local or registry image), RUN, COPY and ADD
(files of the context; ADD neither fetches URLs nor unpacks archives), ENV, ARG, WORKDIR, USER,
ENTRYPOINT, CMD, LABEL and EXPOSE. Any other instruction is refused with its line number.

Every RUN runs in one builder sandbox booted from the FROM image, with allow-all egress for the
build (the builder VMs' bounded allow-all window: audited, private addresses still refused, no
MITM and no credentials), or, with --allow-host, default-deny egress reaching only the hosts it
names (the perimeter of any sandbox); COPY sends the
context's files into it. The builder's disk is then made the new image, recorded with a digest,
its config (Env, WorkingDir, User, Entrypoint, Cmd, Labels) and the tag. The builder is removed
whatever happens, and a failed build records nothing.

A build is cached by its steps: each step's key hashes the one before, the instruction and the
contents of what it copies, so an unchanged Dockerfile builds instantly and one that adds steps
after an earlier build starts from it. The context is untrusted input: .dockerignore is honoured,
symbolic links are copied as links and never followed out of it, and its size is bounded
(--max-context). Progress is a line per step on stderr (JSON lines under --json).`

func saveCommand() *cobra.Command {
	var output string
	cmd := &cobra.Command{
		Use:   "save NAME[:TAG] -o FILE|- | save SANDBOX NAME[:TAG]",
		Short: "Write an image as a docker save tarball, or make a sandbox's disk an image",
		Long: "With -o, write the image as a docker save tarball (one layer: its root with owners and modes,\n" +
			"and its config) to FILE, or to stdout with -o -. nexus image import and docker load read it.\n\n" +
			"With SANDBOX and NAME, the sandbox's disk becomes the image NAME:TAG (its base's config).\n" +
			"A running sandbox keeps running: its writes are flushed and it is paused while the disk is\n" +
			"copied.",
		Example: "  nexus image save myimg:1 -o myimg.tar\n  nexus image save myimg:1 -o - | docker load\n" +
			"  nexus image save demo/t1 demo-t1:snapshot",
		Args: cobra.RangeArgs(1, 2),
		RunE: func(cmd *cobra.Command, args []string) error {
			if output == "" {
				if len(args) != 2 {
					return usageError{errors.New("image save: give -o FILE to write an image, or SANDBOX NAME[:TAG] to make a sandbox's disk an image")}
				}
				c, _, err := dial(cmd)
				if err != nil {
					return err
				}
				var base *vmmapi.ImageConfig
				if sb, err := c.Get(cmd.Context(), args[0]); err == nil {
					if bi, err := c.Image(cmd.Context(), vmmapi.ImageRequest{Op: "inspect", Name: sb.Image}); err == nil {
						base = bi.ImageConfig()
					}
				}
				info, err := imageWithProgress(cmd, vmmapi.ImageRequest{Op: "commit", Sandbox: args[0], Name: args[1], Config: base,
					Source: "save " + args[0]}, "saving "+args[0])
				if err != nil {
					return err
				}
				return printImage(cmd, info)
			}
			if len(args) != 1 {
				return usageError{errors.New("image save -o: name one image")}
			}
			file := output
			if output == "-" {
				dir, err := os.MkdirTemp("", "nexus-save-")
				if err != nil {
					return err
				}
				defer os.RemoveAll(dir)
				file = filepath.Join(dir, "image.tar")
			} else if abs, err := filepath.Abs(output); err == nil {
				file = abs
			}
			info, err := imageWithProgress(cmd, vmmapi.ImageRequest{Op: "save", Name: args[0], File: file}, "saving "+args[0])
			if err != nil {
				return err
			}
			if output == "-" {
				f, err := os.Open(file)
				if err != nil {
					return err
				}
				defer f.Close()
				_, err = io.Copy(cmd.OutOrStdout(), f)
				return err
			}
			done(cmd, imageRef(info), "saved", "%s saved to %s\n", imageRef(info), output)
			return nil
		},
	}
	cmd.Flags().StringVarP(&output, "output", "o", "", "write the image to FILE (- for stdout) as a docker save tarball")
	return cmd
}

// sendArchive streams r on sess once the vmm says it is ready, then closes its stdin.
func sendArchive(sess *stream.Session, r io.Reader) {
	if m, err := sess.Recv(); err != nil || m.Kind != stream.KindStdout {
		return
	}
	buf := make([]byte, stream.MaxChunk)
	for {
		n, err := r.Read(buf)
		if n > 0 && sess.Write(stream.KindStdin, buf[:n]) != nil {
			return
		}
		if errors.Is(err, io.EOF) {
			sess.Send(stream.KindStdinClose, nil)
			return
		}
		if err != nil { // the vmm sees the stream end early: no truncated archive is imported
			sess.Close()
			return
		}
	}
}
