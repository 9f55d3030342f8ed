package store

import (
	"context"
	"errors"
	"io"
	"os"
	"path/filepath"
	"testing"
	"time"
)

func localFile(t *testing.T) (*Local, string, Info) {
	dir := t.TempDir()
	p := filepath.Join(dir, "f")
	os.WriteFile(p, []byte("aaaaaaaa"), 0o644)
	s, err := NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { s.Close(); testHookAfterRead = nil })
	info, _ := s.Stat(context.Background(), "f")
	return s, p, info
}

// A change that lands while a read is under way fails the read, even when the version matched
// before it: the version is confirmed on the open handle after the read.
func TestLocalConfirmsTheVersionAfterTheRead(t *testing.T) {
	s, p, info := localFile(t)
	mode := os.FileMode(0o600)
	testHookAfterRead = func(string) { os.Chmod(p, mode); mode ^= 0o044 } // sets ctime, breaks no lease
	for _, ver := range []string{info.Version, ""} {
		if err := s.ReadAt(context.Background(), "f", ver, make([]byte, 8), 0); !errors.Is(err, ErrChanged) {
			t.Errorf("a read the file changed under (version %q): %v, want ErrChanged", ver, err)
		}
		info, _ = s.Stat(context.Background(), "f")
	}
}

// A file another process holds open for writing may be mid-write (its timestamps moved when the
// write began), so it is not read: ErrChanged. Needs leases (the owner, on a local file system).
func TestLocalRefusesAFileOpenForWriting(t *testing.T) {
	s, p, info := localFile(t)
	probe, _ := os.Open(p)
	leases := readLease(probe) == leaseHeld
	probe.Close()
	if !leases {
		t.Skip("no file leases here")
	}
	w, err := os.OpenFile(p, os.O_WRONLY, 0)
	if err != nil {
		t.Fatal(err)
	}
	if err := s.ReadAt(context.Background(), "f", info.Version, make([]byte, 8), 0); !errors.Is(err, ErrChanged) {
		t.Errorf("reading a file open for writing: %v, want ErrChanged", err)
	}
	w.Close()
	if err := s.ReadAt(context.Background(), "f", info.Version, make([]byte, 8), 0); err != nil {
		t.Errorf("reading it once the writer closed it: %v", err)
	}
}

// While a read holds its lease, a writer's open waits for the read to end, so it cannot write
// into the bytes being read.
func TestLocalWriterWaitsForTheRead(t *testing.T) {
	s, p, info := localFile(t)
	probe, _ := os.Open(p)
	leases := readLease(probe) == leaseHeld
	probe.Close()
	if !leases {
		t.Skip("no file leases here")
	}
	opened := make(chan time.Time, 1)
	var slept time.Time
	testHookAfterRead = func(string) {
		go func() {
			w, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err == nil {
				w.Close()
			}
			opened <- time.Now()
		}()
		time.Sleep(200 * time.Millisecond) // the writer is blocked in open meanwhile
		slept = time.Now()
	}
	if err := s.ReadAt(context.Background(), "f", info.Version, make([]byte, 8), 0); err != nil {
		t.Fatalf("ReadAt: %v", err)
	}
	if at := <-opened; at.Before(slept) {
		t.Errorf("the writer opened the file %v before the read ended", slept.Sub(at))
	}
}

// A file section gives its lease up once written, so a writer need not wait for it to be closed,
// and its Close confirms the version once more: a socket may still be reading the file's pages.
func TestFileSectionCloseConfirmsTheVersion(t *testing.T) {
	s, p, info := localFile(t)
	for _, change := range []bool{false, true} {
		sec, err := s.Section(context.Background(), "f", info.Version, []Range{{Offset: 2, Length: 4}})
		if err != nil {
			t.Fatal(err)
		}
		if n, err := sec.WriteTo(io.Discard); n != 4 || err != nil {
			t.Fatalf("WriteTo: %d, %v", n, err)
		}
		opened := make(chan error, 1)
		go func() {
			w, err := os.OpenFile(p, os.O_WRONLY, 0)
			if err == nil {
				w.Close()
			}
			opened <- err
		}()
		select {
		case <-opened:
		case <-time.After(30 * time.Second):
			t.Fatal("a writer waited for a section that was written but not closed")
		}
		if change {
			os.Chmod(p, 0o600)
		}
		if err := sec.Close(); change != errors.Is(err, ErrChanged) {
			t.Errorf("Close after a change %v: %v", change, err)
		}
		info, _ = s.Stat(context.Background(), "f")
	}
}
