package faultproxy

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/store"
)

// Harness is an object store under test: a server to put objects into, a proxy in front of it, and
// stores reading through that proxy.
type Harness struct {
	// CreateBucket makes a bucket (a container) on the server, DeleteBucket deletes one and what
	// it holds; Put writes or replaces an object.
	CreateBucket func(t *testing.T, bucket string)
	DeleteBucket func(t *testing.T, bucket string)
	Put          func(t *testing.T, bucket, key string, data []byte)
	// NewProxy starts a proxy in front of the server.
	NewProxy func() *Proxy
	// Store builds a store over bucket reached at endpoint, with these tunables.
	Store func(t *testing.T, endpoint, bucket string, readTimeout, retryBudget time.Duration) store.Store
}

var buckets atomic.Int64

// The object every case reads: big enough that half a body is many packets.
const (
	objectKey  = "m/model.safetensors"
	objectSize = 256 << 10
)

func pattern(n int, seed byte) []byte {
	b := make([]byte, n)
	for i := range b {
		b[i] = byte(i/3) ^ seed
	}
	return b
}

// fixture is one case's bucket, object, proxy and store.
type fixture struct {
	h      Harness
	bucket string
	data   []byte
	proxy  *Proxy
	store  store.Store
}

func (h Harness) fixture(t *testing.T, readTimeout, retryBudget time.Duration) *fixture {
	f := &fixture{h: h, bucket: fmt.Sprintf("faults-%d", buckets.Add(1)), data: pattern(objectSize, 1)}
	h.CreateBucket(t, f.bucket)
	h.Put(t, f.bucket, objectKey, f.data)
	f.proxy = h.NewProxy()
	t.Cleanup(f.proxy.Close)
	f.store = h.Store(t, f.proxy.URL, f.bucket, readTimeout, retryBudget)
	return f
}

// readWithin is the deadline of a read: ten times the longest retry budget a case sets and far
// below the minute a stall lasts, so a read that outlasts its budget is ended by this deadline,
// and read reports that as no sentinel a case expects.
const readWithin = 30 * time.Second

// read reads the object whole at the version Stat sees.
func (f *fixture) read(t *testing.T) ([]byte, error) {
	info, err := f.store.Stat(context.Background(), objectKey)
	if err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), readWithin)
	defer cancel()
	p := make([]byte, objectSize)
	err = f.store.ReadAt(ctx, objectKey, info.Version, p, 0)
	if ctx.Err() != nil {
		return p, fmt.Errorf("the read outlasted its retry budget: its %s deadline ended it (%v)", readWithin, err)
	}
	return p, err
}

func (f *fixture) expectBytes(t *testing.T) {
	t.Helper()
	p, err := f.read(t)
	if err != nil || !bytes.Equal(p, f.data) {
		t.Fatalf("ReadAt: %v (bytes equal: %v)", err, bytes.Equal(p, f.data))
	}
}

// nth applies faults to the n-th ranged GET (from 1), by a map.
func nth(faults map[int]Fault) func(int, *http.Request) Fault {
	return func(n int, _ *http.Request) Fault { return faults[n] }
}

func always(f Fault) func(int, *http.Request) Fault {
	return func(int, *http.Request) Fault { return f }
}

