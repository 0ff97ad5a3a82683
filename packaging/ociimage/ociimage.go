// Package ociimage writes deptrace's container image: one layer holding the
// static binary, as a tarball that is at once an OCI image layout (oci-layout,
// index.json, blobs/sha256/...; what `ctr images import` and OCI tools read)
// and a Docker image archive (manifest.json pointing at the same blobs; what
// `docker load` reads, including Docker 20.10, which predates OCI layout
// loading). No registry, daemon or network is involved, and the same inputs
// give the same bytes.
//
// Write writes one architecture's image; WriteIndex writes several (amd64,
// arm64) as one multi-architecture image: an image index with one manifest
// per platform.
//
// The formats are small and stable, so the standard library writes them; a
// registry client library would bring a long dependency tree for no gain.
package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"regexp"
	"sort"
	"strings"
	"time"
)

// Media types of the OCI image specification (v1.1).
const (
	MediaTypeIndex    = "application/vnd.oci.image.index.v1+json"
	MediaTypeManifest = "application/vnd.oci.image.manifest.v1+json"
	MediaTypeConfig   = "application/vnd.oci.image.config.v1+json"
	MediaTypeLayer    = "application/vnd.oci.image.layer.v1.tar+gzip"
)

// BinaryPath is where the image holds the deptrace binary; it is the
// entrypoint.
const BinaryPath = "/usr/bin/deptrace"

// Image describes what goes into the image.
type Image struct {
	Binary   []byte    // the static deptrace executable
	Name     string    // repository, e.g. deptrace/deptrace
	Version  string    // e.g. 1.2.3 or 0.0.0~git1a2b3c4; the tag is derived from it
	Arch     string    // GOARCH, which is also the OCI architecture name
	Revision string    // the source commit
	Source   string    // the source repository URL
	Created  time.Time // the source commit's time, for reproducible output
}

var notInTag = regexp.MustCompile(`[^A-Za-z0-9_.-]`)

// Tag is the image tag for a version: a Debian-style version such as
// 0.0.0~git1a2b3c4 has characters a tag does not allow (~, +), which become
// '-'.
func Tag(version string) string {
	t := notInTag.ReplaceAllString(version, "-")
	if t == "" || t[0] == '.' || t[0] == '-' {
		t = "v" + t
	}
	if len(t) > 128 {
		t = t[:128]
	}
	return t
}

// Ref is the image's full reference, NAME:TAG.
func (img Image) Ref() string { return img.Name + ":" + Tag(img.Version) }

// Labels are the org.opencontainers.image.* annotations, set both as image
// labels (docker inspect) and as manifest annotations.
func (img Image) Labels() map[string]string {
	l := map[string]string{
		"org.opencontainers.image.title":       "deptrace",
		"org.opencontainers.image.description": "Network service dependencies discovered from inside the Linux kernel (eBPF)",
		"org.opencontainers.image.version":     img.Version,
		"org.opencontainers.image.revision":    img.Revision,
		"org.opencontainers.image.source":      img.Source,
		"org.opencontainers.image.created":     img.Created.UTC().Format(time.RFC3339),
		"org.opencontainers.image.ref.name":    Tag(img.Version),
	}
	for k, v := range l {
		if v == "" {
			delete(l, k)
		}
	}
	return l
}

// Descriptor is an OCI content descriptor.
type Descriptor struct {
	MediaType   string            `json:"mediaType"`
	Digest      string            `json:"digest"`
	Size        int64             `json:"size"`
	Annotations map[string]string `json:"annotations,omitempty"`
	Platform    *Platform         `json:"platform,omitempty"`
}

// Platform is a descriptor's platform.
type Platform struct {
	Architecture string `json:"architecture"`
	OS           string `json:"os"`
}

// Manifest is an OCI image manifest.
type Manifest struct {
	SchemaVersion int               `json:"schemaVersion"`
	MediaType     string            `json:"mediaType"`
	Config        Descriptor        `json:"config"`
	Layers        []Descriptor      `json:"layers"`
	Annotations   map[string]string `json:"annotations,omitempty"`
}

// Index is an OCI image index (index.json).
type Index struct {
	SchemaVersion int          `json:"schemaVersion"`
	MediaType     string       `json:"mediaType"`
	Manifests     []Descriptor `json:"manifests"`
}

// Config is the part of the OCI image configuration deptrace sets.
type Config struct {
	Created      string      `json:"created"`
	Architecture string      `json:"architecture"`
	OS           string      `json:"os"`
	Config       ExecConfig  `json:"config"`
	RootFS       RootFS      `json:"rootfs"`
	History      []HistEntry `json:"history"`
}

