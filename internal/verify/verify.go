// Package verify is the store decorator that checks every byte read from storage against the
// publisher's OpenSSF Model Signing signature (docs/signing.md) before anyone uses it.
//
// A checkpoint folder is signed when it (or a folder above it) holds model.sig, a key-signed
// Sigstore bundle whose statement lists the SHA-256 of every file (method "files") or of every
// fixed-size range of every file (method "shards"). The decorator finds the signature of a key by
// walking up its folders, verifies it with the trusted keys once per signature version, and then:
//
//   - Stat fails, before anyone reads a byte, for a file the signature does not cover, a file whose
//     size is not the signed size (a truncated upload), a signature that does not verify, shards
//     the reads cannot be aligned to (MaxShardBytes), and an unsigned checkpoint under ModeRequired. The version
//     Stat returns names the signature too, so a new signature is a new version: the cache above
//     never serves chunks verified under another one.
//   - ReadAt widens a read to whole signed shards, hashes each and compares before copying a byte
//     into the caller's buffer; a mismatch is store.ErrCorrupt naming the file and range. The
//     cache above fills whole shards (store.Aligner), so it reads each once however small its
//     chunks, and what it holds was verified when it was filled: hits are not hashed again.
//   - A "files" manifest is checked once per file version on first use, by one read of the whole
//     file (the slow path); the verdict is kept and every read of that version then passes.
//   - Over files on this host (a store.Sectioner below), a shard that hashed as signed keeps that
//     verdict for the file's version (verdicts.go), and later reads of it are not hashed again:
//     ReadAt reads just the bytes asked for, and Section (AsStore) sends them from the file, by
//     sendfile to a socket. The first Section of a shard reads and hashes it before the section
//     is made. The verdict trusts the local store's version (size, mtime, ctime, inode), which
//     every write changes; over an object store, whose storage the signature does not trust,
//     every read is hashed.
package verify

import (
	"context"
	"crypto"
	"encoding/hex"
	"errors"
	"flag"
	"fmt"
	"os"
	"path"
	"slices"
	"strings"
	"sync/atomic"
	"time"

	lru "github.com/hashicorp/golang-lru/v2"
	"go.opentelemetry.io/otel/metric"
	"golang.org/x/sync/singleflight"

	"github.com/shardsrv/shardsrv/internal/oms"
	"github.com/shardsrv/shardsrv/internal/store"
)

// Mode says which checkpoints are verified.
type Mode string

// The modes.
const (
	ModeOff      Mode = "off"       // nothing is checked
	ModeIfSigned Mode = "if-signed" // checkpoints with a model.sig are verified, others served as stored
	ModeRequired Mode = "required"  // a checkpoint without a valid signature is refused
)

// signatureMemoryFactor is the memory verifying a model.sig takes, as a multiple of its length: the
// bytes, and the 6 times them oms.Verify allocates decoding the envelope, the statement and the
// manifest (measured on a 204 MB signature of a million shards).
const signatureMemoryFactor = 7

// MaxSignatureBytes bounds the model.sig read. A statement lists about 200 bytes per shard (base64
// in the envelope): a 685 GB model in 1 MiB shards signs into about 140 MB.
const MaxSignatureBytes = 256 << 20

// MaxShardBytes bounds the shard size reads are widened to, so a small read never buys a large
// one. Shards must also be a power of two, as cache chunks and the cluster's 4 MiB stripes are:
// then a shard is a whole number of chunks or a part of one, and lies in one stripe, so the cache
// reads it once and one owner reads it. Checkpoints signed otherwise are refused.
const MaxShardBytes = 4 << 20

// ShardSizeOK reports whether checkpoints signed in shards of n bytes can be served (MaxShardBytes).
func ShardSizeOK(n int64) bool { return n > 0 && n <= MaxShardBytes && n&(n-1) == 0 }

