package verify_test

import (
	"bytes"
	"context"
	"crypto"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"sort"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/cluster"
	"github.com/shardsrv/shardsrv/internal/oms"
	"github.com/shardsrv/shardsrv/internal/s3reader"
	"github.com/shardsrv/shardsrv/internal/s3reader/s3test"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
	"github.com/shardsrv/shardsrv/internal/verify"
)

const shardSize = 4096

var ctx = context.Background()

func newKey(t *testing.T) crypto.Signer {
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	return k
}

// backend is a raw store and a way to write into it.
type backend struct {
	name string
	open func(t *testing.T) (store.Store, func(key string, data []byte))
}

var buckets atomic.Int64

func backends() []backend {
	return []backend{
		{"local", func(t *testing.T) (store.Store, func(string, []byte)) { return storetest.Local(t) }},
		{"s3", func(t *testing.T) (store.Store, func(string, []byte)) {
			g := s3test.Start(t)
			bucket := fmt.Sprintf("verify-%d", buckets.Add(1))
			g.CreateBucket(t, bucket)
			st, err := s3reader.New(ctx, s3reader.Config{Bucket: bucket, Endpoint: g.Endpoint})
			if err != nil {
				t.Fatal(err)
			}
			return st, func(key string, data []byte) { g.Put(t, bucket, key, data) }
		}},
	}
}

// publisher keeps the files of a folder and signs them, as a model publisher would.
type publisher struct {
	mu    sync.Mutex
	dir   string // the folder, "" for the store root
	files map[string][]byte
	put   func(string, []byte)
	key   crypto.Signer
	shard int64 // 0: shardSize
}

func (p *publisher) key2(name string) string {
	if p.dir == "" {
		return name
	}
	return p.dir + "/" + name
}

// write puts a file and signs the folder again.
func (p *publisher) write(t *testing.T, name string, data []byte) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.files[name] = data
	p.put(p.key2(name), data)
	p.sign(t)
}

func (p *publisher) sign(t *testing.T) {
	names := make([]string, 0, len(p.files))
	for n := range p.files {
		names = append(names, n)
	}
	sort.Strings(names)
	var srcs []oms.FileSource
	for _, n := range names {
		srcs = append(srcs, oms.FileSource{Path: n, Size: int64(len(p.files[n])), R: bytes.NewReader(p.files[n])})
	}
	shard := p.shard
	if shard == 0 {
		shard = shardSize
	}
	m, err := oms.BuildShards("model", srcs, shard)
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := oms.Sign(m, p.key)
	if err != nil {
		t.Fatal(err)
	}
	p.put(p.key2(oms.SignatureFile), bundle)
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*31>>3) ^ seed
	}
	return b
}

// A verifying store is a store: the conformance suite passes over it with every file signed, and
// verification changes no byte; over the local store it is a store.Sectioner, and passes its part.
func TestConformance(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			storetest.Run(t, storetest.Harness{New: func(t *testing.T) (store.Store, func(string, []byte)) {
				raw, put := b.open(t)
				key := newKey(t)
				p := &publisher{files: map[string][]byte{}, put: put, key: key}
				s := verify.New(raw, verify.ModeRequired, []crypto.PublicKey{key.Public()}, nil)
				return s.AsStore(), func(k string, d []byte) {
					p.write(t, k, d)
				}
			}})
		})
	}
}

