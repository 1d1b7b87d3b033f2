// Command ociimage assembles an OCI image tarball from files on disk, without a Docker engine or
// a registry: every layer is a tar of host files or directories, there is no base image. It is
// what `make images` (hack/images.sh) runs for the manager, kvrouter, vllm-sim and bundle images.
//
// The tarball holds both an OCI image layout (oci-layout, index.json, blobs/sha256/...) and the
// `docker save` manifest.json pointing at the same blobs, so `kind load image-archive`,
// `ctr images import`, `docker load`, `podman load` and `crane push` all read it.
//
//	go run ./hack/ociimage --out kvrouter.tar --tag ghcr.io/kvroute/kvrouter:v0.1.0 \
//	  --layer rootfs/base=/ --layer rootfs/zmq=/ --layer bin/kvrouter=/usr/local/bin/kvrouter \
//	  --entrypoint /usr/local/bin/kvrouter --user 65532:65532 --label org.opencontainers.image.version=v0.1.0
//
// Layers are reproducible: entries sorted, owned by root, timestamps SOURCE_DATE_EPOCH (default 0).
package main

import (
	"archive/tar"
	"bytes"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"time"

	v1 "github.com/google/go-containerregistry/pkg/v1"
	"github.com/google/go-containerregistry/pkg/v1/empty"
	"github.com/google/go-containerregistry/pkg/v1/mutate"
	"github.com/google/go-containerregistry/pkg/v1/tarball"
	"github.com/google/go-containerregistry/pkg/v1/types"
)

type multi []string

func (m *multi) String() string     { return strings.Join(*m, ",") }
func (m *multi) Set(s string) error { *m = append(*m, s); return nil }

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "ociimage:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("ociimage", flag.ContinueOnError)
	out := fs.String("out", "", "tarball to write")
	tag := fs.String("tag", "", "image reference recorded in the tarball (REPO:TAG)")
	var layers, labels, env, entrypoint, cmd multi
	fs.Var(&layers, "layer", "one layer: SRC=DST[,SRC=DST...]; a directory SRC is copied under DST (repeatable, in order)")
	fs.Var(&labels, "label", "KEY=VALUE config label (repeatable)")
	fs.Var(&env, "env", "KEY=VALUE environment (repeatable; default PATH)")
	fs.Var(&entrypoint, "entrypoint", "entrypoint argument (repeatable)")
	fs.Var(&cmd, "cmd", "cmd argument (repeatable)")
	var owners multi
	fs.Var(&owners, "owner", "PATH=UID:GID owner of one entry in the image (repeatable; every other entry is root's)")
	user := fs.String("user", "", "user[:group] the image runs as")
	workdir := fs.String("workdir", "/", "working directory")
	arch := fs.String("arch", runtime.GOARCH, "image architecture (GOARCH name)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *out == "" || *tag == "" {
		return errors.New("--out and --tag are required")
	}
	epoch := time.Unix(0, 0).UTC()
	if s := os.Getenv("SOURCE_DATE_EPOCH"); s != "" {
		n, err := strconv.ParseInt(s, 10, 64)
		if err != nil {
			return fmt.Errorf("SOURCE_DATE_EPOCH: %w", err)
		}
		epoch = time.Unix(n, 0).UTC()
	}

	img := mutate.MediaType(empty.Image, types.OCIManifestSchema1)
	img = mutate.ConfigMediaType(img, types.OCIConfigJSON)
	own := map[string][2]int{}
	for _, o := range owners {
		p, ug, ok1 := strings.Cut(o, "=")
		u, g, ok2 := strings.Cut(ug, ":")
		nu, err1 := strconv.Atoi(u)
		ng, err2 := strconv.Atoi(g)
		if !ok1 || !ok2 || err1 != nil || err2 != nil {
			return fmt.Errorf("--owner %q: want PATH=UID:GID", o)
		}
		own[strings.TrimPrefix(path.Clean("/"+p), "/")] = [2]int{nu, ng}
	}
	for _, spec := range layers {
		data, err := layerTar(spec, epoch, own)
		if err != nil {
			return fmt.Errorf("layer %q: %w", spec, err)
		}
		l, err := tarball.LayerFromOpener(func() (io.ReadCloser, error) {
			return io.NopCloser(bytes.NewReader(data)), nil
		}, tarball.WithMediaType(types.OCILayer), tarball.WithCompressedCaching)
		if err != nil {
			return err
		}
		if img, err = mutate.AppendLayers(img, l); err != nil {
			return err
		}
	}
	cf, err := img.ConfigFile()
	if err != nil {
		return err
	}
	cf = cf.DeepCopy()
	cf.OS, cf.Architecture = "linux", *arch
	if *arch == "arm64" {
		cf.Variant = "v8"
	}
	cf.Created = v1.Time{Time: epoch}
	cf.Config.Entrypoint = entrypoint
	cf.Config.Cmd = cmd
	cf.Config.User = *user
	cf.Config.WorkingDir = *workdir
	cf.Config.Env = env
	if len(env) == 0 {
		cf.Config.Env = []string{"PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"}
	}
	cf.Config.Labels = map[string]string{}
	for _, l := range labels {
		k, v, ok := strings.Cut(l, "=")
		if !ok {
			return fmt.Errorf("--label %q: want KEY=VALUE", l)
		}
		cf.Config.Labels[k] = v
	}
	if img, err = mutate.ConfigFile(img, cf); err != nil {
		return err
	}
	if err := writeArchive(*out, *tag, img); err != nil {
		return err
	}
	d, _ := img.Digest()
	fmt.Printf("%s %s %s\n", *out, *tag, d)
	return nil
}

