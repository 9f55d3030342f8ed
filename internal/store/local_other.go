//go:build !linux

package store

import (
	"io/fs"
	"os"
)

// ctime is not read outside Linux: versions there are size, mtime and inode only, so a rewrite
// in place that restores the mtime goes unseen.
func ctime(fs.FileInfo) (int64, bool) { return 0, false }

type leaseState int

const (
	leaseHeld leaseState = iota
	leaseWriterOpen
	leaseUnavailable
)

// readLease is Linux's; elsewhere only the version checks hold.
func readLease(*os.File) leaseState { return leaseUnavailable }

func releaseLease(*os.File) {}
