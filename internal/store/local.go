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
// path nor a symlink can reach outside the directory.
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

func (l *Local) String() string { return "local store " + l.dir }

// Close releases the directory.
func (l *Local) Close() error { return l.root.Close() }

func version(fi fs.FileInfo) string {
	v := strconv.FormatInt(fi.Size(), 16) + "-" + strconv.FormatInt(fi.ModTime().UnixNano(), 16)
	if st, ok := fi.Sys().(*syscall.Stat_t); ok {
		v += "-" + strconv.FormatUint(st.Ino, 16)
	}
	return v
}

func (l *Local) mapErr(key string, err error) error {
	if errors.Is(err, fs.ErrNotExist) {
		return fmt.Errorf("%s: %q: %w", l, key, ErrNotFound)
	}
	var pe *fs.PathError
	if errors.As(err, &pe) && pe.Err != nil && pe.Err.Error() == "path escapes from parent" {
		return fmt.Errorf("%s: %q: %w: escapes the store root", l, key, ErrInvalidKey)
	}
	return fmt.Errorf("%s: %q: %w", l, key, err)
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
		return Info{}, fmt.Errorf("%s: %q: %w: not a regular file", l, key, ErrNotFound)
	}
	return Info{Size: fi.Size(), Version: version(fi)}, nil
}

// ReadAt implements Store.
func (l *Local) ReadAt(ctx context.Context, key, ver string, p []byte, off int64) error {
	if err := ValidateKey(key); err != nil {
		return err
	}
	if err := ctx.Err(); err != nil {
		return err
	}
	f, err := l.root.Open(key)
	if err != nil {
		return l.mapErr(key, err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return l.mapErr(key, err)
	}
	if ver != "" && version(fi) != ver {
		return fmt.Errorf("%s: %q: %w", l, key, ErrChanged)
	}
	if off < 0 || off+int64(len(p)) > fi.Size() {
		return fmt.Errorf("%s: %q: %w: [%d, %d) of %d bytes", l, key, ErrOutOfRange, off, off+int64(len(p)), fi.Size())
	}
	if _, err := f.ReadAt(p, off); err != nil {
		if err == io.EOF { // truncated between Stat and the read
			return fmt.Errorf("%s: %q: %w", l, key, ErrChanged)
		}
		return l.mapErr(key, err)
	}
	return nil
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
		return fmt.Errorf("%s: %w", l, err)
	}
	return nil
}
