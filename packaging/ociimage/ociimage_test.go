package ociimage

import (
	"archive/tar"
	"bytes"
	"compress/gzip"
	"encoding/json"
	"io"
	"slices"
	"testing"
	"time"
)

func testImage() Image {
	return Image{
		Binary: []byte("\x7fELF not really"), Name: "deptrace/deptrace", Version: "0.0.0~git1a2b3c4", Arch: "amd64",
		Revision: "1a2b3c4d", Source: "https://github.com/deptrace/deptrace", Created: time.Unix(1700000000, 0),
	}
}

func untar(t *testing.T, b []byte) map[string][]byte {
	t.Helper()
	files := map[string][]byte{}
	tr := tar.NewReader(bytes.NewReader(b))
	for {
		h, err := tr.Next()
		if err == io.EOF {
			return files
		}
		if err != nil {
			t.Fatal(err)
		}
		if h.Typeflag == tar.TypeReg {
			c, _ := io.ReadAll(tr)
			files[h.Name] = c
		}
	}
}

func blob(t *testing.T, files map[string][]byte, d Descriptor) []byte {
	t.Helper()
	b, ok := files[blobPath(d.Digest)]
	if !ok {
		t.Fatalf("blob %s missing", d.Digest)
	}
	if digest(b) != d.Digest || int64(len(b)) != d.Size {
		t.Fatalf("blob %s: digest %s, %d bytes, descriptor says %d", d.Digest, digest(b), len(b), d.Size)
	}
	return b
}

// The tarball is a valid OCI layout and a Docker archive of the same
// blobs, every digest checks, and the binary is the entrypoint.
func TestWriteLayoutAndDockerArchive(t *testing.T) {
	img := testImage()
	var buf bytes.Buffer
	if err := Write(&buf, img); err != nil {
		t.Fatal(err)
	}
	files := untar(t, buf.Bytes())
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout: %s", files["oci-layout"])
	}
	var idx Index
	if err := json.Unmarshal(files["index.json"], &idx); err != nil {
		t.Fatal(err)
	}
	if idx.SchemaVersion != 2 || len(idx.Manifests) != 1 {
		t.Fatalf("index: %+v", idx)
	}
	md := idx.Manifests[0]
	if md.Annotations["io.containerd.image.name"] != "docker.io/deptrace/deptrace:0.0.0-git1a2b3c4" ||
		md.Annotations["org.opencontainers.image.ref.name"] != "0.0.0-git1a2b3c4" || md.Platform == nil || md.Platform.Architecture != "amd64" {
		t.Errorf("index entry: %+v", md)
	}
	var man Manifest
	if err := json.Unmarshal(blob(t, files, md), &man); err != nil {
		t.Fatal(err)
	}
	if man.MediaType != MediaTypeManifest || man.Config.MediaType != MediaTypeConfig || len(man.Layers) != 1 {
		t.Fatalf("manifest: %+v", man)
	}
	var cfg Config
	if err := json.Unmarshal(blob(t, files, man.Config), &cfg); err != nil {
		t.Fatal(err)
	}
	gz := blob(t, files, man.Layers[0])
	zr, err := gzip.NewReader(bytes.NewReader(gz))
	if err != nil {
		t.Fatal(err)
	}
	layer, _ := io.ReadAll(zr)
	if cfg.RootFS.Type != "layers" || !slices.Equal(cfg.RootFS.DiffIDs, []string{digest(layer)}) {
		t.Errorf("rootfs %+v, layer diff id %s", cfg.RootFS, digest(layer))
	}
	if cfg.OS != "linux" || cfg.Architecture != "amd64" || !slices.Equal(cfg.Config.Entrypoint, []string{"/usr/bin/deptrace"}) ||
		!slices.Equal(cfg.Config.Cmd, []string{"agent"}) || cfg.Created != "2023-11-14T22:13:20Z" {
		t.Errorf("config: %+v", cfg)
	}
	want := map[string]string{
		"org.opencontainers.image.version":  "0.0.0~git1a2b3c4",
		"org.opencontainers.image.revision": "1a2b3c4d",
		"org.opencontainers.image.source":   "https://github.com/deptrace/deptrace",
		"org.opencontainers.image.created":  "2023-11-14T22:13:20Z",
	}
	for k, v := range want {
		if cfg.Config.Labels[k] != v || man.Annotations[k] != v {
			t.Errorf("%s: label %q, annotation %q, want %q", k, cfg.Config.Labels[k], man.Annotations[k], v)
		}
	}
	inLayer := untar(t, layer)
	if !bytes.Equal(inLayer["usr/bin/deptrace"], img.Binary) || len(inLayer) != 1 {
		t.Errorf("layer files: %d (want only usr/bin/deptrace)", len(inLayer))
	}

	var dm []DockerManifest
	if err := json.Unmarshal(files["manifest.json"], &dm); err != nil {
		t.Fatal(err)
	}
	if len(dm) != 1 || dm[0].Config != blobPath(man.Config.Digest) || !slices.Equal(dm[0].Layers, []string{blobPath(man.Layers[0].Digest)}) ||
		!slices.Equal(dm[0].RepoTags, []string{"deptrace/deptrace:0.0.0-git1a2b3c4"}) {
		t.Errorf("manifest.json: %+v", dm)
	}
}

// The same inputs give the same bytes.
func TestWriteReproducible(t *testing.T) {
	var a, b bytes.Buffer
	if err := Write(&a, testImage()); err != nil {
		t.Fatal(err)
	}
	if err := Write(&b, testImage()); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(a.Bytes(), b.Bytes()) {
		t.Error("two writes of one image differ")
	}
}