// Config is the verification settings.
type Config struct {
	Mode     Mode     // zero: ModeIfSigned
	KeyFiles []string // PEM public keys (PKIX): ECDSA P-256/P-384/P-521 or Ed25519
}

// RegisterFlags registers --verify and --trust-key on fs.
func (c *Config) RegisterFlags(fs *flag.FlagSet) {
	c.Mode = ModeIfSigned
	fs.Func("verify", "which checkpoints are verified against their model.sig: required, if-signed or off "+
		"(default if-signed; without --trust-key nothing can be verified and if-signed serves as stored)",
		func(v string) error {
			switch m := Mode(v); m {
			case ModeOff, ModeIfSigned, ModeRequired:
				c.Mode = m
				return nil
			}
			return fmt.Errorf("%q is not required, if-signed or off", v)
		})
	fs.Func("trust-key", "`FILE` holding a PEM public key whose signatures are trusted (repeatable; "+
		"a comma-separated list in SHARDSRV_TRUST_KEY)", func(v string) error {
		for _, f := range strings.Split(v, ",") {
			if f = strings.TrimSpace(f); f != "" {
				c.KeyFiles = append(c.KeyFiles, f)
			}
		}
		return nil
	})
}

// Validate reports settings that cannot verify anything they promise to.
func (c *Config) Validate() error {
	if c.Mode == ModeRequired && len(c.KeyFiles) == 0 {
		return errors.New("--verify required needs at least one --trust-key")
	}
	return nil
}

// Keys reads the trusted keys.
func (c *Config) Keys() ([]crypto.PublicKey, error) {
	keys := make([]crypto.PublicKey, 0, len(c.KeyFiles))
	for _, f := range c.KeyFiles {
		data, err := os.ReadFile(f)
		if err != nil {
			return nil, fmt.Errorf("--trust-key: %w", err)
		}
		k, err := oms.ParsePublicKeyPEM(data)
		if err != nil {
			return nil, fmt.Errorf("--trust-key %s: %w", f, err)
		}
		keys = append(keys, k)
	}
	return keys, nil
}

// Stats are the verification counters since the store started.
type Stats struct {
	VerifiedBytes int64 // bytes hashed and found as signed
	Failures      int64 // reads refused because bytes did not match
	HashNanos     int64 // time spent hashing
}

// Store verifies what it reads from the store it wraps.
type Store struct {
	// Forwarder is the store below, read and hashed; Check and its splits pass to it.
	store.Forwarder
	mode Mode
	keys []crypto.PublicKey
	// Revalidate is how long a folder's signature (or its absence) is trusted before storage is
	// asked again.
	Revalidate time.Duration
	// Reserve, when set, holds a model.sig's memory against the process's budget while it is read
	// and verified (signatureMemoryFactor times its length), waiting or failing as the budget
	// does (budget.Budget.Reserve).
	Reserve func(ctx context.Context, n int64) (release func(n int64), err error)

	signatures *lru.Cache[string, *signature] // folder → its model.sig, verified
	verdicts   *verdicts
	keepShards bool // whether shard verdicts are kept: the store wrapped reads files on this host
	group      singleflight.Group

	verified, failures, hashNanos atomic.Int64
}

var (
	_ store.Store     = (*Store)(nil)
	_ store.Aligner   = (*Store)(nil)
	_ store.Sectioner = (*SectionStore)(nil)
)

// AsStore is the store to read through: s, or over a store.Sectioner (files on this host) a
// *SectionStore, which sends shards by the store wrapped once they are found intact.
func (s *Store) AsStore() store.Store {
	if sc, ok := s.Next.(store.Sectioner); ok {
		return &SectionStore{Store: s, next: sc}
	}
	return s
}

// SectionStore is Store over a store.Sectioner, and one itself: a section's shards are hashed
// once per file version, and the bytes are then sent from the file (by sendfile to a socket)
// instead of through memory.
type SectionStore struct {
	*Store
	next store.Sectioner
}

