package store

import (
	"context"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path"
	"sort"
	"strconv"
	"syscall"
)

// Local is a store over a directory. It opens files through os.Root, so neither "..", an absolute
// path nor a symlink can reach outside the directory; a path that would is "not found".
//
// # One version per read
//
// A file's version is its size, modification time, status-change time (ctime) and inode number,
// all from fstat on the open handle. ReadAt checks the version before it reads and again after, on
// the same handle, and fails with ErrChanged when the two differ or differ from the version the
// caller expects. Every read of one response carries the version the catalog saw, so a response
// holds bytes of one version of each file or fails (409 before the first byte, an aborted stream
// after it).
//
// Timestamps alone leave a hole: Linux updates them when a write starts, so a write that began
// before the first fstat and is still copying during the read changes neither fstat — a large
// single write(2), or a writer preempted mid-copy. On Linux ReadAt therefore also takes a read
// lease (fcntl F_SETLEASE) on the handle for the read. The kernel grants it only while no process
// has the file open for writing, and while it is held an open for writing or a truncate waits until
// the handle is closed (milliseconds: the read). So when the lease is granted no write can touch
// the bytes read; when it is refused because a writer has the file open, the read fails with
// ErrChanged (409: "open for writing"), whether or not that writer is writing at the moment.
//
// Detected always: a rewrite in place (same size, same mtime, even one that restores the mtime
// with utimes, since that sets ctime), a truncation or extension, a file replaced by rename (a new
// inode: how uploads and huggingface-cli replace files), a file replaced by a FIFO, a directory or
// anything else that is not a regular file (refused at open, which never blocks: O_NONBLOCK), a
// chmod or chown during the read (ctime; a false alarm, answered with a retry).
//
// Detected only with the lease: a write already under way when the read starts, and one through a
// writable mmap made before it. The lease is granted only to the file's owner (or with
// CAP_LEASE), on local file systems, with fs.leases-enable on; elsewhere the version checks are all
// there is, and those writes can go unseen. Never detected: a change on a network or FUSE file
// system that this host's fstat does not see yet (NFS caches attributes for up to acregmin
// seconds without noac), and, on file systems with coarse timestamps (Linux before 6.13, or one
// without multigrain timestamps), a write in the same clock tick (1-10 ms) as the change the first
// fstat saw, when there is no lease. A write that starts after the second fstat does not touch
// the bytes this read returned; the next read of the response sees the new version and fails.
//
// # Sections
//
// Section hands ranges of the open file to a writer, which a socket sends by sendfile, under the
// same checks: lease and version before the first byte, version after the last (fileSection).
// sendfile does not copy: the socket reads the file's pages as it transmits, after the checks, so
// a section's Close confirms the version once more, and its caller closes it only once the socket
// holds none of its bytes (the executor copies the body's end for that) — a write in between is
// then seen there, and the response aborted.
type Local struct {
	dir  string
	root *os.Root
}

// NewLocal opens a directory as a store.
func NewLocal(dir string) (*Local, error) {
	root, err := os.OpenRoot(dir)
	if err != nil {
		return nil, fmt.Errorf("local store: %w", err)
	}
	return &Local{dir: dir, root: root}, nil
}

// String names the store and its directory, for the operator's logs. Errors say only "local
// store": they reach clients in problems, which never carry local paths.
func (l *Local) String() string { return "local store " + l.dir }

// Close releases the directory.
func (l *Local) Close() error { return l.root.Close() }

func version(fi fs.FileInfo) string {
	v := strconv.FormatInt(fi.Size(), 16) + "-" + strconv.FormatInt(fi.ModTime().UnixNano(), 16)
	if ct, ok := ctime(fi); ok {
		v += "-" + strconv.FormatInt(ct, 16)
	}
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		v += "-" + strconv.FormatUint(st.Ino, 16)
	}
	return v
}

const what = "local store"

