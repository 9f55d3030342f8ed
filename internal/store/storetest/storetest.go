// Package storetest is the conformance suite every store.Store passes: the local directory, S3,
// and every wrapper around them.
package storetest

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/shardsrv/shardsrv/internal/store"
)

// Harness builds a fresh, empty store and puts files into it.
type Harness struct {
	// New returns an empty store and a function that writes (or replaces) one file in it.
	New func(t *testing.T) (s store.Store, put func(key string, data []byte))
}

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i*7) + seed
	}
	return b
}

// Run runs the suite.
func Run(t *testing.T, h Harness) {
	ctx := context.Background()
	newStore := func(t *testing.T) (store.Store, func(string, []byte), []byte) {
		s, put := h.New(t)
		data := pattern(100_003, 1)
		put("ckpt/model.safetensors", data)
		put("ckpt/sub/a.bin", []byte("a"))
		put("other/b.bin", []byte("bb"))
		return s, put, data
	}

	t.Run("Stat", func(t *testing.T) {
		s, _, data := newStore(t)
		info, err := s.Stat(ctx, "ckpt/model.safetensors")
		if err != nil || info.Size != int64(len(data)) || info.Version == "" {
			t.Fatalf("Stat = %+v, %v", info, err)
		}
		if _, err := s.Stat(ctx, "ckpt/missing"); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Stat of a missing key: %v, want ErrNotFound", err)
		}
	})

	t.Run("ReadAt", func(t *testing.T) {
		s, _, data := newStore(t)
		info, _ := s.Stat(ctx, "ckpt/model.safetensors")
		reads := []struct{ off, n int64 }{{0, 8}, {0, int64(len(data))}, {12345, 777}, {int64(len(data)) - 3, 3}, {50, 0}}
		for _, r := range reads {
			for _, ver := range []string{"", info.Version} {
				p := make([]byte, r.n)
				if err := s.ReadAt(ctx, "ckpt/model.safetensors", ver, p, r.off); err != nil {
					t.Fatalf("ReadAt(%d, %d): %v", r.off, r.n, err)
				}
				if !bytes.Equal(p, data[r.off:r.off+r.n]) {
					t.Errorf("ReadAt(%d, %d) returned other bytes", r.off, r.n)
				}
			}
		}
	})

	t.Run("OutOfRange", func(t *testing.T) {
		s, _, data := newStore(t)
		for _, off := range []int64{int64(len(data)) - 2, int64(len(data)) + 10} {
			if err := s.ReadAt(ctx, "ckpt/model.safetensors", "", make([]byte, 4), off); !errors.Is(
				err,
				store.ErrOutOfRange,
			) {
				t.Errorf("ReadAt past the end at %d: %v, want ErrOutOfRange", off, err)
			}
		}
	})

	t.Run("NotFound", func(t *testing.T) {
		s, _, _ := newStore(t)
		if err := s.ReadAt(ctx, "nope/model.safetensors", "", make([]byte, 1), 0); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("ReadAt of a missing key: %v, want ErrNotFound", err)
		}
	})

	t.Run("InvalidKeys", func(t *testing.T) {
		s, _, _ := newStore(t)
		long := strings.Repeat("a", store.MaxSegmentBytes+1)
		deep := strings.Repeat("d/", store.MaxKeyBytes/2) + "x"
		bad := []string{"", "/etc/passwd", "../x", "ckpt/../../x", "ckpt//model.safetensors",
			"ckpt/./model.safetensors", "ckpt/a b", `ckpt\x`, "ckpt/" + long, deep}
		for _, key := range bad {
			if _, err := s.Stat(ctx, key); !errors.Is(err, store.ErrInvalidKey) {
				t.Errorf("Stat(%q): %v, want ErrInvalidKey", key, err)
			}
			if err := s.ReadAt(ctx, key, "", make([]byte, 1), 0); !errors.Is(err, store.ErrInvalidKey) {
				t.Errorf("ReadAt(%q): %v, want ErrInvalidKey", key, err)
			}
		}
	})

	t.Run("Changed", func(t *testing.T) {
		s, put, data := newStore(t)
		info, _ := s.Stat(ctx, "ckpt/model.safetensors")
		put("ckpt/model.safetensors", pattern(len(data)+1, 9))
		if err := s.ReadAt(ctx, "ckpt/model.safetensors", info.Version, make([]byte, 4), 0); !errors.Is(
			err,
			store.ErrChanged,
		) {
			t.Errorf("ReadAt of a replaced file with its old version: %v, want ErrChanged", err)
		}
		now, err := s.Stat(ctx, "ckpt/model.safetensors")
		if err != nil || now.Version == info.Version || now.Size != int64(len(data)+1) {
			t.Errorf("Stat after replace = %+v, %v", now, err)
		}
	})

	t.Run("List", func(t *testing.T) {
		s, _, _ := newStore(t)
		all, err := s.List(ctx, "")
		if err != nil || !slices.Equal(all, []string{"ckpt/model.safetensors", "ckpt/sub/a.bin", "other/b.bin"}) {
			t.Errorf("List(\"\") = %v, %v", all, err)
		}
		sub, err := s.List(ctx, "ckpt")
		if err != nil || !slices.Equal(sub, []string{"ckpt/model.safetensors", "ckpt/sub/a.bin"}) {
			t.Errorf("List(ckpt) = %v, %v", sub, err)
		}
		none, err := s.List(ctx, "missing")
		if err != nil || len(none) != 0 {
			t.Errorf("List(missing) = %v, %v", none, err)
		}
	})

	t.Run("Canceled", func(t *testing.T) {
		s, _, _ := newStore(t)
		cctx, cancel := context.WithCancel(ctx)
		cancel()
		if err := s.ReadAt(cctx, "ckpt/model.safetensors", "", make([]byte, 4), 0); !errors.Is(err, context.Canceled) {
			t.Errorf("ReadAt with a canceled context: %v, want context.Canceled", err)
		}
	})

	t.Run("Check", func(t *testing.T) {
		s, _, _ := newStore(t)
		if err := s.Check(ctx); err != nil {
			t.Errorf("Check: %v", err)
		}
	})

	t.Run("ParallelReads", func(t *testing.T) {
		s, _, data := newStore(t)
		var wg sync.WaitGroup
		errs := make(chan error, 32)
		for g := range 32 {
			wg.Go(func() {
				off := int64(g * 3001)
				p := make([]byte, 2048)
				if err := s.ReadAt(ctx, "ckpt/model.safetensors", "", p, off); err != nil {
					errs <- err
					return
				}
				if !bytes.Equal(p, data[off:off+2048]) {
					errs <- fmt.Errorf("reader %d got other bytes", g)
				}
			})
		}
		wg.Wait()
		close(errs)
		for err := range errs {
			t.Error(err)
		}
	})

	t.Run("Section", func(t *testing.T) { section(t, newStore) })
}