// Section implements store.Sectioner: the shards under ranges that have no verdict yet are read
// and hashed now, and a mismatch fails the section before a byte is written.
func (s *SectionStore) Section(ctx context.Context, key, version string, ranges []store.Range) (store.Section, error) {
	t, pass, err := s.target(ctx, key, version)
	if err != nil {
		return nil, err
	}
	if !pass {
		if err := s.checkRanges(ctx, key, t, ranges); err != nil {
			return nil, err
		}
	}
	return s.next.Section(ctx, key, t.fileVersion, ranges)
}

// SectionMemory implements store.Sectioner. The shards hashed in Section are charged while they
// are (Reserve): a section holds nothing once it is made.
func (s *SectionStore) SectionMemory(n int64) int64 { return s.next.SectionMemory(n) }

// checkBytes bounds one read of shards to hash in checkRanges: enough for the cores to share
// (Manifest.Check hashes a read's shards in parallel), little to hold.
const checkBytes = 8 << 20

// checkRanges hashes the shards under ranges that have no verdict, a run of consecutive ones a
// read of at most checkBytes, each held against the budget while it is hashed.
func (s *Store) checkRanges(ctx context.Context, key string, t target, ranges []store.Range) error {
	m := t.sig.manifest
	shard := m.ShardSize()
	size, _ := m.Size(t.file)
	var todo []int64
	for _, r := range ranges {
		off2, n2, err := m.Align(t.file, r.Offset, r.Length)
		if err != nil {
			return fmt.Errorf("%w: %s: %v", store.ErrOutOfRange, key, err)
		}
		if n2 > 0 {
			todo = append(todo, s.verdicts.unchecked(t.id, off2/shard, (off2+n2-1)/shard)...)
		}
	}
	slices.Sort(todo)
	todo = slices.Compact(todo)
	for len(todo) > 0 {
		k := 1
		for k < len(todo) && todo[k] == todo[k-1]+1 && int64(k+1)*shard <= checkBytes {
			k++
		}
		off, end := todo[0]*shard, min((todo[k-1]+1)*shard, size)
		if err := s.reserved(ctx, end-off, func() error {
			return s.readChecked(ctx, key, t, make([]byte, end-off), off)
		}); err != nil {
			return err
		}
		todo = todo[k:]
	}
	return nil
}

// reserved runs fn holding n bytes against the budget, when there is one.
func (s *Store) reserved(ctx context.Context, n int64, fn func() error) error {
	if s.Reserve == nil {
		return fn()
	}
	release, err := s.Reserve(ctx, n)
	if err != nil {
		return err
	}
	defer release(n)
	return fn()
}

// signature is what a folder's model.sig said when it was last looked at.
type signature struct {
	at       time.Time
	found    bool
	version  string // the model.sig's store version
	manifest *oms.Manifest
	err      error // a signature that does not verify
	id       string
}

// New wraps inner (mode zero: ModeIfSigned). Unless it verifies nothing, its counters are instruments of mp (nil: none).
func New(inner store.Store, mode Mode, keys []crypto.PublicKey, mp metric.MeterProvider) *Store {
	if mode == "" {
		mode = ModeIfSigned
	}
	if len(keys) == 0 && mode == ModeIfSigned {
		mode = ModeOff
	}
	sigs, _ := lru.New[string, *signature](1024)
	s := &Store{Forwarder: store.Forwarder{Next: inner}, mode: mode, keys: keys, Revalidate: 5 * time.Second,
		signatures: sigs, verdicts: newVerdicts()}
	_, s.keepShards = inner.(store.Sectioner)
	s.observe(mp)
	return s
}

// Mode is the mode in effect: if-signed without keys is off.
func (s *Store) Mode() Mode { return s.mode }

// Stats returns the counters.
func (s *Store) Stats() Stats {
	return Stats{VerifiedBytes: s.verified.Load(), Failures: s.failures.Load(), HashNanos: s.hashNanos.Load()}
}

