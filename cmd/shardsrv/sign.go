package main

import (
	"context"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"path"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/shardsrv/shardsrv/internal/bytesize"
	"github.com/shardsrv/shardsrv/internal/oms"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/verify"
)

const signUsage = `Usage: shardsrv sign --key KEY.pem [--shard-size SIZE] [--out FILE] DIR|STORE-URL

Signs a checkpoint folder: hashes every file in shards (OpenSSF Model Signing v1.0, method
"shards") and writes model.sig, a Sigstore bundle signed with KEY.pem (ECDSA P-256/P-384/P-521 or
Ed25519, PEM). No network is used. A directory gets DIR/model.sig; for an object store the
bundle is written to --out (upload it beside the checkpoint's files). Servers widen every read
to whole shards, which must be a power of two up to 4 MiB; smaller shards make model.sig larger
(about 200 bytes a shard). A progress bar shows on a terminal.

Example:
  openssl ecparam -name prime256v1 -genkey -noout | openssl pkcs8 -topk8 -nocrypt -out key.pem
  openssl pkey -in key.pem -pubout -out key.pub.pem
  shardsrv sign --key key.pem .run/checkpoints/qwen2-moe-tiny
  shardsrv serve --store .run/checkpoints --verify required --trust-key key.pub.pem
` + storeURLUsage

const verifyUsage = `Usage: shardsrv verify --trust-key PUB.pem DIR|STORE-URL

Checks a signed checkpoint end to end: model.sig's signature against the trusted key, then every
byte of every file it lists, and that the folder holds no file it does not cover. Prints the
signed subject digest. A progress bar shows on a terminal.
` + storeURLUsage

// storeURLUsage says what sign and verify take besides a directory.
const storeURLUsage = `
A STORE-URL is a checkpoint folder in an object store, as serve's --store names one
(s3://BUCKET/PREFIX, gs://BUCKET/PREFIX, az://ACCOUNT/CONTAINER/PREFIX), reached with the
store's usual credentials; a local S3 is named by AWS_ENDPOINT_URL_S3 or AWS_ENDPOINT_URL.
`

// DefaultShardBytes is the shard size sign uses: a verified read is widened by less than two of
// them, and a 685 GB model signs into about 140 MB.
const DefaultShardBytes = 1 << 20

func signCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("sign", signUsage, stderr)
	keyFile := fs.String("key", "", "`FILE` holding the PEM private key to sign with (required)")
	shard := int64(DefaultShardBytes)
	fs.Var(bytesize.Value{P: &shard}, "shard-size", "bytes (`SIZE`) per signed shard")
	out := fs.String("out", "model.sig", "`FILE` the bundle is written to, for object stores")
	folder, err := parseFolder(fs, args)
	if err != nil {
		return err
	}
	if *keyFile == "" || folder == "" || !verify.ShardSizeOK(shard) {
		fs.Usage()
		return fmt.Errorf("sign: --key, a --shard-size that is a power of two up to %d bytes and one checkpoint "+
			"folder are required", verify.MaxShardBytes)
	}
	pem, err := os.ReadFile(*keyFile)
	if err != nil {
		return err
	}
	key, err := oms.ParsePrivateKeyPEM(pem)
	if err != nil {
		return fmt.Errorf("--key %s: %w", *keyFile, err)
	}
	ctx := context.Background()
	st, name, err := openModel(ctx, folder)
	if err != nil {
		return err
	}
	files, total, err := modelFiles(ctx, st)
	if err != nil {
		return err
	}
	b := newBar(stderr)
	start := time.Now()
	m, err := oms.BuildShards(name, counted(files, total, b), shard)
	b.end()
	if err != nil {
		return err
	}
	bundle, err := oms.Sign(m, key)
	if err != nil {
		return err
	}
	dest := *out
	if !isObjectStore(folder) {
		dest = path.Join(strings.TrimPrefix(folder, "file://"), oms.SignatureFile)
	}
	if err := os.WriteFile(dest, bundle, 0o644); err != nil {
		return err
	}
	subject := m.SubjectDigest()
	fmt.Fprintf(stdout, "signed %d files (%s in %s shards) in %s: %s\nsubject sha256:%s\n", len(m.Files()),
		size(total), size(shard), time.Since(start).Round(time.Millisecond), dest, hex.EncodeToString(subject[:]))
	return nil
}

