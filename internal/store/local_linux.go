package store

import (
	"io/fs"
	"os"
	"syscall"
)

// ctime is the file's status-change time in nanoseconds: every write, truncate, chmod, rename and
// utimes sets it, and no unprivileged call sets it back.
func ctime(fi fs.FileInfo) (int64, bool) {
	st, ok := fi.Sys().(*syscall.Stat_t)
	if !ok {
		return 0, false
	}
	return st.Ctim.Nano(), true
}

// leaseState is what taking a read lease on an open file found.
type leaseState int

const (
	// No process has the file open for writing, and none can open it until the lease is released.
	leaseHeld        leaseState = iota
	leaseWriterOpen             // a process has the file open for writing: a write may be under way
	leaseUnavailable            // not the owner, a file system without leases, leases disabled
)

// readLease takes a read lease (fcntl F_SETLEASE, F_RDLCK) on f, opened read-only. The kernel
// grants it only while no one has the file open for writing; while it is held, an open for writing
// or a truncate waits until it is released, which closing f does. A reader holding it therefore
// reads bytes no write touches, even a write whose timestamps were updated before the reader
// looked (Linux updates them when a write starts, not when it ends).
func readLease(f *os.File) leaseState {
	rc, err := f.SyscallConn()
	if err != nil {
		return leaseUnavailable
	}
	var errno syscall.Errno
	rc.Control(func(fd uintptr) {
		_, _, errno = syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_SETLEASE, syscall.F_RDLCK)
	})
	switch errno {
	case 0:
		return leaseHeld
	case syscall.EAGAIN:
		return leaseWriterOpen
	}
	return leaseUnavailable
}

// releaseLease gives up f's read lease, so writers need not wait for f to be closed.
func releaseLease(f *os.File) {
	if rc, err := f.SyscallConn(); err == nil {
		rc.Control(func(fd uintptr) { syscall.Syscall(syscall.SYS_FCNTL, fd, syscall.F_SETLEASE, syscall.F_UNLCK) })
	}
}
