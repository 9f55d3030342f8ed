package tensor

import (
	"encoding/binary"
	"math"
	"sync/atomic"

	lru "github.com/hashicorp/golang-lru/v2"
)

// A pipeline from a 1- or 2-byte dtype into one of at most 4 bytes is a function of at most 65,536
// inputs: its post ops and conversion can be one table lookup per element. The table is computed
// by the batch path over every input, so each entry (NaN payloads, rounding, signed zeros) is what
// the batch path gives, by construction. Building it costs one evaluation per entry, so it is
// built only once the chain has run over as many elements as the table has entries: a plan of
// small tensors never pays for it, a large one pays at most twice.
type lut struct {
	in, out  int          // element sizes
	seen     atomic.Int64 // elements run before the table was built
	building atomic.Bool
	table    atomic.Pointer[[]byte] // entry i is the destination encoding of source code i
}

// luts holds a table per chain (source dtype, ops, destination dtype), shared by every pipeline of
// that chain across plans and streams, so each is counted and built once. A bounded LRU rather
// than a sync.Map: operands come from requests, so the chains a long-running server sees are
// unbounded, and a table is up to 256 KiB (8 MiB for all 32); an evicted table lives on while pipelines
// hold it.
var luts, _ = lru.New[string, *lut](32)

// lutFor returns the shared table of a chain, or nil when its dtypes have none.
func lutFor(src DType, ops []Op, dst DType) *lut {
	in, out := src.Size(), dst.Size()
	if in != 1 && in != 2 || out != 1 && out != 2 && out != 4 {
		return nil
	}
	key := []byte{byte(src), byte(dst)}
	for _, op := range ops {
		key = append(key, byte(op.Kind), byte(op.DType))
		key = binary.LittleEndian.AppendUint64(key, math.Float64bits(op.Value))
	}
	if l, ok := luts.Get(string(key)); ok {
		return l
	}
	l := &lut{in: in, out: out}
	if prev, ok, _ := luts.PeekOrAdd(string(key), l); ok { // another pipeline added it meanwhile
		return prev
	}
	return l
}

// run looks n elements up when the table is built or this run completes the count that pays for
// it; it reports false when the batch path must run them. Concurrent runs never wait: while one
// builds, the others keep to the batch path.
func (l *lut) run(p *Pipeline, dst []byte, ds int, src []byte, ss int, n int) bool {
	t := l.table.Load()
	if t == nil {
		if l.seen.Add(int64(n)) < 1<<(8*l.in) || !l.building.CompareAndSwap(false, true) {
			return false
		}
		t = l.build(p)
	}
	if n < 1 || ds%l.out != 0 || ss%l.in != 0 || !aligned(dst, uintptr(l.out)) || !aligned(src, uintptr(l.in)) ||
		len(dst) < (n-1)*ds+l.out || len(src) < (n-1)*ss+l.in {
		return false
	}
	switch l.in<<4 | l.out {
	case 0x11:
		lookup(view[uint8](*t), view[uint8](dst), ds, view[uint8](src), ss, n)
	case 0x12:
		lookup(view[uint16](*t), view[uint16](dst), ds/2, view[uint8](src), ss, n)
	case 0x14:
		lookup(view[uint32](*t), view[uint32](dst), ds/4, view[uint8](src), ss, n)
	case 0x21:
		lookup(view[uint8](*t), view[uint8](dst), ds, view[uint16](src), ss/2, n)
	case 0x22:
		lookup(view[uint16](*t), view[uint16](dst), ds/2, view[uint16](src), ss/2, n)
	case 0x24:
		lookup(view[uint32](*t), view[uint32](dst), ds/4, view[uint16](src), ss/2, n)
	}
	return true
}

// build computes every entry by p's batch path (any pipeline of the chain computes the same).
func (l *lut) build(p *Pipeline) *[]byte {
	entries := 1 << (8 * l.in)
	in := make([]byte, entries*l.in)
	for i := range entries {
		in[i*l.in] = byte(i)
		if l.in == 2 {
			in[i*2+1] = byte(i >> 8) // little-endian, as the lookups read the codes
		}
	}
	t := make([]byte, entries*l.out)
	p.runBatches(t, l.out, in, l.in, entries)
	l.table.Store(&t)
	return &t
}

// lookup writes t[s[i*ss]] to d[i*ds] for n elements; contiguous runs go eight a round so the
// lookups overlap.
func lookup[In, Out word](t, d []Out, ds int, s []In, ss int, n int) {
	if ss != 1 || ds != 1 {
		for i := range n {
			d[i*ds] = t[s[i*ss]]
		}
		return
	}
	d, s = d[:n], s[:n]
	i := 0
	for ; i+8 <= n; i += 8 {
		x, y := s[i:i+8], d[i:i+8]
		y[0], y[1], y[2], y[3] = t[x[0]], t[x[1]], t[x[2]], t[x[3]]
		y[4], y[5], y[6], y[7] = t[x[4]], t[x[5]], t[x[6]], t[x[7]]
	}
	for ; i < n; i++ {
		d[i] = t[s[i]]
	}
}