// section checks Sectioner, for a store that has it (or wraps one that does): a section writes
// exactly its ranges, in order; a changed file, a missing key and a range past the end fail
// before anything is written.
func section(t *testing.T, newStore func(*testing.T) (store.Store, func(string, []byte), []byte)) {
	ctx := context.Background()
	s, put, data := newStore(t)
	sc, ok := s.(store.Sectioner)
	if !ok {
		t.Skip("not a store.Sectioner")
	}
	info, _ := s.Stat(ctx, "ckpt/model.safetensors")
	ranges := []store.Range{{Offset: 12345, Length: 70_000}, {Offset: 3, Length: 5}, {Offset: 99_000, Length: 0},
		{Offset: int64(len(data)) - 1, Length: 1}}
	sec, err := sc.Section(ctx, "ckpt/model.safetensors", info.Version, ranges)
	if err != nil {
		t.Fatalf("Section: %v", err)
	}
	var want, got bytes.Buffer
	for _, r := range ranges {
		want.Write(data[r.Offset : r.Offset+r.Length])
	}
	n, err := sec.WriteTo(&got)
	sec.Close()
	if err != nil || n != int64(want.Len()) || !bytes.Equal(got.Bytes(), want.Bytes()) {
		t.Errorf("WriteTo wrote %d bytes (%v), want the %d bytes of the ranges", n, err, want.Len())
	}
	for _, c := range []struct {
		key    string
		ranges []store.Range
		want   error
	}{
		{"nope/model.safetensors", ranges[:1], store.ErrNotFound},
		{"ckpt/model.safetensors", []store.Range{{Offset: int64(len(data)) - 2, Length: 4}}, store.ErrOutOfRange},
	} {
		if sec, err := sc.Section(ctx, c.key, info.Version, c.ranges); !errors.Is(err, c.want) {
			if err == nil {
				sec.Close()
			}
			t.Errorf("Section(%q, %v): %v, want %v", c.key, c.ranges, err, c.want)
		}
	}
	put("ckpt/model.safetensors", pattern(len(data), 5))
	if sec, err := sc.Section(ctx, "ckpt/model.safetensors", info.Version, ranges); !errors.Is(err, store.ErrChanged) {
		if err == nil {
			sec.Close()
		}
		t.Errorf("Section of a replaced file with its old version: %v, want ErrChanged", err)
	}
}