// Every way stored bytes can differ from what was signed is refused: before the first byte where it
// can be known (Stat), at the read otherwise, and never with wrong bytes in the caller's buffer.
func TestTamper(t *testing.T) {
	for _, b := range backends() {
		t.Run(b.name, func(t *testing.T) {
			data := pattern(5*shardSize+100, 1)
			setup := func(t *testing.T, shard int64) (*verify.Store, *publisher, crypto.Signer) {
				raw, put := b.open(t)
				key := newKey(t)
				p := &publisher{dir: "m", files: map[string][]byte{}, put: put, key: key, shard: shard}
				p.write(t, "w.safetensors", data)
				p.write(t, "config.json", []byte(`{"a":1}`))
				return verify.New(raw, verify.ModeRequired, []crypto.PublicKey{key.Public()}, nil), p, key
			}
			read := func(s store.Store, off, n int64) ([]byte, error) {
				info, err := s.Stat(ctx, "m/w.safetensors")
				if err != nil {
					return nil, err
				}
				buf := make([]byte, n)
				return buf, s.ReadAt(ctx, "m/w.safetensors", info.Version, buf, off)
			}

			t.Run("intact", func(t *testing.T) {
				s, _, _ := setup(t, 0)
				for _, r := range [][2]int64{{0, int64(len(data))}, {1, 10}, {shardSize - 1, 2}, {int64(len(data)) - 7, 7}} {
					got, err := read(s, r[0], r[1])
					if err != nil || !bytes.Equal(got, data[r[0]:r[0]+r[1]]) {
						t.Fatalf("read %v: %v", r, err)
					}
				}
				if st := s.Stats(); st.VerifiedBytes == 0 || st.Failures != 0 {
					t.Errorf("stats %+v", st)
				}
			})
			t.Run("flipped bit", func(t *testing.T) {
				s, p, _ := setup(t, 0)
				bad := bytes.Clone(data)
				bad[3*shardSize+5] ^= 0x10
				p.put("m/w.safetensors", bad) // not re-signed
				if _, err := read(s, 3*shardSize, 10); !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("read of the damaged shard: %v, want ErrCorrupt", err)
				}
				if got, err := read(s, 0, shardSize); err != nil || !bytes.Equal(got, data[:shardSize]) {
					t.Errorf("an intact shard of the damaged file: %v", err)
				}
				if s.Stats().Failures == 0 {
					t.Error("the failure is counted")
				}
			})
			t.Run("truncated", func(t *testing.T) {
				s, p, _ := setup(t, 0)
				p.put("m/w.safetensors", data[:len(data)-1])
				if _, err := s.Stat(ctx, "m/w.safetensors"); !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("Stat of a truncated file: %v, want ErrCorrupt", err)
				}
			})
			t.Run("file of another signed model", func(t *testing.T) {
				s, p, key := setup(t, 0)
				other := &publisher{dir: "other", files: map[string][]byte{}, put: p.put, key: key}
				otherData := pattern(len(data), 9)
				other.write(t, "w.safetensors", otherData)
				p.put("m/w.safetensors", otherData)
				if _, err := read(s, 0, 100); !errors.Is(err, store.ErrCorrupt) {
					t.Errorf("a file swapped for another model's: %v, want ErrCorrupt", err)
				}
			})
			t.Run("untrusted key", func(t *testing.T) {
				s, p, _ := setup(t, 0)
				p.key = newKey(t)
				p.sign(t)
				if _, err := s.Stat(ctx, "m/w.safetensors"); !errors.Is(err, store.ErrUnverified) {
					t.Errorf("a signature by an untrusted key: %v, want ErrUnverified", err)
				}
			})
			t.Run("manifest of other files", func(t *testing.T) {
				s, p, _ := setup(t, 0)
				p.put("m/extra.bin", []byte("not signed"))
				if _, err := s.Stat(ctx, "m/extra.bin"); !errors.Is(err, store.ErrUnverified) {
					t.Errorf("a file the signature does not cover: %v, want ErrUnverified", err)
				}
			})
			t.Run("unsigned under required", func(t *testing.T) {
				raw, put := b.open(t)
				put("u/w.safetensors", data)
				s := verify.New(raw, verify.ModeRequired, []crypto.PublicKey{newKey(t).Public()}, nil)
				if _, err := s.Stat(ctx, "u/w.safetensors"); !errors.Is(err, store.ErrUnverified) {
					t.Errorf("an unsigned checkpoint under required: %v, want ErrUnverified", err)
				}
				lax := verify.New(raw, verify.ModeIfSigned, []crypto.PublicKey{newKey(t).Public()}, nil)
				if _, err := read(withPrefix{lax, "u"}, 0, 10); err != nil {
					t.Errorf("an unsigned checkpoint under if-signed is served as stored: %v", err)
				}
			})
			t.Run("shards reads cannot be aligned to", func(t *testing.T) {
				for _, shard := range []int64{2 * verify.MaxShardBytes, 3000} {
					s, _, _ := setup(t, shard)
					if _, err := s.Stat(ctx, "m/w.safetensors"); !errors.Is(err, store.ErrUnverified) {
						t.Errorf("%d-byte shards: %v, want ErrUnverified", shard, err)
					}
				}
			})
			t.Run("no bad chunk in the cache", func(t *testing.T) {
				s, p, _ := setup(t, 0)
				c, err := cache.New(s, cache.Config{Bytes: 64 * shardSize, ChunkBytes: 2 * shardSize}, nil)
				if err != nil {
					t.Fatal(err)
				}
				bad := bytes.Clone(data)
				bad[shardSize] ^= 1
				p.put("m/w.safetensors", bad)
				for range 2 {
					if _, err := read(c, shardSize, 8); !errors.Is(err, store.ErrCorrupt) {
						t.Fatalf("through the cache: %v, want ErrCorrupt", err)
					}
				}
				if st := c.Stats(); st.BytesFromCache != 0 || s.Stats().Failures < 2 {
					t.Errorf("a chunk that failed verification was cached: %+v", st)
				}
			})
			t.Run("the cache fills whole shards, each once", func(t *testing.T) {
				s, _, _ := setup(t, 0)
				const chunk = shardSize / 4
				// As serve stacks them: the cluster store between the cache and the verifier.
				ring, err := cluster.New(s, cluster.Options{ChunkBytes: chunk, Timeout: time.Second})
				if err != nil {
					t.Fatal(err)
				}
				c, err := cache.New(ring, cache.Config{Bytes: 64 * shardSize, ChunkBytes: chunk}, nil)
				if err != nil {
					t.Fatal(err)
				}
				for _, i := range mrand.Perm(len(data)/chunk + 1) {
					off := int64(i * chunk)
					n := min(chunk, int64(len(data))-off)
					if got, err := read(c, off, n); err != nil || !bytes.Equal(got, data[off:off+n]) {
						t.Fatalf("read [%d, +%d) through %d-byte chunks: %v", off, n, chunk, err)
					}
				}
				if v := s.Stats().VerifiedBytes; v != int64(len(data)) {
					t.Errorf("%d-byte chunks of %d-byte shards verified %d bytes of a %d-byte file: want each "+
						"shard read once", chunk, shardSize, v, len(data))
				}
			})
			t.Run("new signature is a new version", func(t *testing.T) {
				s, p, _ := setup(t, 0)
				before, _ := s.Stat(ctx, "m/w.safetensors")
				p.write(t, "config.json", []byte(`{"a":2}`))
				s.Revalidate = 0
				after, err := s.Stat(ctx, "m/w.safetensors")
				if err != nil || after.Version == before.Version {
					t.Fatalf("versions %q → %q (%v): chunks verified under one signature must not serve another",
						before.Version, after.Version, err)
				}
				buf := make([]byte, 4)
				if err := s.ReadAt(ctx, "m/w.safetensors", before.Version, buf, 0); !errors.Is(err, store.ErrChanged) {
					t.Errorf("a read at the old signature's version: %v, want ErrChanged", err)
				}
			})
		})
	}
}

