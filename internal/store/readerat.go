package store

import (
	"context"
	"io"
)

// ReaderAt reads one version of key as an io.ReaderAt, for code that takes one (hashing a whole
// file). Every read is a Store.ReadAt: whole or failed, never short.
func ReaderAt(ctx context.Context, s Store, key, version string) io.ReaderAt {
	return readerAt{ctx: ctx, s: s, key: key, version: version}
}

type readerAt struct {
	ctx          context.Context
	s            Store
	key, version string
}

func (r readerAt) ReadAt(p []byte, off int64) (int, error) {
	if err := r.s.ReadAt(r.ctx, r.key, r.version, p, off); err != nil {
		return 0, err
	}
	return len(p), nil
}
