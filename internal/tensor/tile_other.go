//go:build !amd64

package tensor

// pack4Vector has no vector kernel on this architecture: the word loop does it all.
func pack4Vector(w []uint64, rw int64, s []uint16, sb, na, nb int64) (va, vb int64) { return 0, 0 }

// pack2Vector has no vector kernel on this architecture: the word loop does it all.
func pack2Vector(w []uint64, rw int64, s []uint32, sb, na, nb int64) (va, vb int64) { return 0, 0 }