// List implements store.Store. Signatures are the decorator's own: they are not listed.
func (s *Store) List(ctx context.Context, prefix string) ([]string, error) {
	keys, err := s.Next.List(ctx, prefix)
	if s.mode == ModeOff {
		return keys, err
	}
	return slices.DeleteFunc(keys, func(k string) bool { return path.Base(k) == oms.SignatureFile }), err
}

// versionSep joins a file's version and its signature's id in the versions Stat returns.
const versionSep = "+oms:"

// Stat implements store.Store: the file's info once the signature vouches for it.
func (s *Store) Stat(ctx context.Context, key string) (store.Info, error) {
	info, err := s.Next.Stat(ctx, key)
	if err != nil || s.exempt(key) {
		return info, err
	}
	sig, file, err := s.signatureOf(ctx, key, false)
	if err == nil && sig != nil && s.admissible(sig.manifest, file, info.Size) != nil {
		sig, file, err = s.signatureOf(ctx, key, true) // the folder may have been signed anew since
	}
	if err != nil || sig == nil {
		return info, err
	}
	if err := s.admissible(sig.manifest, file, info.Size); err != nil {
		return store.Info{}, err
	}
	info.Version += versionSep + sig.id
	return info, nil
}

// ReadAt implements store.Store: p is filled only with bytes that hashed as signed, now or, for
// a local file, earlier at the same version (verdicts).
func (s *Store) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	if len(p) == 0 {
		fileVersion, _, _ := strings.Cut(version, versionSep)
		return s.Next.ReadAt(ctx, key, fileVersion, p, off)
	}
	t, pass, err := s.target(ctx, key, version)
	if err != nil {
		return err
	}
	if pass {
		return s.Next.ReadAt(ctx, key, t.fileVersion, p, off)
	}
	m := t.sig.manifest
	off2, n2, err := m.Align(t.file, off, int64(len(p)))
	if err != nil {
		return fmt.Errorf("%w: %s: %v", store.ErrOutOfRange, key, err)
	}
	if s.keepShards && t.id != "" && len(s.verdicts.unchecked(t.id, off2/m.ShardSize(), (off2+n2-1)/m.ShardSize())) == 0 {
		return s.Next.ReadAt(ctx, key, t.fileVersion, p, off)
	}
	buf := p
	if off2 != off || n2 != int64(len(p)) {
		buf = make([]byte, n2)
	}
	if err := s.readChecked(ctx, key, t, buf, off2); err != nil {
		return err
	}
	if &buf[0] != &p[0] {
		copy(p, buf[off-off2:])
	}
	return nil
}

// target is what the reads of one key at one version are checked against.
type target struct {
	version     string     // the version read at, as Stat returned it
	fileVersion string     // the version in the store wrapped
	sig         *signature // the signature that covers the file
	file        string     // the key relative to the signed folder
	id          string     // its verdicts' id; "" for a read at no version, which keeps none
}

// target finds what a read of key at version is checked against; pass is set when it is read
// as stored, with nothing (more) to check: the key is exempt, unsigned where that is allowed,
// ignored by its signature, or a files-manifest file that checked out whole.
func (s *Store) target(ctx context.Context, key, version string) (t target, pass bool, err error) {
	fileVersion, sigID, signed := strings.Cut(version, versionSep)
	t.version, t.fileVersion = version, fileVersion
	if s.exempt(key) {
		return t, true, nil
	}
	sig, file, err := s.signatureOf(ctx, key, false)
	if err != nil {
		return t, false, err
	}
	switch {
	case sig == nil && !signed:
		return t, true, nil
	case version != "" && (sig == nil || sigID != sig.id):
		return t, false, fmt.Errorf("%w: the signature of %s changed", store.ErrChanged, key)
	}
	if fileVersion != "" {
		t.id = verdictID(key, version)
	}
	t.sig, t.file = sig, file
	m := sig.manifest
	if !m.Covers(file) {
		if _, err := s.Next.Stat(ctx, key); err != nil || m.Ignored(file) {
			return t, err == nil, err
		}
		return t, false, fmt.Errorf("%w: the signature does not cover %s", store.ErrUnverified, key)
	}
	if m.Method() == oms.MethodFiles {
		return t, true, s.checkWhole(ctx, key, t, m)
	}
	return t, false, nil
}

