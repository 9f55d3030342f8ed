package planner

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// Merging coalesced runs into a union one at a time, as share does, covers every byte of every run
// with one read of the union, in file and offset order; and where the cost model caps no over-read
// (merging depends on gaps alone) it gives what coalescing all the runs at once gives.
func TestMergingRunsIsCoalescingThemAll(t *testing.T) {
	rng := rand.New(rand.NewPCG(7, 11))
	for trial := range 2000 {
		opts := Options{MaxGap: rng.Int64N(64), MaxOverread: []int64{1, 2, 1 << 40}[trial%3]}
		var all, union, next []Read
		for range 1 + rng.IntN(6) {
			run := make([]Read, rng.IntN(12))
			for i := range run {
				n := 1 + rng.Int64N(40)
				run[i] = Read{Key: []string{"a", "b"}[rng.IntN(2)], Offset: rng.Int64N(600), Length: n,
					Needed: 1 + rng.Int64N(n)}
			}
			all = append(all, run...)
			run = coalesce(run, opts)
			next = mergeSorted(mergeRuns(next[:0], union, run), opts)
			union, next = next, union
		}
		if !slices.IsSortedFunc(union, byFileOffset) {
			t.Fatalf("trial %d: the union is out of order: %+v", trial, union)
		}
		for i := 1; i < len(union); i++ {
			if a, b := union[i-1], union[i]; a.Key == b.Key && a.Offset+a.Length >= b.Offset {
				t.Fatalf("trial %d: %+v and %+v overlap or touch", trial, a, b)
			}
		}
		for _, r := range all {
			if !slices.ContainsFunc(union, func(u Read) bool {
				return u.Key == r.Key && u.Offset <= r.Offset && r.Offset+r.Length <= u.Offset+u.Length
			}) {
				t.Fatalf("trial %d: %+v is in no read of the union %+v", trial, r, union)
			}
		}
		if opts.MaxOverread == 1<<40 {
			want := coalesce(slices.Clone(all), opts)
			if !slices.EqualFunc(union, want, func(a, b Read) bool {
				return a.Key == b.Key && a.Offset == b.Offset && a.Length == b.Length
			}) {
				t.Fatalf("trial %d: merged %+v, coalesced at once %+v", trial, union, want)
			}
		}
	}
}