func (l *Local) mapErr(key string, err error) error {
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Err != nil {
		// os.Root refuses a path that leaves it with an error of its own; every other failure of
		// an open is a system error.
		if errno := syscall.Errno(0); !errors.As(pe.Err, &errno) && !errors.Is(pe.Err, fs.ErrNotExist) {
			return fmt.Errorf("%s: %q: %w (a symlink out of the store is not followed)", what, key, ErrNotFound)
		}
		err = pe.Err // the op and path of a PathError add nothing for a client, and may name local paths
	}
	switch {
	case errors.Is(err, fs.ErrNotExist), errors.Is(err, syscall.ENOTDIR):
		return fmt.Errorf("%s: %q: %w", what, key, ErrNotFound)
	case errors.Is(err, fs.ErrPermission):
		return fmt.Errorf("%s: %q: %w", what, key, ErrPermissionDenied)
	case errors.Is(err, syscall.ENAMETOOLONG):
		return fmt.Errorf("%w %q: the name is too long for the file system", ErrInvalidKey, key)
	}
	return fmt.Errorf("%s: %q: %w", what, key, err)
}

// Stat implements Store.
func (l *Local) Stat(ctx context.Context, key string) (Info, error) {
	if err := ValidateKey(key); err != nil {
		return Info{}, err
	}
	fi, err := l.root.Stat(key)
	if err != nil {
		return Info{}, l.mapErr(key, err)
	}
	if !fi.Mode().IsRegular() {
		return Info{}, fmt.Errorf("%s: %q: %w: not a regular file", what, key, ErrNotFound)
	}
	return Info{Size: fi.Size(), Version: version(fi)}, nil
}

// testHookAfterRead, when set, runs between a read (or a section's writes) and the fstat that
// confirms it.
var testHookAfterRead func(key string)

// open opens a version of a file without blocking, refuses anything but a regular file, and
// returns the handle with its version (fstat on it), which must be ver when ver is not empty.
func (l *Local) open(ctx context.Context, key, ver string) (*os.File, fs.FileInfo, string, error) {
	if err := ValidateKey(key); err != nil {
		return nil, nil, "", err
	}
	if err := ctx.Err(); err != nil {
		return nil, nil, "", err
	}
	// O_NONBLOCK: opening a FIFO for reading would otherwise wait for a writer, forever. It
	// changes nothing for a regular file, which is all this store reads.
	f, err := l.root.OpenFile(key, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, nil, "", l.mapErr(key, err)
	}
	fail := func(err error) (*os.File, fs.FileInfo, string, error) {
		f.Close()
		return nil, nil, "", err
	}
	fi, err := f.Stat()
	if err != nil {
		return fail(l.mapErr(key, err))
	}
	if !fi.Mode().IsRegular() {
		if ver != "" { // it was a regular file when its version was taken
			return fail(fmt.Errorf("%s: %q: %w: it is no longer a regular file", what, key, ErrChanged))
		}
		return fail(fmt.Errorf("%s: %q: %w: not a regular file", what, key, ErrNotFound))
	}
	v := version(fi)
	if ver != "" && v != ver {
		return fail(fmt.Errorf("%s: %q: %w", what, key, ErrChanged))
	}
	return f, fi, v, nil
}

// inRange checks [off, off+n) against a file's size.
func inRange(key string, off, n, size int64) error {
	if off < 0 || n < 0 || off+n > size {
		return fmt.Errorf("%s: %q: %w: [%d, %d) of %d bytes", what, key, ErrOutOfRange, off, off+n, size)
	}
	return nil
}

// lease takes the read lease before bytes are read from f: refused, a writer has the file open.
func lease(f *os.File, key string) error {
	if readLease(f) == leaseWriterOpen {
		return fmt.Errorf("%s: %q: %w: another process has it open for writing", what, key, ErrChanged)
	}
	return nil
}

// confirm checks, after bytes were read from f, that the file is still version v.
func (l *Local) confirm(f *os.File, key, v string) error {
	if testHookAfterRead != nil {
		testHookAfterRead(key)
	}
	return l.still(f, key, v, "it was written to during the read")
}

// still checks that the file open as f is version v; why says what it means when it is not.
func (l *Local) still(f *os.File, key, v, why string) error {
	fi, err := f.Stat()
	if err != nil {
		return l.mapErr(key, err)
	}
	if version(fi) != v {
		return fmt.Errorf("%s: %q: %w: %s", what, key, ErrChanged, why)
	}
	return nil
}

