// Package store is where checkpoint files are read from: the Store interface every backend
// implements, the capabilities a store may add (Sectioner, Aligner, Splitter), the Forwarder a
// decorator embeds to pass on what it does not change, the sentinel errors backends map their
// failures to, key validation, and the local-directory store that is shardsrv's embedded default.
//
// The stack serve builds, bottom up: a backend (Local, or an object store), the telemetry store,
// the verifying store, the cluster store, the chunk cache. Keys are validated where they enter —
// the catalog, for what clients send; the peer route — and by the backend at the bottom; the
// decorators between trust what they are given.
package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"strings"
)

// Store reads files (objects) by key. Implementations are safe for concurrent use.
type Store interface {
	// Stat returns the size and version of a file.
	Stat(ctx context.Context, key string) (Info, error)
	// ReadAt fills all of p with the bytes of key at off, or fails: it never returns partial data
	// and does not keep p. A non-empty version must match the file's, else ErrChanged.
	ReadAt(ctx context.Context, key, version string, p []byte, off int64) error
	// List returns the keys under prefix (a folder, "" for the root), recursively, sorted.
	List(ctx context.Context, prefix string) ([]string, error)
	// Check reports whether the store is reachable.
	Check(ctx context.Context) error
	// String names the store in logs and problems, without secrets.
	String() string
}

// Sectioner is a store that can write byte ranges of a file out itself, so bytes a response
// does not change need not be copied into a buffer of the caller's: a local file goes to a socket
// by sendfile, cached chunks are written from the cache. A store without it (an object store) is
// read with ReadAt into read-ahead buffers; a wrapper implements it only over a store that does
// (a verifying store hashes a shard's bytes before its first section, then trusts the file's
// version).
type Sectioner interface {
	// Section pins ranges of one version of key, to be written out in order by the Section. It
	// checks what it can at once (the key, the version, the ranges against the size), so a
	// failure is known before anything is written; the caller must Close the Section.
	Section(ctx context.Context, key, version string, ranges []Range) (Section, error)
	// SectionMemory is the memory a Section of n bytes keeps from being freed or reused until it
	// is closed — n for cached chunks, written out by copy; 0 for a section sent from a file,
	// whose Close must wait for the socket — for the caller to charge to its memory budget before
	// it pins one.
	SectionMemory(n int64) int64
}

// Aligner is a store whose reads cost whole aligned units: the verifying store can check only
// whole signed shards, so it reads any part of one as all of it. A cache above fills such units
// whole, each once, instead of reading one several times for its parts; a decorator between the
// two passes it through (Forwarder).
type Aligner interface {
	// Alignment is the unit reads of key at version are widened to: 1 when they are not.
	Alignment(ctx context.Context, key, version string) int64
}

// Splitter is a store that a cache's read must not run across some chunk boundaries of: the
// cluster store reads each stripe from the replica that owns it, and a fill that waited for two
// owners could wait for a fill that waits for it. A decorator between the two passes it through
// (Forwarder).
type Splitter interface {
	// Split reports whether a run must end before off, a chunk boundary.
	Split(key, version string, off int64) bool
}

// Range is a byte range of a file.
type Range struct{ Offset, Length int64 }

// Section is byte ranges of one version of a file, pinned until Close.
type Section interface {
	// WriteTo writes the ranges to w in order, passing w's ReadFrom a file when it can (the
	// socket's sendfile). When the file turns out to have changed it fails with ErrChanged, and
	// bytes of another version may already have been written: the caller must then abort what it
	// wrote them into. It is called at most once.
	WriteTo(w io.Writer) (int64, error)
	// Close releases what the Section pins. A Section sent from a file confirms the file's version
	// once more (ErrChanged): a socket may read the file's pages after WriteTo returned (sendfile
	// queues references to them), so the caller closes it once the socket holds none of its
	// bytes, and aborts on an error.
	Close() error
}

