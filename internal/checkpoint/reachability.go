package checkpoint

import (
	"context"
	"sync"
	"time"
)

// reachability is what the last Check learned of the store: since when it has been unreachable
// (zero while reachable) and why.
type reachability struct {
	mu        sync.Mutex
	downSince time.Time
	err       error
}

// observe records a check's outcome and returns how long the store has been unreachable.
func (st *reachability) observe(err error, now time.Time) time.Duration {
	st.mu.Lock()
	defer st.mu.Unlock()
	st.err = err
	if err == nil {
		st.downSince = time.Time{}
		return 0
	}
	if st.downSince.IsZero() {
		st.downSince = now
	}
	return now.Sub(st.downSince)
}

// Check asks whether the store can be read at all (readiness) and remembers the answer: nil, or
// why not and for how long the store has been unreachable, since the first of the failed checks
// in a row.
func (c *Catalog) Check(ctx context.Context) (down time.Duration, err error) {
	err = c.store.Check(ctx)
	return c.reach.observe(err, time.Now()), err
}

// Reachable reports whether the store answered the last Check (true before the first).
func (c *Catalog) Reachable() bool {
	c.reach.mu.Lock()
	defer c.reach.mu.Unlock()
	return c.reach.err == nil
}
