package checkpoint

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/store"
)

// An outage lasts from the first failed check of a run of them; a check that answers ends it, and
// the next failure starts a new one.
func TestReachabilityCountsFromTheFirstFailedCheck(t *testing.T) {
	var st reachability
	t0 := time.Unix(1000, 0)
	down := errors.New("connection refused")
	for _, step := range []struct {
		err  error
		at   time.Duration
		want time.Duration
	}{
		{nil, 0, 0},
		{down, 10 * time.Second, 0},
		{down, 25 * time.Second, 15 * time.Second},
		{down, 40 * time.Second, 30 * time.Second},
		{nil, 41 * time.Second, 0},
		{down, 50 * time.Second, 0},
		{down, 52 * time.Second, 2 * time.Second},
	} {
		if got := st.observe(step.err, t0.Add(step.at)); got != step.want {
			t.Fatalf("at %v (%v): down for %v, want %v", step.at, step.err, got, step.want)
		}
	}
}

// checkStore is a store whose Check answers err.
type checkStore struct {
	store.Forwarder
	err error
}

func (s *checkStore) Check(context.Context) error { return s.err }

// Check answers what the store answers, and Reachable remembers it.
func TestCheckRemembersWhetherTheStoreAnswered(t *testing.T) {
	local, err := store.NewLocal(t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	st := &checkStore{Forwarder: store.Forwarder{Next: local}}
	c := New(st)
	if !c.Reachable() {
		t.Fatal("a catalog never checked is not reachable")
	}
	st.err = errors.New("no route to host")
	if _, err := c.Check(context.Background()); !errors.Is(err, st.err) {
		t.Fatalf("Check over a store that fails: %v", err)
	}
	if c.Reachable() {
		t.Fatal("reachable after a failed check")
	}
	st.err = nil
	if down, err := c.Check(context.Background()); err != nil || down != 0 {
		t.Fatalf("Check over a store that answers: down %v, %v", down, err)
	}
	if !c.Reachable() {
		t.Fatal("unreachable after a check that answered")
	}
}
