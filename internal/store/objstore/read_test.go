package objstore

import (
	"bytes"
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/store"
)

var errBusy = errors.New("busy")

func testReader(budget time.Duration) *reader {
	return newReader(readerConfig{
		name:      "test store",
		Tunables:  Tunables{ReadTimeout: 100 * time.Millisecond, RetryBudget: budget},
		transient: func(err error) bool { return errors.Is(err, errBusy) || errors.Is(err, syscall.ECONNRESET) },
		classify: func(err error) error {
			if errors.Is(err, errBusy) {
				return fmt.Errorf("%w: %v", store.ErrUnavailable, err)
			}
			return err
		},
	})
}

// breaking is a body that yields n bytes of data, then fails with err.
type breaking struct {
	r   io.Reader
	err error
}

func (b *breaking) Read(p []byte) (int, error) {
	n, err := b.r.Read(p)
	if err == io.EOF {
		return n, b.err
	}
	return n, err
}

func (b *breaking) Close() error { return nil }

func TestReadAtResumesTheMissingTail(t *testing.T) {
	data := []byte("0123456789abcdefghij")
	var asked []string
	open := func(_ context.Context, off, n int64) (io.ReadCloser, int64, error) {
		asked = append(asked, fmt.Sprintf("%d+%d", off, n))
		body := data[off : off+n]
		if len(asked) < 3 { // the first two bodies break off after 3 bytes
			return &breaking{r: bytes.NewReader(body[:3]), err: io.ErrUnexpectedEOF}, n, nil
		}
		return io.NopCloser(bytes.NewReader(body)), n, nil
	}
	p := make([]byte, 12)
	if err := testReader(time.Second).readAt(context.Background(), "k", p, 4, open); err != nil {
		t.Fatal(err)
	}
	if string(p) != string(data[4:16]) || strings.Join(asked, " ") != "4+12 7+9 10+6" {
		t.Errorf("got %q after asking %v", p, asked)
	}
}

func TestReadAtShortBodyIsOutOfRange(t *testing.T) {
	open := func(_ context.Context, off, n int64) (io.ReadCloser, int64, error) {
		return io.NopCloser(strings.NewReader("ab")), 2, nil
	}
	err := testReader(time.Second).readAt(context.Background(), "k", make([]byte, 4), 0, open)
	if !errors.Is(err, store.ErrOutOfRange) || !strings.HasPrefix(err.Error(), `test store: "k": `) {
		t.Errorf("ReadAt = %v, want ErrOutOfRange naming the store and key", err)
	}
}