// ExecConfig is how a container of the image runs.
type ExecConfig struct {
	Entrypoint   []string            `json:"Entrypoint"`
	Cmd          []string            `json:"Cmd"`
	Env          []string            `json:"Env"`
	WorkingDir   string              `json:"WorkingDir"`
	ExposedPorts map[string]struct{} `json:"ExposedPorts,omitempty"`
	Labels       map[string]string   `json:"Labels"`
	StopSignal   string              `json:"StopSignal"`
}

// RootFS lists the uncompressed layers' digests.
type RootFS struct {
	Type    string   `json:"type"`
	DiffIDs []string `json:"diff_ids"`
}

// HistEntry is one history line.
type HistEntry struct {
	Created   string `json:"created"`
	CreatedBy string `json:"created_by"`
}

// DockerManifest is one entry of a Docker image archive's manifest.json.
type DockerManifest struct {
	Config   string
	RepoTags []string
	Layers   []string
}

func digest(b []byte) string {
	s := sha256.Sum256(b)
	return "sha256:" + hex.EncodeToString(s[:])
}

func blobPath(d string) string { return "blobs/sha256/" + strings.TrimPrefix(d, "sha256:") }

// Layer returns the image's one layer, uncompressed: the binary and the
// directories the agent writes to (no /etc: the agent reads no users, names
// or certificates).
func (img Image) Layer() ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	mt := img.Created.UTC()
	dirs := []struct {
		name string
		mode int64
	}{
		{"run/", 0o755}, {"run/deptrace/", 0o755}, {"tmp/", 0o1777},
		{"usr/", 0o755}, {"usr/bin/", 0o755},
		{"var/", 0o755}, {"var/lib/", 0o755}, {"var/lib/deptrace/", 0o750},
	}
	for _, d := range dirs {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d.name, Mode: d.mode, ModTime: mt, Format: tar.FormatPAX}); err != nil {
			return nil, err
		}
	}
	if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: strings.TrimPrefix(BinaryPath, "/"), Mode: 0o755,
		Size: int64(len(img.Binary)), ModTime: mt, Format: tar.FormatPAX}); err != nil {
		return nil, err
	}
	if _, err := tw.Write(img.Binary); err != nil {
		return nil, err
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// built is one image's blobs and descriptors.
type built struct {
	manifest Descriptor // with its platform
	config   Descriptor
	layer    Descriptor
	blobs    map[string][]byte // by path, blobs/sha256/...
}

// build makes img's layer, config and manifest.
func (img Image) build() (*built, error) {
	if len(img.Binary) == 0 || img.Name == "" || img.Version == "" || img.Arch == "" {
		return nil, fmt.Errorf("image: binary, name, version and arch are required")
	}
	layer, err := img.Layer()
	if err != nil {
		return nil, fmt.Errorf("image layer: %w", err)
	}
	var gz bytes.Buffer
	zw, err := gzip.NewWriterLevel(&gz, gzip.BestCompression)
	if err != nil {
		return nil, err
	}
	if _, err := zw.Write(layer); err != nil {
		return nil, err
	}
	if err := zw.Close(); err != nil {
		return nil, err
	}
	created := img.Created.UTC().Format(time.RFC3339)
	labels := img.Labels()
	cfg, err := json.Marshal(Config{
		Created: created, Architecture: img.Arch, OS: "linux",
		Config: ExecConfig{
			Entrypoint:   []string{BinaryPath},
			Cmd:          []string{"agent"},
			Env:          []string{"PATH=/usr/bin"},
			WorkingDir:   "/",
			ExposedPorts: map[string]struct{}{"9477/tcp": {}},
			Labels:       labels,
			StopSignal:   "SIGTERM",
		},
		RootFS:  RootFS{Type: "layers", DiffIDs: []string{digest(layer)}},
		History: []HistEntry{{Created: created, CreatedBy: "make image (packaging/mkimage): " + BinaryPath}},
	})
	if err != nil {
		return nil, err
	}
	layerDesc := Descriptor{MediaType: MediaTypeLayer, Digest: digest(gz.Bytes()), Size: int64(gz.Len())}
	cfgDesc := Descriptor{MediaType: MediaTypeConfig, Digest: digest(cfg), Size: int64(len(cfg))}
	man, err := json.Marshal(Manifest{SchemaVersion: 2, MediaType: MediaTypeManifest, Config: cfgDesc, Layers: []Descriptor{layerDesc}, Annotations: labels})
	if err != nil {
		return nil, err
	}
	return &built{
		manifest: Descriptor{MediaType: MediaTypeManifest, Digest: digest(man), Size: int64(len(man)),
			Platform: &Platform{Architecture: img.Arch, OS: "linux"}},
		config: cfgDesc,
		layer:  layerDesc,
		blobs: map[string][]byte{
			blobPath(layerDesc.Digest): gz.Bytes(),
			blobPath(cfgDesc.Digest):   cfg,
			blobPath(digest(man)):      man,
		},
	}, nil
}

// nameAnnotations name an image in index.json.
func nameAnnotations(img Image) map[string]string {
	return map[string]string{
		// containerd names the imported image by this one...
		"io.containerd.image.name": dockerHubRef(img.Ref()),
		// ...OCI tools by this one (a tag, per the spec).
		"org.opencontainers.image.ref.name": Tag(img.Version),
	}
}

// Write writes the image tarball to w.
func Write(w io.Writer, img Image) error {
	b, err := img.build()
	if err != nil {
		return err
	}
	md := b.manifest
	md.Annotations = nameAnnotations(img)
	idx, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{md}})
	if err != nil {
		return err
	}
	dm, err := json.Marshal([]DockerManifest{{Config: blobPath(b.config.Digest), RepoTags: []string{img.Ref()}, Layers: []string{blobPath(b.layer.Digest)}}})
	if err != nil {
		return err
	}
	b.blobs["index.json"] = idx
	b.blobs["manifest.json"] = dm
	return writeTar(w, b.blobs, img.Created)
}