// Info describes a file.
type Info struct {
	Size int64
	// Version changes whenever the file's content may have: an ETag, or size, mtime, ctime and
	// inode locally (see Local).
	Version string
}

// The sentinels every backend maps its failures to; the HTTP layer maps them to statuses.
var (
	ErrNotFound   = errors.New("not found")
	ErrOutOfRange = errors.New("read past the end of the file")
	ErrChanged    = errors.New("file changed while it was being read")
	ErrInvalidKey = errors.New("invalid key")
	// ErrUnavailable is a store that sheds load (S3 SlowDown, 503): worth retrying later.
	ErrUnavailable = errors.New("the store is overloaded")
	// ErrPermissionDenied is a store that refuses this server's credentials: its configuration,
	// not the client's request, is at fault.
	ErrPermissionDenied = errors.New("access denied")
	// ErrNoBucket is a store whose bucket or container does not exist: its configuration is at
	// fault, the same on every store. ReadAt and Check report it; Stat reports a missing bucket as
	// ErrNotFound on every store, since S3's HEAD cannot tell the two apart.
	ErrNoBucket = errors.New("no such bucket or container")
	// ErrCorrupt is stored bytes that do not match the publisher's signature: a flipped bit, a
	// truncated upload, another model's file.
	ErrCorrupt = errors.New("the stored bytes do not match the checkpoint's signature")
	// ErrUnverified is a checkpoint that cannot be served verified as configured: no signature
	// under --verify required, one that does not verify, or a file it does not cover.
	ErrUnverified = errors.New("the checkpoint cannot be verified")
)

// CorruptError is ErrCorrupt found reading one range of one file version: it names the bytes, so
// what knows the file's version (the catalog) can refuse a later read of them before it starts.
type CorruptError struct {
	Key, Version   string
	Offset, Length int64
	Err            error // what the comparison found
}

func (e *CorruptError) Error() string { return fmt.Sprintf("%v: %s: %v", ErrCorrupt, e.Key, e.Err) }

func (e *CorruptError) Unwrap() error { return ErrCorrupt }

// Unanswered reports whether err, met asking the store about a file under ctx, leaves the file's
// version unknown: the store could not be asked or would not say (unreachable, overloaded, refusing
// credentials), as opposed to answering that the file is gone or the caller giving up. What was
// last learned of the file then still stands: a cache serves the version it holds through an outage.
func Unanswered(ctx context.Context, err error) bool {
	return err != nil && ctx.Err() == nil && !errors.Is(err, ErrNotFound)
}

// The longest key and key segment: S3's key limit, and NAME_MAX of Linux file systems.
const (
	MaxKeyBytes     = 1024
	MaxSegmentBytes = 255
)

// ValidateKey accepts relative paths of non-empty segments of [A-Za-z0-9._-] other than "." and
// "..", at most MaxSegmentBytes a segment and MaxKeyBytes in all: nothing a client sends can name
// a file outside the store root, or a name a store cannot hold.
func ValidateKey(key string) error {
	if key == "" {
		return fmt.Errorf("%w: empty", ErrInvalidKey)
	}
	if len(key) > MaxKeyBytes {
		return fmt.Errorf("%w: %d bytes, more than the %d a key may have", ErrInvalidKey, len(key), MaxKeyBytes)
	}
	for _, seg := range strings.Split(key, "/") {
		if seg == "" || seg == "." || seg == ".." {
			return fmt.Errorf("%w %q: segments must be non-empty names, not '.' or '..'", ErrInvalidKey, key)
		}
		if len(seg) > MaxSegmentBytes {
			return fmt.Errorf(
				"%w: a segment of %d bytes, more than the %d a segment may have",
				ErrInvalidKey,
				len(seg),
				MaxSegmentBytes,
			)
		}
		for _, c := range seg {
			if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
				return fmt.Errorf(
					"%w %q: only letters, digits, '.', '_' and '-' are allowed in a segment",
					ErrInvalidKey,
					key,
				)
			}
		}
	}
	return nil
}