// readChecked fills buf, whole signed shards from off, with bytes that hash as signed, and keeps
// the verdict where verdicts are kept.
func (s *Store) readChecked(ctx context.Context, key string, t target, buf []byte, off int64) error {
	if err := s.Next.ReadAt(ctx, key, t.fileVersion, buf, off); err != nil {
		return err
	}
	n := int64(len(buf))
	if err := s.check(key, t.version, off, n, func() error { return t.sig.manifest.Check(t.file, off, buf) }); err != nil {
		if now, _, rerr := s.signatureOf(ctx, key, true); rerr == nil && (now == nil || now.id != t.sig.id) {
			return fmt.Errorf("%w: the signature of %s changed", store.ErrChanged, key) // re-published
		}
		return err
	}
	if s.keepShards && t.id != "" {
		shard := t.sig.manifest.ShardSize()
		s.verdicts.markShards(t.id, off/shard, (off+n-1)/shard)
	}
	return nil
}

// Alignment implements store.Aligner: a sharded signature's shard size for the files it covers,
// the store below's alignment for the files it reads unverified.
func (s *Store) Alignment(ctx context.Context, key, version string) int64 {
	fileVersion, _, signed := strings.Cut(version, versionSep)
	if !signed || s.exempt(key) {
		return s.Forwarder.Alignment(ctx, key, fileVersion)
	}
	sig, file, err := s.signatureOf(ctx, key, false)
	if err != nil || sig == nil || sig.manifest.Method() != oms.MethodShards || !sig.manifest.Covers(file) {
		return 1
	}
	return sig.manifest.ShardSize()
}

// check runs a hash comparison of the n bytes of key at off, counting it, and turns a mismatch
// into a CorruptError naming them.
func (s *Store) check(key, version string, off, n int64, compare func() error) error {
	start := time.Now()
	err := compare()
	s.hashNanos.Add(int64(time.Since(start)))
	if errors.Is(err, oms.ErrMismatch) {
		s.failures.Add(1)
		return &store.CorruptError{Key: key, Version: version, Offset: off, Length: n, Err: err}
	}
	if err != nil {
		return err
	}
	s.verified.Add(n)
	return nil
}

// checkWhole verifies a files-manifest file once per version: one read of all of it.
func (s *Store) checkWhole(ctx context.Context, key string, t target, m *oms.Manifest) error {
	if t.id != "" && s.verdicts.whole(t.id) {
		return nil
	}
	_, err, _ := s.group.Do("whole:"+verdictID(key, t.fileVersion)+versionSep+t.sig.id, func() (any, error) {
		info, err := s.Next.Stat(ctx, key)
		if err != nil {
			return nil, err
		}
		r := store.ReaderAt(context.WithoutCancel(ctx), s.Next, key, t.fileVersion)
		if err := s.check(key, t.version, 0, info.Size, func() error { return m.CheckFile(t.file, r, info.Size) }); err != nil {
			return nil, err
		}
		if t.id != "" {
			s.verdicts.markWhole(t.id)
		}
		return nil, nil
	})
	return err
}

// exempt is what the decorator passes through unverified: the signature itself, which is
// verified as a signature, and everything when verification is off.
func (s *Store) exempt(key string) bool {
	return s.mode == ModeOff || path.Base(key) == oms.SignatureFile
}