// ArchRef is the reference a multi-architecture tarball gives one
// architecture's image in its Docker archive: NAME:TAG-ARCH.
func (img Image) ArchRef() string { return img.Ref() + "-" + img.Arch }

// WriteIndex writes one multi-architecture image of imgs (one per
// architecture, the same name and version) to w. index.json holds one
// entry, the image index (named, as in Write), and that index one manifest
// per platform: the layout docker buildx writes, which containerd imports
// as one multi-platform image (`ctr images import --platform linux/arm64`
// takes that platform's content; an index.json with one named entry per
// platform would instead make the last entry the image, whatever the
// platform). The Docker archive part (manifest.json, for `docker load`
// without the containerd image store) tags each architecture NAME:TAG-ARCH.
func WriteIndex(w io.Writer, imgs []Image) error {
	if len(imgs) == 0 {
		return fmt.Errorf("image index: no images")
	}
	files := map[string][]byte{}
	var manifests []Descriptor
	var dms []DockerManifest
	seen := map[string]bool{}
	for _, img := range imgs {
		if img.Name != imgs[0].Name || img.Version != imgs[0].Version {
			return fmt.Errorf("image index: %s and %s: one name and version expected", imgs[0].Ref(), img.Ref())
		}
		if seen[img.Arch] {
			return fmt.Errorf("image index: architecture %s twice", img.Arch)
		}
		seen[img.Arch] = true
		b, err := img.build()
		if err != nil {
			return err
		}
		for p, c := range b.blobs {
			files[p] = c
		}
		manifests = append(manifests, b.manifest)
		dms = append(dms, DockerManifest{Config: blobPath(b.config.Digest), RepoTags: []string{img.ArchRef()}, Layers: []string{blobPath(b.layer.Digest)}})
	}
	inner, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: manifests})
	if err != nil {
		return err
	}
	files[blobPath(digest(inner))] = inner
	top, err := json.Marshal(Index{SchemaVersion: 2, MediaType: MediaTypeIndex, Manifests: []Descriptor{{
		MediaType: MediaTypeIndex, Digest: digest(inner), Size: int64(len(inner)), Annotations: nameAnnotations(imgs[0]),
	}}})
	if err != nil {
		return err
	}
	dm, err := json.Marshal(dms)
	if err != nil {
		return err
	}
	files["index.json"] = top
	files["manifest.json"] = dm
	return writeTar(w, files, imgs[0].Created)
}

// writeTar writes the layout's files (and oci-layout) in name order.
func writeTar(w io.Writer, files map[string][]byte, created time.Time) error {
	files["oci-layout"] = []byte(`{"imageLayoutVersion":"1.0.0"}`)
	names := make([]string, 0, len(files))
	for n := range files {
		names = append(names, n)
	}
	sort.Strings(names)
	tw := tar.NewWriter(w)
	mt := created.UTC()
	for _, d := range []string{"blobs/", "blobs/sha256/"} {
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: d, Mode: 0o755, ModTime: mt, Format: tar.FormatPAX}); err != nil {
			return err
		}
	}
	for _, n := range names {
		b := files[n]
		if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeReg, Name: n, Mode: 0o644, Size: int64(len(b)), ModTime: mt, Format: tar.FormatPAX}); err != nil {
			return err
		}
		if _, err := tw.Write(b); err != nil {
			return err
		}
	}
	return tw.Close()
}

// dockerHubRef is the fully qualified form containerd and Docker use for a
// short name: deptrace/deptrace:1 is docker.io/deptrace/deptrace:1.
func dockerHubRef(ref string) string {
	first := strings.SplitN(ref, "/", 2)[0]
	if strings.Contains(ref, "/") && (strings.ContainsAny(first, ".:") || first == "localhost") {
		return ref
	}
	if !strings.Contains(ref, "/") {
		ref = "library/" + ref
	}
	return "docker.io/" + ref
}