func TestTag(t *testing.T) {
	for in, want := range map[string]string{
		"1.2.3": "1.2.3", "0.0.0~gitabc": "0.0.0-gitabc", "1.0+dfsg": "1.0-dfsg", "~x": "v-x",
	} {
		if got := Tag(in); got != want {
			t.Errorf("Tag(%q) = %q, want %q", in, got, want)
		}
	}
}

func TestWriteRefusesMissingFields(t *testing.T) {
	img := testImage()
	img.Binary = nil
	if err := Write(io.Discard, img); err == nil {
		t.Error("no error without a binary")
	}
}

// A multi-architecture image: index.json names one image index, which has
// one manifest per platform; each manifest's config, layer and binary are
// that architecture's, and every digest checks.
func TestWriteIndex(t *testing.T) {
	amd, arm := testImage(), testImage()
	arm.Arch, arm.Binary = "arm64", []byte("\x7fELF an arm64 one")
	var buf bytes.Buffer
	if err := WriteIndex(&buf, []Image{amd, arm}); err != nil {
		t.Fatal(err)
	}
	files := untar(t, buf.Bytes())
	if string(files["oci-layout"]) != `{"imageLayoutVersion":"1.0.0"}` {
		t.Errorf("oci-layout: %s", files["oci-layout"])
	}
	var top Index
	if err := json.Unmarshal(files["index.json"], &top); err != nil {
		t.Fatal(err)
	}
	if top.SchemaVersion != 2 || top.MediaType != MediaTypeIndex || len(top.Manifests) != 1 {
		t.Fatalf("index.json: %+v", top)
	}
	d := top.Manifests[0]
	if d.MediaType != MediaTypeIndex || d.Platform != nil ||
		d.Annotations["io.containerd.image.name"] != "docker.io/deptrace/deptrace:0.0.0-git1a2b3c4" ||
		d.Annotations["org.opencontainers.image.ref.name"] != "0.0.0-git1a2b3c4" {
		t.Errorf("index.json entry: %+v", d)
	}
	var idx Index
	if err := json.Unmarshal(blob(t, files, d), &idx); err != nil {
		t.Fatal(err)
	}
	if idx.SchemaVersion != 2 || idx.MediaType != MediaTypeIndex || len(idx.Manifests) != 2 {
		t.Fatalf("image index: %+v", idx)
	}
	var dm []DockerManifest
	if err := json.Unmarshal(files["manifest.json"], &dm); err != nil {
		t.Fatal(err)
	}
	if len(dm) != 2 {
		t.Fatalf("manifest.json: %+v", dm)
	}
	digests := map[string]bool{}
	for i, img := range []Image{amd, arm} {
		md := idx.Manifests[i]
		if md.MediaType != MediaTypeManifest || md.Platform == nil || md.Platform.OS != "linux" || md.Platform.Architecture != img.Arch {
			t.Errorf("%s: index entry %+v", img.Arch, md)
			continue
		}
		digests[md.Digest] = true
		var man Manifest
		if err := json.Unmarshal(blob(t, files, md), &man); err != nil {
			t.Fatal(err)
		}
		var cfg Config
		if err := json.Unmarshal(blob(t, files, man.Config), &cfg); err != nil {
			t.Fatal(err)
		}
		if cfg.Architecture != img.Arch || cfg.OS != "linux" || man.Annotations["org.opencontainers.image.version"] != img.Version {
			t.Errorf("%s: config architecture %s, os %s, annotations %v", img.Arch, cfg.Architecture, cfg.OS, man.Annotations)
		}
		zr, err := gzip.NewReader(bytes.NewReader(blob(t, files, man.Layers[0])))
		if err != nil {
			t.Fatal(err)
		}
		layer, _ := io.ReadAll(zr)
		if !slices.Equal(cfg.RootFS.DiffIDs, []string{digest(layer)}) || !bytes.Equal(untar(t, layer)["usr/bin/deptrace"], img.Binary) {
			t.Errorf("%s: layer does not hold this architecture's binary", img.Arch)
		}
		if dm[i].Config != blobPath(man.Config.Digest) || !slices.Equal(dm[i].Layers, []string{blobPath(man.Layers[0].Digest)}) ||
			!slices.Equal(dm[i].RepoTags, []string{"deptrace/deptrace:0.0.0-git1a2b3c4-" + img.Arch}) {
			t.Errorf("%s: manifest.json entry %+v", img.Arch, dm[i])
		}
		// The same manifest as the single-architecture image's.
		var one bytes.Buffer
		if err := Write(&one, img); err != nil {
			t.Fatal(err)
		}
		var oneIdx Index
		if err := json.Unmarshal(untar(t, one.Bytes())["index.json"], &oneIdx); err != nil {
			t.Fatal(err)
		}
		if oneIdx.Manifests[0].Digest != md.Digest {
			t.Errorf("%s: manifest %s, the single-architecture image's %s", img.Arch, md.Digest, oneIdx.Manifests[0].Digest)
		}
	}
	if len(digests) != 2 {
		t.Errorf("the two platforms share a manifest")
	}
	var again bytes.Buffer
	if err := WriteIndex(&again, []Image{amd, arm}); err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(buf.Bytes(), again.Bytes()) {
		t.Error("two writes of one index differ")
	}
}

func TestWriteIndexRefusesMismatch(t *testing.T) {
	a, b := testImage(), testImage()
	if err := WriteIndex(io.Discard, []Image{a, b}); err == nil {
		t.Error("no error for one architecture twice")
	}
	b.Arch, b.Version = "arm64", "9.9.9"
	if err := WriteIndex(io.Discard, []Image{a, b}); err == nil {
		t.Error("no error for two versions")
	}
	if err := WriteIndex(io.Discard, nil); err == nil {
		t.Error("no error without images")
	}
}