// admissible checks, before any data is read, that file can be served verified.
func (s *Store) admissible(m *oms.Manifest, file string, size int64) error {
	if !m.Covers(file) {
		if m.Ignored(file) {
			return nil // the publisher chose not to sign it (.gitattributes and kin)
		}
		return fmt.Errorf("%w: the signature does not cover %s", store.ErrUnverified, file)
	}
	if m.Method() == oms.MethodFiles {
		return nil
	}
	if err := m.CheckSize(file, size); err != nil {
		s.failures.Add(1)
		return fmt.Errorf("%w: %v", store.ErrCorrupt, err)
	}
	if shard := m.ShardSize(); !ShardSizeOK(shard) {
		return fmt.Errorf("%w: signed in %d-byte shards, not a power of two up to %d: re-sign with "+
			"shardsrv sign --shard-size (1 MiB by default)", store.ErrUnverified, shard, MaxShardBytes)
	}
	return nil
}

// signatureOf finds the signature that covers key, walking up its folders, and the key's path
// relative to the signed folder. nil without one (not under ModeRequired). A signature is looked
// at again when it is older than Revalidate, or at once when reload is set.
func (s *Store) signatureOf(ctx context.Context, key string, reload bool) (*signature, string, error) {
	for dir := path.Dir(key); ; dir = path.Dir(dir) {
		sig, err := s.signatureIn(ctx, dir, reload)
		if err != nil {
			return nil, "", err
		}
		if sig.found {
			if sig.err != nil {
				return nil, "", sig.err
			}
			rel := key
			if dir != "." {
				rel = strings.TrimPrefix(key, dir+"/")
			}
			return sig, rel, nil
		}
		if dir == "." {
			break
		}
	}
	if s.mode == ModeRequired {
		return nil, "", fmt.Errorf("%w: %s has no %s in its folder or above it, and --verify is required",
			store.ErrUnverified, key, oms.SignatureFile)
	}
	return nil, "", nil
}

// signatureIn is folder dir's signature, read and verified once per version.
func (s *Store) signatureIn(ctx context.Context, dir string, reload bool) (*signature, error) {
	sig, ok := s.signatures.Get(dir)
	if ok && !reload && time.Since(sig.at) < s.Revalidate {
		return sig, nil
	}
	v, err, _ := s.group.Do("sig:"+dir, func() (any, error) {
		return s.loadSignature(context.WithoutCancel(ctx), dir, sig)
	})
	if err != nil {
		return nil, err
	}
	return v.(*signature), nil
}

func (s *Store) loadSignature(ctx context.Context, dir string, prev *signature) (*signature, error) {
	key := oms.SignatureFile
	if dir != "." {
		key = dir + "/" + key
	}
	info, err := s.Next.Stat(ctx, key)
	now := time.Now()
	switch {
	case errors.Is(err, store.ErrNotFound):
		sig := &signature{at: now}
		s.signatures.Add(dir, sig)
		return sig, nil
	case err != nil:
		return nil, err
	case prev != nil && prev.found && prev.version == info.Version:
		sig := *prev
		sig.at = now
		s.signatures.Add(dir, &sig)
		return &sig, nil
	case info.Size > MaxSignatureBytes:
		return nil, fmt.Errorf("%w: %s is %d bytes, more than the %d a signature may have",
			store.ErrUnverified, key, info.Size, MaxSignatureBytes)
	}
	sig := &signature{at: now, found: true, version: info.Version}
	if err := s.reserved(ctx, info.Size*signatureMemoryFactor, func() error {
		data := make([]byte, info.Size)
		if err := s.Next.ReadAt(ctx, key, info.Version, data, 0); err != nil {
			return err
		}
		var err error
		if sig.manifest, err = oms.Verify(data, s.keys); err != nil {
			sig.err = fmt.Errorf("%w: %s: %v", store.ErrUnverified, key, err)
		} else {
			subject := sig.manifest.SubjectDigest()
			sig.id = hex.EncodeToString(subject[:8])
		}
		return nil
	}); err != nil {
		return nil, err
	}
	s.signatures.Add(dir, sig)
	return sig, nil
}