// ReadAt implements Store. It opens the file without blocking, refuses anything but a regular
// file, and confirms the version on the open handle before and after the read.
func (l *Local) ReadAt(ctx context.Context, key, ver string, p []byte, off int64) error {
	f, fi, v, err := l.open(ctx, key, ver)
	if err != nil {
		return err
	}
	defer f.Close()
	if err := lease(f, key); err != nil {
		return err
	}
	if err := inRange(key, off, int64(len(p)), fi.Size()); err != nil {
		return err
	}
	if _, err := f.ReadAt(p, off); err != nil {
		if err == io.EOF { // truncated between fstat and the read
			return fmt.Errorf("%s: %q: %w", what, key, ErrChanged)
		}
		return l.mapErr(key, err)
	}
	return l.confirm(f, key, v)
}

// Section implements Sectioner: it opens the file and checks its version and the ranges now;
// the Section's WriteTo hands the open file to the writer, which a socket sends by sendfile.
func (l *Local) Section(ctx context.Context, key, ver string, ranges []Range) (Section, error) {
	f, fi, v, err := l.open(ctx, key, ver)
	if err != nil {
		return nil, err
	}
	for _, r := range ranges {
		if err := inRange(key, r.Offset, r.Length, fi.Size()); err != nil {
			f.Close()
			return nil, err
		}
	}
	return &fileSection{l: l, f: f, key: key, version: v, ranges: ranges}, nil
}

// SectionMemory implements Sectioner: a file section holds a file handle, no memory.
func (l *Local) SectionMemory(int64) int64 { return 0 }

// fileSection is ranges of an open file, written under the same guarantees as ReadAt: the read
// lease is taken and the version confirmed on the handle before the first byte is written, and
// confirmed again after the last, when the lease is given up.
//
// A socket that sends a file by sendfile does not copy the bytes then: it queues references to
// the file's pages, which it reads as it transmits — or, to a client on this host, which the
// client reads from when it reads. A write to the file after WriteTo can still change bytes the
// client has not read. So Close confirms the version once more, and the caller closes a section
// only once the socket holds none of its bytes, and aborts on ErrChanged: every write that could
// have reached the client is then seen.
type fileSection struct {
	l       *Local
	f       *os.File
	key     string
	version string
	ranges  []Range
}

func (s *fileSection) WriteTo(w io.Writer) (int64, error) {
	if err := lease(s.f, s.key); err != nil {
		return 0, err
	}
	defer releaseLease(s.f)
	if err := s.l.still(s.f, s.key, s.version, "it was written to before it was sent"); err != nil {
		return 0, err
	}
	var n int64
	for _, r := range s.ranges {
		// sendfile sends from the file's offset: seek, then a LimitedReader over the *os.File,
		// the form net.TCPConn.ReadFrom recognizes.
		if _, err := s.f.Seek(r.Offset, io.SeekStart); err != nil {
			return n, s.l.mapErr(s.key, err)
		}
		m, err := io.Copy(w, &io.LimitedReader{R: s.f, N: r.Length})
		n += m
		if err != nil {
			return n, err
		}
		if m < r.Length { // truncated since the version was confirmed
			return n, fmt.Errorf("%s: %q: %w: it ended early", what, s.key, ErrChanged)
		}
	}
	return n, s.l.confirm(s.f, s.key, s.version)
}

// Close confirms the version a last time, and closes the file.
func (s *fileSection) Close() error {
	err := s.l.still(s.f, s.key, s.version, "it was written to while it was being sent")
	s.f.Close()
	return err
}

// List implements Store.
func (l *Local) List(ctx context.Context, prefix string) ([]string, error) {
	start := "."
	if prefix != "" {
		if err := ValidateKey(prefix); err != nil {
			return nil, err
		}
		start = prefix
	}
	var keys []string
	err := fs.WalkDir(l.root.FS(), start, func(p string, d fs.DirEntry, err error) error {
		if err != nil {
			if errors.Is(err, fs.ErrNotExist) && p == start {
				return fs.SkipAll
			}
			return err
		}
		if d.Type().IsRegular() && ValidateKey(p) == nil {
			keys = append(keys, path.Clean(p))
		}
		return nil
	})
	if err != nil {
		return nil, l.mapErr(prefix, err)
	}
	sort.Strings(keys)
	return keys, nil
}

// Check implements Store.
func (l *Local) Check(ctx context.Context) error {
	if _, err := l.root.Stat("."); err != nil {
		return l.mapErr(".", err)
	}
	return nil
}
