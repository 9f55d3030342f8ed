package verify_test

import (
	"bytes"
	"crypto"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"testing"

	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
	"github.com/shardsrv/shardsrv/internal/verify"
)

// Over a local file, reads and sections of random ranges, between random damage to the file
// (never re-signed) and repairs, against a brute-force model: a read succeeds exactly when every
// signed shard under it holds its signed bytes now, with exactly the file's bytes, and the bytes
// hashed are exactly those of shards without a verdict for the file's version — a repair is a new
// version, which starts with none.
func TestVerdictsAgainstBruteForce(t *testing.T) {
	for seed := range uint64(8) {
		t.Run(fmt.Sprint(seed), func(t *testing.T) {
			rng := mrand.New(mrand.NewPCG(seed, 24))
			raw, put := storetest.Local(t)
			key := newKey(t)
			size := (3+rng.IntN(10))*shardSize + rng.IntN(shardSize)
			signed := pattern(size, byte(seed))
			p := &publisher{dir: "m", files: map[string][]byte{}, put: put, key: key}
			p.write(t, "w.safetensors", signed)
			v := verify.New(raw, verify.ModeRequired, []crypto.PublicKey{key.Public()}, nil)
			s := v.AsStore()
			sc, ok := s.(store.Sectioner)
			if !ok {
				t.Fatal("over the local store, AsStore is a store.Sectioner")
			}
			shards := (size + shardSize - 1) / shardSize
			current := bytes.Clone(signed)
			intact := func(i int) bool {
				end := min((i+1)*shardSize, size)
				return bytes.Equal(current[i*shardSize:end], signed[i*shardSize:end])
			}
			vouched := make([]bool, shards) // the model's verdicts for the current version
			shardBytes := func(i int) int64 { return int64(min((i+1)*shardSize, size) - i*shardSize) }
			var hashed, failures int64

			for op := range 300 {
				if rng.IntN(8) == 0 {
					if rng.IntN(2) == 0 {
						current[rng.IntN(size)] ^= byte(1 + rng.IntN(255))
					} else {
						copy(current, signed)
					}
					put("m/w.safetensors", bytes.Clone(current))
					clear(vouched)
					continue
				}
				info, err := s.Stat(ctx, "m/w.safetensors")
				if err != nil {
					t.Fatalf("op %d: Stat: %v", op, err)
				}
				ranges := make([]store.Range, 1+rng.IntN(3))
				for i := range ranges {
					off := rng.IntN(size)
					ranges[i] = store.Range{Offset: int64(off), Length: int64(rng.IntN(min(size-off, 3*shardSize) + 1))}
				}
				var under []int // the shards under the ranges, in order, once each
				seen := map[int]bool{}
				for _, r := range ranges {
					if r.Length == 0 {
						continue
					}
					for i := int(r.Offset) / shardSize; i <= int(r.Offset+r.Length-1)/shardSize; i++ {
						if !seen[i] {
							under = append(under, i)
							seen[i] = true
						}
					}
				}
				var got []byte
				if rng.IntN(2) == 0 || len(ranges) > 1 {
					got, err = sectionOf(sc, info.Version, ranges)
					// Model: runs of consecutive shards without a verdict, in order, each read and
					// hashed whole; the first with a damaged shard fails the section.
					todo := []int{}
					for i := range shards {
						if seen[i] && !vouched[i] {
							todo = append(todo, i)
						}
					}
					for len(todo) > 0 {
						k := 1
						for k < len(todo) && todo[k] == todo[k-1]+1 {
							k++
						}
						run := todo[:k]
						bad := false
						for _, i := range run {
							bad = bad || !intact(i)
						}
						if bad {
							failures++
							break
						}
						for _, i := range run {
							vouched[i] = true
							hashed += shardBytes(i)
						}
						todo = todo[k:]
					}
				} else {
					r := ranges[0]
					got = make([]byte, r.Length)
					err = s.ReadAt(ctx, "m/w.safetensors", info.Version, got, r.Offset)
					// Model: a read under shards that all have a verdict is not hashed; any other
					// reads and hashes all of them.
					all := true
					for _, i := range under {
						all = all && vouched[i]
					}
					if !all {
						bad := false
						for _, i := range under {
							bad = bad || !intact(i)
						}
						if bad {
							failures++
						} else {
							for _, i := range under {
								vouched[i] = true
								hashed += shardBytes(i)
							}
						}
					}
				}
				ok := true
				for _, i := range under {
					ok = ok && intact(i)
				}
				var want []byte
				for _, r := range ranges {
					want = append(want, current[r.Offset:r.Offset+r.Length]...)
				}
				switch {
				case ok && (err != nil || !bytes.Equal(got, want)):
					t.Fatalf("op %d: ranges %v of intact shards: %v, or other bytes", op, ranges, err)
				case !ok && !errors.Is(err, store.ErrCorrupt):
					t.Fatalf("op %d: ranges %v over a damaged shard: %v, want ErrCorrupt", op, ranges, err)
				}
				if st := v.Stats(); st.VerifiedBytes != hashed || st.Failures != failures {
					t.Fatalf("op %d: hashed %d bytes with %d failures, want %d and %d", op,
						st.VerifiedBytes, st.Failures, hashed, failures)
				}
			}
		})
	}
}

// sectionOf writes a section of ranges out; nothing when it cannot be made.
func sectionOf(sc store.Sectioner, version string, ranges []store.Range) ([]byte, error) {
	sec, err := sc.Section(ctx, "m/w.safetensors", version, ranges)
	if err != nil {
		return nil, err
	}
	var b bytes.Buffer
	_, err = sec.WriteTo(&b)
	return b.Bytes(), errors.Join(err, sec.Close())
}

// Over an object store verdicts are not kept: a second read of the same bytes is hashed again.
func TestNoVerdictsOverObjectStores(t *testing.T) {
	raw, put := backends()[1].open(t)
	key := newKey(t)
	p := &publisher{dir: "m", files: map[string][]byte{}, put: put, key: key}
	data := pattern(3*shardSize, 7)
	p.write(t, "w.safetensors", data)
	v := verify.New(raw, verify.ModeRequired, []crypto.PublicKey{key.Public()}, nil)
	if _, ok := v.AsStore().(store.Sectioner); ok {
		t.Fatal("over an object store, AsStore is no store.Sectioner")
	}
	info, err := v.Stat(ctx, "m/w.safetensors")
	if err != nil {
		t.Fatal(err)
	}
	buf := make([]byte, 10)
	for range 2 {
		if err := v.ReadAt(ctx, "m/w.safetensors", info.Version, buf, shardSize); err != nil {
			t.Fatal(err)
		}
	}
	if got := v.Stats().VerifiedBytes; got != 2*shardSize {
		t.Errorf("two reads of one shard hashed %d bytes, want it hashed each time (%d)", got, 2*shardSize)
	}
}
