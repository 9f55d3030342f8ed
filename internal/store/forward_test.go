package store_test

import (
	"context"
	"slices"
	"testing"

	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
)

// capable is a local store (a Sectioner) that is also an Aligner and a Splitter, with answers
// no default gives.
type capable struct{ *store.Local }

func (capable) Alignment(context.Context, string, string) int64 { return 4096 }
func (capable) Split(_, _ string, off int64) bool               { return off == 8192 }

// The forwarder passes every Store method and the Aligner's and Splitter's answers to the store
// below, answers as a store without them over one without them, and never offers sections.
func TestForwarder(t *testing.T) {
	local, put := storetest.Local(t)
	put("m/a", []byte("abcdef"))
	ctx := context.Background()
	f := store.Forwarder{Next: capable{local}}
	info, err := f.Stat(ctx, "m/a")
	if err != nil || info.Size != 6 {
		t.Fatalf("Stat = %+v, %v", info, err)
	}
	p := make([]byte, 3)
	if err := f.ReadAt(ctx, "m/a", info.Version, p, 2); err != nil || string(p) != "cde" {
		t.Errorf("ReadAt = %q, %v", p, err)
	}
	if keys, err := f.List(ctx, "m"); err != nil || !slices.Equal(keys, []string{"m/a"}) {
		t.Errorf("List = %v, %v", keys, err)
	}
	if err := f.Check(ctx); err != nil || f.String() != local.String() {
		t.Errorf("Check = %v, String = %q", err, f.String())
	}
	if a, s := f.Alignment(ctx, "m/a", info.Version), f.Split("m/a", info.Version, 8192); a != 4096 || !s {
		t.Errorf("over an Aligner and Splitter: Alignment %d, Split %v", a, s)
	}
	plain := store.Forwarder{Next: local}
	if a, s := plain.Alignment(ctx, "m/a", info.Version), plain.Split("m/a", info.Version, 8192); a != 1 || s {
		t.Errorf("over neither: Alignment %d, Split %v, want 1 and false", a, s)
	}
	if _, ok := any(f).(store.Sectioner); ok {
		t.Error("the forwarder offers the sections of the store below")
	}
}
