package executor_test

import (
	"context"
	"crypto/sha256"
	"io"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/store"
)

// A stream canceled while its producer waits for a window slot (its client went away, or its
// request timed out, while the writer was behind) ends: WriteTo returns and Close gives everything
// back, whether the writer meets the segments the producer failed or the cancellation first, and
// whether the body is hashed or not. Which one the writer meets is the scheduler's choice, so each
// case runs many times. Each stream ends in milliseconds; one that waits for a slot no segment
// holds never does, which the 30 s deadline, far past the first and far short of the second, says.
func TestACanceledStreamEnds(t *testing.T) {
	local, plan, _ := copyPlan(t, 1<<20)
	buffered := struct{ store.Store }{local}
	for _, c := range []struct {
		name string
		to   func() executor.Output
	}{
		{"unhashed", func() executor.Output { return executor.Output{} }},
		{"hashed", func() executor.Output { return executor.Output{Hash: sha256.New()} }},
	} {
		for range 64 {
			mem := budget.New(budget.Config{Bytes: 1 << 30})
			e := executor.New(buffered, mem, executor.Config{Window: 1})
			ctx, cancel := context.WithCancel(context.Background())
			stream, err := e.Stream(ctx, plan, c.to())
			if err != nil {
				t.Fatal(err)
			}
			// The first segment is read and holds the window's one slot: the producer waits for it.
			if err := stream.Prime(); err != nil {
				t.Fatal(err)
			}
			cancel()
			// A moment for the producer to fail the segments it never started, so the writer can
			// meet one; without it the writer mostly meets the cancellation first (the verdict is the
			// same either way, only the case met is not).
			time.Sleep(time.Millisecond)
			ended := make(chan error, 1)
			go func() {
				_, err := stream.WriteTo(io.Discard)
				stream.Close()
				for mem.Held() != 0 { // Close drains what is in flight on a goroutine of its own
					time.Sleep(time.Millisecond)
				}
				ended <- err
			}()
			select {
			case err := <-ended:
				if err == nil {
					t.Fatalf("%s: a canceled stream wrote its whole body", c.name)
				}
			case <-time.After(30 * time.Second):
				t.Fatalf("%s: a canceled stream has not ended or given its memory back in 30 s", c.name)
			}
		}
	}
}
