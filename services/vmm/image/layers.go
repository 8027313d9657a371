package image

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"syscall"
	"time"

	"github.com/IniZio/nexus/pkg/atomicfile"
	"github.com/IniZio/nexus/pkg/errdefs"
	"github.com/IniZio/nexus/pkg/home"
	"github.com/IniZio/nexus/services/vmm/internal/fsutil"
)

// The build cache (Dockerfile builds, issue 23). Every step of a build that changes the root (RUN,
// COPY, ADD, WORKDIR) leaves a layer: the builder sandbox's qcow2 disk overlay as the step left
// it, kept in $NEXUS_HOME/images/layers/<key>.qcow2 beside <key>.json. Its key is "layer-" and
// the step's cache key, a hash of the step before, the instruction after ARG and ENV expansion
// and the digest of what it copies. Its backing file is the image or layer the builder started
// from, so a rebuild that changes only a late step starts a builder on the layer of the step
// before and runs only what changed.
//
// A layer is written to a temporary file and renamed into place, then its record is written: a
// crash leaves no layer (an orphan file is pruned), and a failed step leaves none at all. A
// chain is at most MaxLayerDepth layers deep (a deeper layer is saved flattened); a layer whose
// base image was removed or rebuilt is dropped when it is next looked at. The cache keeps at
// most DefaultBuildCacheBytes, dropping the least recently used layers that no other layer and
// no sandbox depends on. Images a build makes never depend on layers: the result is flattened
// into a raw ext4 image, so pruning the cache never breaks an image.

// DefaultBuildCacheBytes bounds the build cache's layers (their allocated bytes).
const DefaultBuildCacheBytes = 10 << 30

// MaxLayerDepth is the most layers a layer's backing chain holds, itself included.
const MaxLayerDepth = 8

const layerPrefix = "layer-"

// LayerKey is the key of the build cache layer of the step with cache key step (hex).
func LayerKey(step string) string { return layerPrefix + step }

// IsLayerKey reports whether s is a build cache layer's key.
func IsLayerKey(s string) bool {
	hx, ok := strings.CutPrefix(s, layerPrefix)
	return ok && validDigest("sha256:"+hx)
}

// layerRecord is a layer's <key>.json.
type layerRecord struct {
	Key string `json:"key"`
	// Parent is the key of the image or layer the layer's backing file is ("" when the layer
	// was flattened); Stamp identifies the parent image's content (its digest, or a built-in
	// image's build time), so a rebuilt base is never read under an old layer.
	Parent  string    `json:"parent,omitempty"`
	Stamp   string    `json:"stamp,omitempty"`
	Depth   int       `json:"depth"` // layers in the chain, itself included
	Created time.Time `json:"created"`
}

func layerDir(h home.Dir) string              { return filepath.Join(h.Images(), "layers") }
func layerFile(h home.Dir, key string) string { return filepath.Join(layerDir(h), key+".qcow2") }
func layerRecordFile(h home.Dir, key string) string {
	return filepath.Join(layerDir(h), key+".json")
}

func imageStamp(i *Info) string {
	if i.Digest != "" {
		return i.Digest
	}
	return i.Built.UTC().Format(time.RFC3339Nano)
}

func readLayer(h home.Dir, key string) (layerRecord, error) {
	var rec layerRecord
	b, err := os.ReadFile(layerRecordFile(h, key))
	if errors.Is(err, os.ErrNotExist) {
		return rec, errdefs.NotFound("build cache layer %s is not here", key)
	}
	if err != nil {
		return rec, err
	}
	if err := json.Unmarshal(b, &rec); err != nil || rec.Key != key {
		return rec, errdefs.NotFound("build cache layer %s: its record does not parse", key)
	}
	return rec, nil
}

// getLayer returns a layer whose whole chain is here and unchanged, and marks it used. A layer
// whose chain is broken is removed.
func getLayer(h home.Dir, key string) (*Info, error) {
	rec, err := checkLayer(h, key, 0)
	if err != nil {
		if !errors.Is(err, errdefs.ErrNotFound) || !strings.Contains(err.Error(), "is not here") {
			removeLayer(h, key)
		}
		return nil, err
	}
	now := time.Now()
	os.Chtimes(layerRecordFile(h, key), now, now) // the LRU's clock
	info := &Info{Name: "build cache", Key: key, Source: "build cache", Built: rec.Created, Created: rec.Created,
		Path: layerFile(h, key), Format: "qcow2"}
	if st, err := os.Stat(info.Path); err == nil {
		info.Size = st.Size()
		if sys, ok := st.Sys().(*syscall.Stat_t); ok {
			info.DiskUsage = sys.Blocks * 512
		}
	}
	return info, nil
}