// layerTar builds one uncompressed, reproducible layer from SRC=DST pairs.
func layerTar(spec string, epoch time.Time, own map[string][2]int) ([]byte, error) {
	var buf bytes.Buffer
	tw := tar.NewWriter(&buf)
	seen := map[string]bool{}
	// dir adds the parent directories of name that are not in the layer yet.
	parents := func(name string) error {
		var missing []string
		for d := path.Dir(name); d != "." && d != "/" && d != ""; d = path.Dir(d) {
			if !seen[d] {
				missing = append(missing, d)
			}
		}
		for i := len(missing) - 1; i >= 0; i-- {
			seen[missing[i]] = true
			if err := tw.WriteHeader(&tar.Header{Typeflag: tar.TypeDir, Name: missing[i] + "/", Mode: 0o755,
				ModTime: epoch, Format: tar.FormatPAX}); err != nil {
				return err
			}
		}
		return nil
	}
	for _, pair := range strings.Split(spec, ",") {
		src, dst, ok := strings.Cut(pair, "=")
		if !ok {
			return nil, fmt.Errorf("%q: want SRC=DST", pair)
		}
		dst = strings.TrimPrefix(path.Clean("/"+dst), "/")
		var paths []string
		err := filepath.WalkDir(src, func(p string, _ fs.DirEntry, err error) error {
			if err != nil {
				return err
			}
			paths = append(paths, p)
			return nil
		})
		if err != nil {
			return nil, err
		}
		sort.Strings(paths)
		for _, p := range paths {
			rel, err := filepath.Rel(src, p)
			if err != nil {
				return nil, err
			}
			name := path.Join(dst, filepath.ToSlash(rel))
			if name == "" || name == "." {
				continue // the root directory itself
			}
			fi, err := os.Lstat(p)
			if err != nil {
				return nil, err
			}
			if err := parents(name); err != nil {
				return nil, err
			}
			if fi.IsDir() && seen[name] {
				continue
			}
			seen[name] = true
			link := ""
			if fi.Mode()&os.ModeSymlink != 0 {
				if link, err = os.Readlink(p); err != nil {
					return nil, err
				}
			}
			hdr, err := tar.FileInfoHeader(fi, link)
			if err != nil {
				return nil, err
			}
			hdr.Name = name
			if fi.IsDir() {
				hdr.Name += "/"
			}
			hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = 0, 0, "root", "root"
			if o, ok := own[name]; ok {
				hdr.Uid, hdr.Gid, hdr.Uname, hdr.Gname = o[0], o[1], "", ""
			}
			hdr.ModTime, hdr.AccessTime, hdr.ChangeTime = epoch, time.Time{}, time.Time{}
			hdr.Format = tar.FormatPAX
			if err := tw.WriteHeader(hdr); err != nil {
				return nil, err
			}
			if fi.Mode().IsRegular() {
				f, err := os.Open(p)
				if err != nil {
					return nil, err
				}
				_, err = io.Copy(tw, f)
				f.Close()
				if err != nil {
					return nil, err
				}
			}
		}
	}
	if err := tw.Close(); err != nil {
		return nil, err
	}
	return buf.Bytes(), nil
}