// withPrefix reads keys of one folder by their names in it, so read() works on another folder.
type withPrefix struct {
	store.Store
	dir string
}

func (w withPrefix) Stat(ctx context.Context, key string) (store.Info, error) {
	return w.Store.Stat(ctx, w.dir+"/"+key[len("m/"):])
}

func (w withPrefix) ReadAt(ctx context.Context, key, version string, p []byte, off int64) error {
	return w.Store.ReadAt(ctx, w.dir+"/"+key[len("m/"):], version, p, off)
}

// A files manifest is checked once per file version, by one read of the whole file.
func TestFilesManifest(t *testing.T) {
	raw, put := storetest.Local(t)
	data := pattern(10_000, 3)
	key := newKey(t)
	m, err := oms.BuildFiles("model", []oms.FileSource{{Path: "w.bin", Size: int64(len(data)), R: bytes.NewReader(data)}})
	if err != nil {
		t.Fatal(err)
	}
	bundle, err := oms.Sign(m, key)
	if err != nil {
		t.Fatal(err)
	}
	put("m/w.bin", data)
	put("m/model.sig", bundle)
	s := verify.New(raw, verify.ModeRequired, []crypto.PublicKey{key.Public()}, nil)
	info, err := s.Stat(ctx, "m/w.bin")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	for range 3 {
		if err := s.ReadAt(ctx, "m/w.bin", info.Version, buf, 100); err != nil || !bytes.Equal(buf, data[100:110]) {
			t.Fatalf("read: %v", err)
		}
	}
	if got := s.Stats().VerifiedBytes; got != int64(len(data)) {
		t.Errorf("verified %d bytes, want the whole file once (%d)", got, len(data))
	}
	bad := bytes.Clone(data)
	bad[9000] ^= 4
	put("m/w.bin", bad)
	info, _ = s.Stat(ctx, "m/w.bin")
	if err := s.ReadAt(ctx, "m/w.bin", info.Version, buf, 0); !errors.Is(err, store.ErrCorrupt) {
		t.Errorf("a damaged file under a files manifest: %v, want ErrCorrupt", err)
	}
}