func checkLayer(h home.Dir, key string, depth int) (layerRecord, error) {
	if depth > MaxLayerDepth {
		return layerRecord{}, errdefs.NotFound("build cache layer %s: its chain is too deep", key)
	}
	rec, err := readLayer(h, key)
	if err != nil {
		return rec, err
	}
	if _, err := os.Stat(layerFile(h, key)); err != nil {
		return rec, errdefs.NotFound("build cache layer %s is not here", key)
	}
	switch {
	case rec.Parent == "":
	case IsLayerKey(rec.Parent):
		if _, err := checkLayer(h, rec.Parent, depth+1); err != nil {
			return rec, errdefs.NotFound("build cache layer %s: the layer under it is gone", key)
		}
	default:
		base, err := Resolve(h, rec.Parent)
		if err != nil || imageStamp(base) != rec.Stamp {
			return rec, errdefs.NotFound("build cache layer %s: the image under it was removed or rebuilt", key)
		}
	}
	return rec, nil
}

// LayerChain is the keys a sandbox disk backed by key depends on: key, and for a layer the
// layers and the image under it.
func LayerChain(h home.Dir, key string) []string {
	out := []string{key}
	for range MaxLayerDepth + 1 {
		if !IsLayerKey(key) {
			break
		}
		rec, err := readLayer(h, key)
		if err != nil || rec.Parent == "" {
			break
		}
		key = rec.Parent
		out = append(out, key)
	}
	return out
}

// SaveLayer records disk, a builder sandbox's qcow2 overlay over the image or layer parent, as
// the layer key. The caller makes the disk consistent (the VM stopped, or flushed and paused).
// Then it prunes the cache to maxBytes (0: DefaultBuildCacheBytes), keeping what inUse says a
// sandbox depends on.
func SaveLayer(ctx context.Context, h home.Dir, key, disk, parent string, maxBytes int64, inUse func(key string) bool) (*Info, error) {
	if !IsLayerKey(key) {
		return nil, errdefs.Invalid("build cache: bad layer key %q", key)
	}
	rec := layerRecord{Key: key, Parent: parent, Depth: 1, Created: time.Now().UTC()}
	under, err := Resolve(h, parent)
	if err != nil {
		return nil, err
	}
	if IsLayerKey(parent) {
		p, err := checkLayer(h, parent, 0)
		if err != nil {
			return nil, err
		}
		rec.Depth = p.Depth + 1
	} else {
		rec.Stamp = imageStamp(under)
	}
	if b, err := backingFile(ctx, disk); err != nil || b != under.Path {
		// Not an overlay on the parent itself (a disk cloned from a template, say): the layer
		// must not depend on what is under it.
		rec.Depth = MaxLayerDepth + 1
	}
	if err := os.MkdirAll(layerDir(h), 0o755); err != nil {
		return nil, err
	}
	tmp := filepath.Join(layerDir(h), fmt.Sprintf(".tmp-%s-%d.qcow2", key, time.Now().UnixNano()))
	defer os.Remove(tmp)
	if rec.Depth > MaxLayerDepth {
		// Too deep for QEMU's jail (it binds each backing file): this layer stands alone.
		if err := run(ctx, "", "qemu-img", "convert", "-U", "-q", "-f", "qcow2", "-O", "qcow2", disk, tmp); err != nil {
			return nil, fmt.Errorf("build cache: flattening the layer: %w", err)
		}
		rec.Parent, rec.Stamp, rec.Depth = "", "", 1
	} else if _, err := fsutil.CopySparse(disk, tmp); err != nil {
		return nil, fmt.Errorf("build cache: copying the builder's disk: %w", err)
	}
	if err := os.Chmod(tmp, 0o444); err != nil { // QEMU opens a backing file as another uid
		return nil, err
	}
	unlock, err := lock(ctx, h, "layers")
	if err != nil {
		return nil, err
	}
	// The file first, then the record: a layer without its record is no layer (and pruned).
	err = os.Rename(tmp, layerFile(h, key))
	if err == nil {
		b, _ := json.MarshalIndent(rec, "", "  ")
		err = atomicfile.WriteFile(layerRecordFile(h, key), b, 0o644)
	}
	fsutil.SyncDir(layerDir(h))
	unlock()
	if err != nil {
		removeLayer(h, key)
		return nil, fmt.Errorf("build cache: %w", err)
	}
	PruneLayers(h, maxBytes, func(k string) bool { return k == key || inUse(k) })
	return getLayer(h, key)
}

