package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"syscall"
	"time"

	"github.com/shardsrv/shardsrv/internal/store"
)

// The defaults of the tunables every object store has, for flags and for a Config left at zero.
const (
	defaultMaxInFlight = 64
	defaultReadTimeout = 30 * time.Second
	defaultRetryBudget = 60 * time.Second
	// refusedBudget is the part of the retry budget a refused connection gets: nothing listens at
	// the endpoint, which a restart mends in seconds or a wrong endpoint never does, so retrying
	// it for the whole budget only holds the request (and the clients that retry it) for a minute.
	refusedBudget = 2 * time.Second
)

// readerConfig is one store's policy and what its SDK knows about errors.
type readerConfig struct {
	// name names the store in errors, without secrets.
	name string
	Tunables
	// transient reports errors worth another attempt, by the SDK's own classification (throttling,
	// 5xx, resets). Attempts that timed out and bodies that broke off are retried regardless.
	transient func(error) bool
	// classify wraps an error in the store sentinel it stands for, with a short reason; errors
	// that stand for none are returned as they are.
	classify func(error) error
}

// reader runs one store's requests under its policy. It is safe for concurrent use.
type reader struct {
	cfg   readerConfig
	slots chan struct{}
}

// newReader builds a reader; zero tunables take the defaults.
func newReader(cfg readerConfig) *reader {
	cfg.Tunables = cfg.Tunables.WithDefaults()
	return &reader{cfg: cfg, slots: make(chan struct{}, cfg.MaxInFlight)}
}

// opener opens a ranged body of n bytes at off of one object, pinned to the version the caller
// read it at, and says how long the body is (its Content-Length): a store that trims the range
// answers with fewer bytes than asked, which ReadAt reports as store.ErrOutOfRange.
type opener func(ctx context.Context, off, n int64) (body io.ReadCloser, length int64, err error)

// readAt fills all of p with the object's bytes at off, or fails (store.Store.ReadAt): a body that
// breaks off is resumed from where it stopped, under the same version.
func (r *reader) readAt(ctx context.Context, key string, p []byte, off int64, open opener) error {
	if err := store.ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	if len(p) == 0 {
		return nil
	}
	if off < 0 {
		return r.fail(key, fmt.Errorf("%w: negative offset", store.ErrOutOfRange))
	}
	done := 0
	return r.do(ctx, key, func(ctx context.Context) error {
		start, want := off+int64(done), int64(len(p)-done)
		body, length, err := open(ctx, start, want)
		if err != nil {
			return err
		}
		defer drain(body)
		if length != want {
			return fmt.Errorf("%w: asked for %d bytes at %d, got %d", store.ErrOutOfRange, want, start, length)
		}
		n, err := io.ReadFull(body, p[done:])
		done += n
		if err != nil {
			return &bodyError{err: err, got: n}
		}
		return nil
	})
}

// drain reads what is left of a body (a little) so the connection goes back to the pool.
func drain(body io.ReadCloser) {
	io.Copy(io.Discard, io.LimitReader(body, 64<<10))
	body.Close()
}

// bodyError is a body that broke off: always worth resuming.
type bodyError struct {
	err error
	got int
}

func (e *bodyError) Error() string {
	return fmt.Sprintf("the body broke off after %d bytes: %v", e.got, e.err)
}

func (e *bodyError) Unwrap() error { return e.err }

// do runs one attempt at a time, each under ReadTimeout and one request slot, and tries again with
// full-jitter backoff while the error is transient and the retry budget lasts. Its errors name the
// store and key and wrap the sentinels; a cancelled ctx returns ctx.Err() as it is.
func (r *reader) do(ctx context.Context, key string, attempt func(context.Context) error) error {
	start := time.Now()
	deadline := start.Add(r.cfg.RetryBudget)
	backoff := 50 * time.Millisecond
	for n := 1; ; n++ {
		select {
		case r.slots <- struct{}{}:
		case <-ctx.Done():
			return ctx.Err()
		}
		actx, cancel := context.WithTimeout(ctx, r.cfg.ReadTimeout)
		err := attempt(actx)
		timedOut := actx.Err() == context.DeadlineExceeded
		cancel()
		<-r.slots
		if err == nil {
			return nil
		}
		if ctx.Err() != nil {
			return ctx.Err()
		}
		if timedOut && !errors.Is(err, context.DeadlineExceeded) {
			err = fmt.Errorf("%w: %v", context.DeadlineExceeded, err)
		}
		if refused := start.Add(refusedBudget); errors.Is(err, syscall.ECONNREFUSED) && refused.Before(deadline) {
			deadline = refused
		}
		if !r.transient(err) || time.Now().Add(backoff).After(deadline) {
			if n > 1 {
				err = fmt.Errorf("after %d attempts: %w", n, err)
			}
			return r.fail(key, err)
		}
		select {
		case <-time.After(time.Duration(rand.Int64N(int64(backoff)))):
		case <-ctx.Done():
			return ctx.Err()
		}
		backoff = min(2*backoff, 2*time.Second)
	}
}

func (r *reader) transient(err error) bool {
	var be *bodyError
	switch {
	case errors.Is(err, context.Canceled):
		return false
	case errors.As(err, &be), errors.Is(err, context.DeadlineExceeded):
		return true
	}
	return r.cfg.transient(err)
}

// fail is how an operation on key ("" for the store as a whole) fails with err: classified into the
// store's sentinels, naming the store and the key, never a credential.
func (r *reader) fail(key string, err error) error {
	what := r.cfg.name
	if key != "" {
		what += fmt.Sprintf(": %q", key)
	}
	return fmt.Errorf("%s: %w", what, r.cfg.classify(err))
}