func verifyCmd(args []string, stdout, stderr io.Writer) error {
	fs := newFlagSet("verify", verifyUsage, stderr)
	var cfg verify.Config
	// Of serve's verification flags only --trust-key: this command always verifies.
	serveFlags := flag.NewFlagSet("serve", flag.ContinueOnError)
	cfg.RegisterFlags(serveFlags)
	trust := serveFlags.Lookup("trust-key")
	fs.Var(trust.Value, trust.Name, trust.Usage)
	folder, err := parseFolder(fs, args)
	if err != nil {
		return err
	}
	if len(cfg.KeyFiles) == 0 || folder == "" {
		fs.Usage()
		return errors.New("verify: --trust-key and one checkpoint folder are required")
	}
	keys, err := cfg.Keys()
	if err != nil {
		return err
	}
	ctx := context.Background()
	st, _, err := openModel(ctx, folder)
	if err != nil {
		return err
	}
	sigInfo, err := st.Stat(ctx, oms.SignatureFile)
	if err != nil {
		return fmt.Errorf("%s: %w", oms.SignatureFile, err)
	}
	if sigInfo.Size > verify.MaxSignatureBytes {
		return fmt.Errorf("%s is %d bytes, more than a signature may have", oms.SignatureFile, sigInfo.Size)
	}
	bundle := make([]byte, sigInfo.Size)
	if err := st.ReadAt(ctx, oms.SignatureFile, sigInfo.Version, bundle, 0); err != nil {
		return err
	}
	m, err := oms.Verify(bundle, keys)
	if err != nil {
		return err
	}
	files, total, err := modelFiles(ctx, st)
	if err != nil {
		return err
	}
	var problems []error
	present := map[string]bool{}
	for _, f := range files {
		present[f.Path] = true
		if !m.Covers(f.Path) && !m.Ignored(f.Path) {
			problems = append(problems, fmt.Errorf("%s is not covered by the signature", f.Path))
		}
	}
	for _, f := range m.Files() {
		if !present[f] {
			problems = append(problems, fmt.Errorf("%s is signed but missing", f))
		}
	}
	b := newBar(stderr)
	for _, f := range counted(files, total, b) {
		if m.Covers(f.Path) {
			if err := m.CheckFile(f.Path, f.R, f.Size); err != nil {
				problems = append(problems, err)
			}
		}
	}
	b.end()
	if len(problems) > 0 {
		return fmt.Errorf("verify: %w", errors.Join(problems...))
	}
	subject := m.SubjectDigest()
	fmt.Fprintf(stdout, "verified %d files, %s, against %s\nsubject sha256:%s\n", len(m.Files()), size(total),
		oms.SignatureFile, hex.EncodeToString(subject[:]))
	return nil
}

// parseFolder parses flags given before or after the one positional argument, the folder.
func parseFolder(fs *flag.FlagSet, args []string) (string, error) {
	var folder string
	for {
		if err := fs.Parse(args); err != nil {
			return "", err
		}
		if fs.NArg() == 0 {
			return folder, nil
		}
		if folder != "" {
			return "", fmt.Errorf("%s: one folder, not %q and %q (see 'shardsrv %[1]s -h')", fs.Name(), folder, fs.Arg(0))
		}
		folder, args = fs.Arg(0), fs.Args()[1:]
	}
}

// openModel opens a checkpoint folder (a directory or an object-store URL) as a store rooted at it,
// and names the model after the folder.
func openModel(ctx context.Context, url string) (store.Store, string, error) {
	c := &config{store: url, objectStores: newObjectStoreConfigs()}
	if err := parseStoreURL(c); err != nil {
		return nil, "", err
	}
	st, err := openStore(ctx, c)
	if err != nil {
		return nil, "", err
	}
	_, rest, _ := strings.Cut(url, "://")
	if !strings.Contains(url, "://") {
		rest = url
	}
	return st, path.Base(strings.TrimRight(rest, "/")), nil
}

// modelFiles lists the files of a folder that a signature covers (all but OMS's ignored ones),
// each read at the version it had when listed.
func modelFiles(ctx context.Context, st store.Store) ([]oms.FileSource, int64, error) {
	keys, err := st.List(ctx, "")
	if err != nil {
		return nil, 0, err
	}
	var files []oms.FileSource
	var total int64
	for _, k := range keys {
		if oms.DefaultIgnored(k) {
			continue
		}
		info, err := st.Stat(ctx, k)
		if err != nil {
			return nil, 0, fmt.Errorf("%s: %w", k, err)
		}
		files = append(files, oms.FileSource{Path: k, Size: info.Size,
			R: store.ReaderAt(ctx, st, k, info.Version)})
		total += info.Size
	}
	return files, total, nil
}

// counted wraps files' readers to draw their reads, from any goroutine, on b.
func counted(files []oms.FileSource, total int64, b *bar) []oms.FileSource {
	progress := b.progress()
	if progress == nil {
		return files
	}
	var done atomic.Int64
	var mu sync.Mutex
	out := make([]oms.FileSource, len(files))
	for i, f := range files {
		r := f.R
		f.R = readerFunc(func(p []byte, off int64) (int, error) {
			n, err := r.ReadAt(p, off)
			d := done.Add(int64(n))
			mu.Lock()
			progress(d, total)
			mu.Unlock()
			return n, err
		})
		out[i] = f
	}
	return out
}

type readerFunc func(p []byte, off int64) (int, error)

func (f readerFunc) ReadAt(p []byte, off int64) (int, error) { return f(p, off) }