// backingFile is the backing file a qcow2 image's header names.
func backingFile(ctx context.Context, img string) (string, error) {
	out, err := runOut(ctx, "", "qemu-img", "info", "-U", "--output=json", img)
	if err != nil {
		return "", err
	}
	var info struct {
		Backing string `json:"full-backing-filename"`
	}
	if err := json.Unmarshal(out, &info); err != nil {
		return "", err
	}
	return info.Backing, nil
}

func removeLayer(h home.Dir, key string) {
	os.Remove(layerRecordFile(h, key)) // the record first: a file without one is no layer
	os.Remove(layerFile(h, key))
}

// PruneLayers drops broken layers, leftovers of interrupted saves, and then the least recently
// used layers no other layer and no sandbox (inUse) depends on until the cache holds at most
// maxBytes (0: DefaultBuildCacheBytes; a negative value empties it of all it may drop). It
// returns the keys it removed.
func PruneLayers(h home.Dir, maxBytes int64, inUse func(key string) bool) []string {
	if maxBytes == 0 {
		maxBytes = DefaultBuildCacheBytes
	}
	unlock, err := lock(context.Background(), h, "layers")
	if err != nil {
		return nil
	}
	defer unlock()
	ents, _ := os.ReadDir(layerDir(h))
	type layer struct {
		key    string
		parent string
		used   time.Time
		bytes  int64
	}
	var layers []*layer
	var removed []string
	hour := time.Now().Add(-time.Hour)
	for _, e := range ents {
		name := e.Name()
		fi, err := e.Info()
		if err != nil {
			continue
		}
		if strings.HasPrefix(name, ".tmp-") {
			if fi.ModTime().Before(hour) { // a save that died
				os.Remove(filepath.Join(layerDir(h), name))
			}
			continue
		}
		key, ok := strings.CutSuffix(name, ".qcow2")
		if !ok || !IsLayerKey(key) {
			continue
		}
		rec, err := checkLayer(h, key, 0)
		if err != nil {
			if _, rerr := os.Stat(layerRecordFile(h, key)); rerr == nil || fi.ModTime().Before(hour) {
				removeLayer(h, key)
				removed = append(removed, key)
			}
			continue
		}
		l := &layer{key: key, parent: rec.Parent, used: fi.ModTime()}
		if rf, err := os.Stat(layerRecordFile(h, key)); err == nil {
			l.used = rf.ModTime()
		}
		if sys, ok := fi.Sys().(*syscall.Stat_t); ok {
			l.bytes = sys.Blocks * 512
		}
		layers = append(layers, l)
	}
	var total int64
	for _, l := range layers {
		total += l.bytes
	}
	sort.Slice(layers, func(i, j int) bool { return layers[i].used.Before(layers[j].used) })
	for total > maxBytes || maxBytes < 0 {
		parents := map[string]bool{}
		for _, l := range layers {
			parents[l.parent] = true
		}
		i := -1
		for j, l := range layers {
			if !parents[l.key] && !inUse(l.key) {
				i = j
				break
			}
		}
		if i < 0 {
			break
		}
		l := layers[i]
		removeLayer(h, l.key)
		removed = append(removed, l.key)
		total -= l.bytes
		layers = append(layers[:i], layers[i+1:]...)
	}
	return removed
}

// Flatten writes the whole root of a layer (its chain read through) as a raw image to raw.
func Flatten(ctx context.Context, layer *Info, raw string) error {
	if err := run(ctx, "", "qemu-img", "convert", "-q", "-f", "qcow2", "-O", "raw", layer.Path, raw); err != nil {
		return fmt.Errorf("flattening %s: %w", layer.Key, err)
	}
	return nil
}