// writeArchive writes an OCI image layout plus docker-save's manifest.json into one tar.
func writeArchive(out, ref string, img v1.Image) error {
	f, err := os.Create(out + ".tmp")
	if err != nil {
		return err
	}
	defer os.Remove(out + ".tmp")
	tw := tar.NewWriter(f)
	add := func(name string, r io.Reader, size int64) error {
		if err := tw.WriteHeader(&tar.Header{Name: name, Mode: 0o644, Size: size, Typeflag: tar.TypeReg,
			ModTime: time.Unix(0, 0)}); err != nil {
			return err
		}
		_, err := io.Copy(tw, r)
		return err
	}
	addBytes := func(name string, b []byte) error { return add(name, bytes.NewReader(b), int64(len(b))) }
	if err := tw.WriteHeader(&tar.Header{Name: "blobs/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	if err := tw.WriteHeader(&tar.Header{Name: "blobs/sha256/", Typeflag: tar.TypeDir, Mode: 0o755, ModTime: time.Unix(0, 0)}); err != nil {
		return err
	}
	blob := func(h v1.Hash) string { return "blobs/" + h.Algorithm + "/" + h.Hex }

	cfgName, err := img.ConfigName()
	if err != nil {
		return err
	}
	cfg, err := img.RawConfigFile()
	if err != nil {
		return err
	}
	if err := addBytes(blob(cfgName), cfg); err != nil {
		return err
	}
	layers, err := img.Layers()
	if err != nil {
		return err
	}
	var layerPaths []string
	for _, l := range layers {
		d, err := l.Digest()
		if err != nil {
			return err
		}
		size, err := l.Size()
		if err != nil {
			return err
		}
		rc, err := l.Compressed()
		if err != nil {
			return err
		}
		err = add(blob(d), rc, size)
		rc.Close()
		if err != nil {
			return err
		}
		layerPaths = append(layerPaths, blob(d))
	}
	raw, err := img.RawManifest()
	if err != nil {
		return err
	}
	digest, err := img.Digest()
	if err != nil {
		return err
	}
	if err := addBytes(blob(digest), raw); err != nil {
		return err
	}
	tagOnly := ref
	if i := strings.LastIndex(ref, ":"); i > strings.LastIndex(ref, "/") {
		tagOnly = ref[i+1:]
	}
	cf, _ := img.ConfigFile()
	index := map[string]any{
		"schemaVersion": 2,
		"mediaType":     string(types.OCIImageIndex),
		"manifests": []map[string]any{{
			"mediaType": string(types.OCIManifestSchema1),
			"digest":    digest.String(),
			"size":      len(raw),
			"platform":  map[string]string{"os": cf.OS, "architecture": cf.Architecture},
			"annotations": map[string]string{
				"io.containerd.image.name":          ref,
				"org.opencontainers.image.ref.name": tagOnly,
			},
		}},
	}
	dockerManifest := []map[string]any{{"Config": blob(cfgName), "RepoTags": []string{ref}, "Layers": layerPaths}}
	for _, e := range []struct {
		name string
		v    any
	}{{"index.json", index}, {"manifest.json", dockerManifest}} {
		name := e.name
		b, err := json.Marshal(e.v)
		if err != nil {
			return err
		}
		if err := addBytes(name, b); err != nil {
			return err
		}
	}
	if err := addBytes("oci-layout", []byte(`{"imageLayoutVersion":"1.0.0"}`)); err != nil {
		return err
	}
	if err := tw.Close(); err != nil {
		return err
	}
	if err := f.Close(); err != nil {
		return err
	}
	return os.Rename(out+".tmp", out)
}