// RunMatrix runs the faults every object store must survive or report as the right sentinel.
func RunMatrix(t *testing.T, h Harness) {
	const timeout, budget = 2 * time.Second, 3 * time.Second

	t.Run("ThrottlingIsRetried", func(t *testing.T) {
		f := h.fixture(t, timeout, budget)
		f.proxy.SetDecide(nth(map[int]Fault{1: Throttle, 2: Throttle}))
		f.expectBytes(t)
	})

	t.Run("ThrottlingEverywhereIsUnavailable", func(t *testing.T) {
		f := h.fixture(t, timeout, 500*time.Millisecond)
		f.proxy.SetDecide(always(Throttle))
		if _, err := f.read(t); !errors.Is(err, store.ErrUnavailable) {
			t.Errorf("ReadAt: %v, want ErrUnavailable at the retry budget", err)
		}
	})

	for name, fault := range map[string]Fault{"Reset": Reset, "Truncate": Truncate} {
		t.Run("BrokenBodyResumes/"+name, func(t *testing.T) {
			f := h.fixture(t, timeout, budget)
			f.proxy.SetDecide(nth(map[int]Fault{1: fault}))
			f.expectBytes(t)
			// The read after the break asks only for the missing tail: from half the body, or
			// before it after a reset, which drops what the client had not read yet.
			var from, to int
			if len(f.proxy.Ranges) == 2 {
				fmt.Sscanf(f.proxy.Ranges[1], "bytes=%d-%d", &from, &to)
			}
			if from <= 0 || from > objectSize/2 || fault == Truncate && from != objectSize/2 || to != objectSize-1 {
				t.Errorf("ranges %v: the retry should ask for the tail from %d", f.proxy.Ranges, objectSize/2)
			}
		})
	}

	t.Run("StallIsRetried", func(t *testing.T) {
		f := h.fixture(t, 300*time.Millisecond, budget)
		f.proxy.SetDecide(nth(map[int]Fault{1: Stall}))
		f.expectBytes(t)
	})

	t.Run("StalledStoreTimesOut", func(t *testing.T) {
		f := h.fixture(t, 200*time.Millisecond, time.Second)
		f.proxy.SetDecide(always(Stall))
		if _, err := f.read(t); !errors.Is(err, context.DeadlineExceeded) {
			t.Errorf("ReadAt: %v, want DeadlineExceeded at the retry budget", err)
		}
	})

	t.Run("ReplacedBeforeTheRead", func(t *testing.T) {
		f := h.fixture(t, timeout, budget)
		info, err := f.store.Stat(context.Background(), objectKey)
		if err != nil {
			t.Fatal(err)
		}
		h.Put(t, f.bucket, objectKey, pattern(objectSize, 2))
		err = f.store.ReadAt(context.Background(), objectKey, info.Version, make([]byte, objectSize), 0)
		if !errors.Is(err, store.ErrChanged) {
			t.Errorf("ReadAt at the old version: %v, want ErrChanged", err)
		}
	})

	t.Run("ReplacedMidBody", func(t *testing.T) {
		// The first body breaks off, and the object is replaced before the resumed read: the new
		// version's tail must not be spliced onto the old one's head.
		f := h.fixture(t, timeout, budget)
		var once sync.Once
		f.proxy.SetDecide(func(n int, _ *http.Request) Fault {
			if n == 1 {
				return Reset
			}
			once.Do(func() { h.Put(t, f.bucket, objectKey, pattern(objectSize, 3)) })
			return Pass
		})
		if _, err := f.read(t); !errors.Is(err, store.ErrChanged) {
			t.Errorf("ReadAt across a replacement: %v, want ErrChanged", err)
		}
	})

	t.Run("ForbiddenIsPermissionDenied", func(t *testing.T) {
		f := h.fixture(t, timeout, budget)
		f.proxy.SetDecide(always(Forbidden))
		if _, err := f.read(t); !errors.Is(err, store.ErrPermissionDenied) {
			t.Errorf("ReadAt: %v, want ErrPermissionDenied", err)
		}
		if len(f.proxy.Ranges) != 1 {
			t.Errorf("%d reads: a refusal is not retried", len(f.proxy.Ranges))
		}
	})

	t.Run("MissingBucket", func(t *testing.T) {
		proxy := h.NewProxy()
		t.Cleanup(proxy.Close)
		s := h.Store(t, proxy.URL, "no-such-bucket", timeout, time.Second)
		if _, err := s.Stat(context.Background(), objectKey); !errors.Is(err, store.ErrNotFound) {
			t.Errorf("Stat: %v, want ErrNotFound", err)
		}
		// Check tells a missing bucket from a missing checkpoint, which the catalog reports as
		// unknown: it names the bucket and is no ErrNotFound.
		err := s.Check(context.Background())
		if !errors.Is(err, store.ErrNoBucket) || errors.Is(err, store.ErrNotFound) ||
			!strings.Contains(err.Error(), "no-such-bucket") {
			t.Errorf("Check: %v, want ErrNoBucket naming the bucket", err)
		}
		// A read names the missing bucket alike on every store: never a missing or changed file,
		// which the server would answer with a 409 and a retry.
		err = s.ReadAt(context.Background(), objectKey, "", make([]byte, 8), 0)
		if !errors.Is(err, store.ErrNoBucket) || errors.Is(err, store.ErrNotFound) {
			t.Errorf("ReadAt: %v, want ErrNoBucket", err)
		}
	})

	t.Run("BucketDeletedBeforeTheRead", func(t *testing.T) {
		// The catalog saw the object, then the bucket went: a read at the version it saw is the
		// missing bucket too, not a file that changed or vanished.
		f := h.fixture(t, timeout, time.Second)
		info, err := f.store.Stat(context.Background(), objectKey)
		if err != nil {
			t.Fatal(err)
		}
		h.DeleteBucket(t, f.bucket)
		err = f.store.ReadAt(context.Background(), objectKey, info.Version, make([]byte, 8), 0)
		if !errors.Is(err, store.ErrNoBucket) || errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrChanged) ||
			!strings.Contains(err.Error(), f.bucket) {
			t.Errorf("ReadAt: %v, want ErrNoBucket naming the bucket", err)
		}
	})
}
