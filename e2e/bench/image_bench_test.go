package bench

import (
	"archive/tar"
	"context"
	"encoding/json"
	"fmt"
	"os"
	osexec "os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"

	"github.com/IniZio/nexus/internal/ocitest"
	api "github.com/IniZio/nexus/pkg/api/gateway"
	vmmapi "github.com/IniZio/nexus/pkg/api/vmm"
)

// pulledImage pushes an image of busybox (taken out of nexus-mini, so the two guests run the
// same userland) to a loopback registry and pulls it, returning its reference.
func pulledImage(b *testing.B) string {
	b.Helper()
	out, err := stack.Command("image", "build", "nexus-mini", "--json").Output()
	if err != nil {
		b.Fatal(err)
	}
	var mini vmmapi.ImageInfo
	if err := json.Unmarshal(out, &mini); err != nil {
		b.Fatal(err)
	}
	bb := filepath.Join(b.TempDir(), "busybox")
	if o, err := osexec.Command("debugfs", "-R", "dump /bin/busybox "+bb, mini.Path).CombinedOutput(); err != nil {
		b.Fatalf("debugfs: %v: %s", err, o)
	}
	body, err := os.ReadFile(bb)
	if err != nil {
		b.Fatal(err)
	}
	files := []ocitest.File{{Name: "bin/", Type: tar.TypeDir}, {Name: "bin/busybox", Body: string(body), Mode: 0o755},
		{Name: "etc/", Type: tar.TypeDir}, {Name: "etc/passwd", Body: "root:x:0:0:root:/root:/bin/sh\n"}, {Name: "tmp/", Type: tar.TypeDir, Mode: 0o1777}}
	for _, a := range []string{"sh", "true", "cat"} {
		files = append(files, ocitest.File{Name: "bin/" + a, Type: tar.TypeSymlink, Link: "busybox"})
	}
	img := ocitest.Image(b, "amd64", v1.Config{Env: []string{"PATH=/bin"}}, ocitest.Layer(b, ocitest.Tar(b, files...)))
	reg := ocitest.NewRegistry(b)
	reg.Push(b, "bench/pulled:1", img)
	ref := reg.Host + "/bench/pulled:1"
	if o, err := stack.Command("image", "pull", "--insecure", ref).CombinedOutput(); err != nil {
		b.Fatalf("pull: %v: %s", err, o)
	}
	return ref
}

// createToFirstExec times a cold create (--cold: no template) → first exec result of `true` on
// image, b.N times (each sandbox removed off the clock), and returns the mean.
func createToFirstExec(b *testing.B, prefix, image string) time.Duration {
	i := 0
	var total time.Duration
	for b.Loop() {
		name := fmt.Sprintf("bench/%s-%d", prefix, i)
		i++
		t0 := time.Now()
		ctx, cancel := context.WithTimeout(context.Background(), 3*time.Minute)
		if _, err := client.Create(ctx, api.CreateRequest{Name: name, Image: image, MemoryMiB: 256, Cold: true, Labels: map[string]string{"nexus-test": "1"}}); err != nil {
			b.Fatal(err)
		}
		if err := exec(ctx, name, "true"); err != nil {
			b.Fatal(err)
		}
		total += time.Since(t0)
		cancel()
		b.StopTimer()
		remove(name)
		b.StartTimer()
	}
	return total / time.Duration(b.N)
}

// BenchmarkCreateFirstExecImage is create → first exec result on an image pulled from a
// registry against the built-in nexus-mini (same userland and memory: goal no slower) and
// against nexus-base (the Debian image a pulled image replaces), cold creates all.
func BenchmarkCreateFirstExecImage(b *testing.B) {
	ref := pulledImage(b)
	builtin := map[string]time.Duration{}
	for _, name := range []string{"nexus-mini", "nexus-base"} {
		b.Run(name, func(b *testing.B) {
			if name == "nexus-base" {
				if o, err := stack.Command("image", "build", name).CombinedOutput(); err != nil {
					b.Fatalf("image build %s: %v: %s", name, err, o)
				}
			}
			builtin[name] = createToFirstExec(b, "img-"+strings.TrimPrefix(name, "nexus-"), name)
			b.ReportMetric(float64(builtin[name].Milliseconds()), "ms/create")
		})
	}
	b.Run("pulled", func(b *testing.B) {
		avg := createToFirstExec(b, "img-pulled", ref)
		b.ReportMetric(float64(avg.Milliseconds()), "ms/create")
		if d := builtin["nexus-mini"]; d > 0 {
			b.ReportMetric(float64(avg)/float64(d), "x-mini")
		}
		if d := builtin["nexus-base"]; d > 0 {
			b.ReportMetric(float64(avg)/float64(d), "x-base")
		}
	})
}
