package budget_test

import (
	"context"
	"errors"
	"math/rand/v2"
	"testing"

	"github.com/shardsrv/shardsrv/internal/budget"
)

// The cache's share comes off what reservations share and is never counted as held; a reservation
// larger than the rest waits for all of it; a full budget refuses at once with no AdmitWait.
func TestShareAndReserve(t *testing.T) {
	if err := (&budget.Config{Bytes: 100, CacheBytes: 100}).Validate(); err == nil {
		t.Fatal("a share of the whole budget was taken")
	}
	b := budget.New(budget.Config{Bytes: 100, CacheBytes: 40})
	if b.Bytes() != 60 || b.Held() != 0 {
		t.Fatalf("after a share of 40 of 100: Bytes %d, Held %d; want 60, 0", b.Bytes(), b.Held())
	}
	release, err := b.Reserve(context.Background(), 1000)
	if err != nil || b.Held() != 60 {
		t.Fatalf("a reservation over the budget: %v, holding %d; want all 60", err, b.Held())
	}
	if _, err := b.Reserve(context.Background(), 1); !errors.Is(err, budget.ErrBusy) {
		t.Fatalf("a reservation from a spent budget: %v, want ErrBusy", err)
	}
	release(10)
	release(1000) // only what is left of the reservation comes back
	release(1)
	if b.Held() != 0 {
		t.Fatalf("%d bytes held after the reservation was given back", b.Held())
	}
}

// A Config left at zero is the default budget, no share taken.
func TestZeroConfigIsTheDefault(t *testing.T) {
	if b := budget.New(budget.Config{}); b.Bytes() != budget.DefaultBytes {
		t.Fatalf("a zero Config shares %d bytes, want DefaultBytes %d", b.Bytes(), budget.DefaultBytes)
	}
	if err := (&budget.Config{Bytes: -1}).Validate(); err == nil {
		t.Fatal("a negative budget was accepted")
	}
}

// A reservation that ends with its context says so, not ErrBusy.
func TestReserveEndsWithItsContext(t *testing.T) {
	b := budget.New(budget.Config{Bytes: 10, AdmitWait: budget.DefaultAdmitWait})
	if err := b.Acquire(context.Background(), 10); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := b.Reserve(ctx, 1); !errors.Is(err, context.Canceled) {
		t.Fatalf("a reservation under a canceled context: %v", err)
	}
	b.Release(10)
}

// Any sequence of reservations and partial releases gives every byte back once, whatever the
// amounts: Held is the sum of what is still reserved, against a count kept beside it.
func TestReleasesBalance(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	for range 200 {
		b := budget.New(budget.Config{Bytes: 1 + r.Int64N(1000)})
		type held struct {
			release func(int64)
			left    int64
		}
		var open []*held
		var want int64
		for range 50 {
			if len(open) == 0 || r.IntN(2) == 0 {
				n := r.Int64N(2*b.Bytes()) - 10 // some negative, some over the budget
				release, err := b.Reserve(context.Background(), n)
				if err != nil {
					if !errors.Is(err, budget.ErrBusy) || want+min(max(n, 0), b.Bytes()) <= b.Bytes() {
						t.Fatalf("Reserve(%d) with %d of %d held: %v", n, want, b.Bytes(), err)
					}
					continue
				}
				k := min(max(n, 0), b.Bytes())
				open = append(open, &held{release, k})
				want += k
			} else {
				h := open[r.IntN(len(open))]
				k := r.Int64N(h.left+2) - 1
				h.release(k)
				k = min(max(k, 0), h.left)
				h.left -= k
				want -= k
			}
			if b.Held() != want {
				t.Fatalf("Held %d, want %d", b.Held(), want)
			}
		}
	}
}