func TestReadAtArguments(t *testing.T) {
	r := testReader(time.Second)
	open := func(context.Context, int64, int64) (io.ReadCloser, int64, error) {
		t.Error("opened a body")
		return nil, 0, errors.New("unreachable")
	}
	if err := r.readAt(context.Background(), "../k", make([]byte, 1), 0, open); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("bad key: %v", err)
	}
	if err := r.readAt(context.Background(), "k", make([]byte, 1), -1, open); !errors.Is(err, store.ErrOutOfRange) {
		t.Errorf("negative offset: %v", err)
	}
	if err := r.readAt(context.Background(), "k", nil, 0, open); err != nil {
		t.Errorf("empty read: %v", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if err := r.readAt(ctx, "k", make([]byte, 1), 0, open); !errors.Is(err, context.Canceled) {
		t.Errorf("cancelled: %v", err)
	}
}

func TestDoRetriesOnlyTransientErrors(t *testing.T) {
	for _, c := range []struct {
		name     string
		err      error
		attempts int64
		want     error
	}{
		{"transient", errBusy, 3, nil},
		{"reset", syscall.ECONNRESET, 3, nil},
		{"broken body", &bodyError{err: io.ErrUnexpectedEOF}, 3, nil},
		{"permanent", store.ErrNotFound, 1, store.ErrNotFound},
		{"cancelled", context.Canceled, 1, context.Canceled},
	} {
		var n atomic.Int64
		err := testReader(5*time.Second).do(context.Background(), "k", func(context.Context) error {
			if n.Add(1) < 3 {
				return c.err
			}
			return nil
		})
		if n.Load() != c.attempts || !errors.Is(err, c.want) || (c.want == nil) != (err == nil) {
			t.Errorf("%s: %d attempts, %v; want %d, %v", c.name, n.Load(), err, c.attempts, c.want)
		}
	}
}

// giveUpWithin is the deadline of the context these tests call do with: 100 times the 300 ms
// budgets and 15 times the refused connection's 2 s, and far below the hour's budget. A do that
// ran past its budget ends with this deadline, which the tests tell from the store's giving up.
const giveUpWithin = 30 * time.Second

func TestDoStopsAtTheBudget(t *testing.T) {
	ctx, cancel := context.WithTimeout(context.Background(), giveUpWithin)
	defer cancel()
	var n atomic.Int64
	err := testReader(300*time.Millisecond).do(ctx, "k", func(context.Context) error {
		n.Add(1)
		return errBusy
	})
	if !errors.Is(err, store.ErrUnavailable) || !strings.Contains(err.Error(), "attempts") || n.Load() < 2 {
		t.Errorf("Do = %v after %d attempts, want ErrUnavailable after several within the budget", err, n.Load())
	}
}

// A refused connection (nothing listens at the endpoint) fails within seconds, not the budget.
func TestDoGivesUpOnARefusedConnectionSoon(t *testing.T) {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	addr := l.Addr().String()
	l.Close()
	r := testReader(time.Hour)
	r.cfg.transient = func(err error) bool { return errors.Is(err, syscall.ECONNREFUSED) }
	ctx, cancel := context.WithTimeout(context.Background(), giveUpWithin)
	defer cancel()
	var n atomic.Int64
	err = r.do(ctx, "k", func(ctx context.Context) error {
		n.Add(1)
		c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
		if err == nil {
			c.Close()
		}
		return err
	})
	if !errors.Is(err, syscall.ECONNREFUSED) || n.Load() < 2 {
		t.Errorf("Do = %v after %d attempts, want the refusal after a few, not the hour's budget", err, n.Load())
	}
}

func TestDoTimesOutAStalledAttempt(t *testing.T) {
	var n atomic.Int64
	err := testReader(time.Second).do(context.Background(), "k", func(ctx context.Context) error {
		if n.Add(1) == 1 {
			<-ctx.Done() // stalls until the attempt's ReadTimeout
			return errors.New("the SDK's own words for it")
		}
		return nil
	})
	if err != nil || n.Load() != 2 {
		t.Errorf("Do = %v after %d attempts, want success on the second", err, n.Load())
	}
	err = testReader(300*time.Millisecond).do(context.Background(), "k", func(ctx context.Context) error {
		<-ctx.Done()
		return ctx.Err()
	})
	if !errors.Is(err, context.DeadlineExceeded) {
		t.Errorf("Do = %v, want DeadlineExceeded", err)
	}
}

func TestDoHoldsToTheSlots(t *testing.T) {
	r := newReader(readerConfig{name: "s", Tunables: Tunables{MaxInFlight: 2}, transient: func(error) bool { return false },
		classify: func(err error) error { return err }})
	var mu sync.Mutex
	now, peak := 0, 0
	var wg sync.WaitGroup
	for range 8 {
		wg.Go(func() {
			r.do(context.Background(), "k", func(context.Context) error {
				mu.Lock()
				now++
				peak = max(peak, now)
				mu.Unlock()
				time.Sleep(10 * time.Millisecond)
				mu.Lock()
				now--
				mu.Unlock()
				return nil
			})
		})
	}
	wg.Wait()
	if peak != 2 {
		t.Errorf("%d attempts at once, want the 2 slots full", peak)
	}
}

func TestFlags(t *testing.T) {
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	var tu Tunables
	tu.RegisterFlags(fs, "gcs", "GCS")
	if err := fs.Parse([]string{"--gcs-read-timeout=5s"}); err != nil {
		t.Fatal(err)
	}
	if want := (Tunables{defaultMaxInFlight, 5 * time.Second, defaultRetryBudget}); tu != want {
		t.Errorf("flags = %+v, want %+v", tu, want)
	}
	if err := tu.Validate("gcs"); err != nil {
		t.Error(err)
	}
	if err := (Tunables{}).Validate("gcs"); err != nil {
		t.Errorf("Validate refuses zero tunables, which take the defaults: %v", err)
	}
	if got, want := (Tunables{}).WithDefaults(), (Tunables{defaultMaxInFlight, defaultReadTimeout,
		defaultRetryBudget}); got != want {
		t.Errorf("zero tunables = %+v, want the defaults %+v", got, want)
	}
	for _, neg := range []Tunables{{MaxInFlight: -1}, {ReadTimeout: -time.Second}, {RetryBudget: -time.Second}} {
		if err := neg.Validate("gcs"); err == nil || !strings.Contains(err.Error(), "--gcs-max-in-flight") {
			t.Errorf("Validate(%+v): %v, want the flags named", neg, err)
		}
	}
}
