package image_test

import (
	"archive/tar"
	"context"
	"fmt"
	"math/rand"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/google/go-containerregistry/pkg/name"
	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/remote"

	"github.com/IniZio/nexus/internal/ocitest"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/image"
)

// BenchmarkPullConvert: nexus image pull of a ~100 MB image (4 layers of 500 files, half
// compressible) from a loopback registry into an ext4 root, against doing it by hand: export the
// flattened root as crane export does (mutate.Extract), untar it into a directory, mkfs.ext4 -d.
func BenchmarkPullConvert(b *testing.B) {
	for _, tool := range []string{"mkfs.ext4", "debugfs", "tar"} {
		if _, err := exec.LookPath(tool); err != nil {
			b.Skipf("%s not installed", tool)
		}
	}
	rnd := rand.New(rand.NewSource(1))
	var layers []v1.Layer
	for l := 0; l < 4; l++ {
		var files []ocitest.File
		for f := 0; f < 500; f++ {
			body := make([]byte, 50<<10)
			if f%2 == 0 {
				rnd.Read(body)
			}
			files = append(files, ocitest.File{Name: fmt.Sprintf("data/l%d/f%03d", l, f), Body: string(body), UID: f % 3})
		}
		files = append(files, ocitest.File{Name: fmt.Sprintf("data/l%d/link", l), Type: tar.TypeSymlink, Link: "f000"})
		layers = append(layers, ocitest.Layer(b, ocitest.Tar(b, files...)))
	}
	img := ocitest.Image(b, "amd64", v1.Config{}, layers...)
	reg := ocitest.NewRegistry(b)
	reg.Push(b, "bench/img:1", img)
	ref := reg.Host + "/bench/img:1"
	ctx := context.Background()

	var nexus, byHand time.Duration
	for i := 0; i < b.N; i++ {
		dir := b.TempDir()
		h := home.Dir(filepath.Join(dir, "home"))
		start := time.Now()
		if _, err := image.Pull(ctx, h, filepath.Join(dir, "cache"), ref, image.PullOptions{Insecure: true}, nil); err != nil {
			b.Fatal(err)
		}
		nexus += time.Since(start)

		start = time.Now()
		gref, _ := name.ParseReference(ref, name.Insecure)
		rimg, err := remote.Image(gref)
		if err != nil {
			b.Fatal(err)
		}
		export := filepath.Join(dir, "export.tar")
		f, _ := os.Create(export)
		rc := mutate.Extract(rimg)
		if _, err := f.ReadFrom(rc); err != nil {
			b.Fatal(err)
		}
		rc.Close()
		f.Close()
		root := filepath.Join(dir, "root")
		os.Mkdir(root, 0o755)
		if out, err := exec.Command("tar", "-xf", export, "-C", root).CombinedOutput(); err != nil {
			b.Fatalf("tar: %v: %s", err, out)
		}
		ext4 := filepath.Join(dir, "hand.ext4")
		exec.Command("truncate", "-s", "1G", ext4).Run()
		if out, err := exec.Command("mkfs.ext4", "-q", "-F", "-d", root, ext4).CombinedOutput(); err != nil {
			b.Fatalf("mkfs: %v: %s", err, out)
		}
		byHand += time.Since(start)
		os.RemoveAll(dir)
	}
	b.ReportMetric(float64(nexus.Milliseconds())/float64(b.N), "ms/pull")
	b.ReportMetric(float64(byHand.Milliseconds())/float64(b.N), "ms/by-hand")
	b.ReportMetric(nexus.Seconds()/byHand.Seconds(), "pull/by-hand")
	b.ReportMetric(0, "ns/op")
}
