package tensor

import "unsafe"

// A transpose walked run by run reads one element per source cache line and has left the line by
// the time its neighbours are wanted: 0.01× copy(). Tiles of the innermost dimension and of one
// contiguous in the source read each source line whole, once. A tile is packed into an aligned
// scratch in destination order by a word loop, converted there in one call of Run when the
// pipeline converts, and copied out a destination row at a time: writing the destination rows
// straight from the source would touch one word of a line per store, and with power-of-two row
// strides those lines share a cache set and are evicted before they fill.

// A tile spans tileSrcBytes of the source along its contiguous dimension (whole lines, long enough
// for the prefetcher) and tileRun elements along the innermost one.
const (
	tileSrcBytes = 512
	tileRun      = 128
)

// tiledDim returns the dimension to tile with the innermost one of s (simplified, at least one
// dimension): one contiguous in the source when the innermost dimension strides it without
// broadcasting; -1 when s has none, or its elements are nibbles (size 0, CopyNibbles' business).
func tiledDim(s Strided, size int64) int {
	inner := len(s.Lengths) - 1
	if ss := s.Src[inner]; size == 0 || ss == size || ss == 0 {
		return -1
	}
	for j := inner - 1; j >= 0; j-- {
		if s.Src[j] == size {
			return j
		}
	}
	return -1
}

// copyTiled is Copy of s in tiles of its dimension j and its innermost one; the odometer walks the
// other dimensions around them.
func copyTiled(p *Pipeline, dst []byte, src Source, srcOff int64, s Strided, j int) error {
	inner := len(s.Lengths) - 1
	size := int64(p.src.Size())
	na, nb, da, ss, ds := s.Lengths[j], s.Lengths[inner], s.Dst[j], s.Src[inner], s.Dst[inner]
	ta, tb := min(na, tileSrcBytes/size), min(nb, tileRun)
	t := newTile(p, ta, tb)
	m := inner - 1 // the other dimensions
	var small [3 * 8]int64
	buf := small[:]
	if m > 8 {
		buf = make([]int64, 3*m)
	}
	rest := Strided{Lengths: buf[0:0:m], Src: buf[m : m : 2*m], Dst: buf[2*m : 2*m : 3*m]}
	for d := range inner {
		if d != j {
			rest.Lengths = append(rest.Lengths, s.Lengths[d])
			rest.Src = append(rest.Src, s.Src[d])
			rest.Dst = append(rest.Dst, s.Dst[d])
		}
	}
	var o Odometer
	o.Reset(rest.Lengths, rest.Src, rest.Dst, srcOff, 0)
	for {
		for a := int64(0); a < na; a += ta {
			for b := int64(0); b < nb; b += tb {
				err := t.copy(dst[o.Dst+a*da+b*ds:], da, ds, src, o.Src+a*size+b*ss, ss, min(ta, na-a), min(tb, nb-b))
				if err != nil {
					return err
				}
			}
		}
		if !o.Next() {
			return nil
		}
	}
}

// tile holds a pipeline and the scratch of copyTiled: raw holds a tile of source elements in
// destination order, rows of rowElems elements (a whole number of words); out holds them converted.
type tile struct {
	p        *Pipeline
	rowElems int64
	raw, out []byte
}

func newTile(p *Pipeline, ta, tb int64) *tile {
	size := int64(p.src.Size())
	words := (tb*size + 7) / 8
	t := &tile{p: p, rowElems: 8 * words / size}
	// Allocated as words, so the packs store aligned words.
	t.raw = unsafe.Slice((*byte)(unsafe.Pointer(unsafe.SliceData(make([]uint64, ta*words)))), 8*ta*words)
	t.out = t.raw
	if !p.identity {
		t.out = make([]byte, ta*t.rowElems*int64(p.dst.Size()))
	}
	return t
}

// copy runs the pipeline over na × nb elements: element (a, b) is read at file offset at + a*size +
// b*ss and written at dst[a*da+b*db:]. Tiles no buffer holds whole, or whose words are not aligned,
// go a row at a time.
func (t *tile) copy(dst []byte, da, db int64, src Source, at, ss, na, nb int64) error {
	p := t.p
	size, dstSize := int64(p.src.Size()), int64(p.dst.Size())
	b := src.Slice(at, (na-1)*size+(nb-1)*ss+size)
	if b == nil || ss%size != 0 || !aligned(b, uintptr(size)) {
		for a := range na {
			if err := copyRun(p, dst[a*da:], src, at+a*size, nb, ss, db); err != nil {
				return err
			}
		}
		return nil
	}
	w := view[uint64](t.raw)
	switch sb, rw := ss/size, t.rowElems*size/8; size {
	case 1:
		pack8(w, rw, b, sb, na, nb)
	case 2:
		pack4(w, rw, view[uint16](b), sb, na, nb)
	case 4:
		pack2(w, rw, view[uint32](b), sb, na, nb)
	default:
		pack1(w, rw, view[uint64](b), sb, na, nb)
	}
	if !p.identity {
		p.Run(t.out, int(dstSize), t.raw, int(size), int(na*t.rowElems))
	}
	row := t.rowElems * dstSize
	for a := range na {
		if db == dstSize {
			copy(dst[a*da:][:nb*dstSize], t.out[a*row:])
		} else {
			copyElements(dst[a*da:], int(db), t.out[a*row:], int(dstSize), int(nb), int(dstSize))
		}
	}
	return nil
}

// The pack loops move element (a, b) of a tile, read at s[a+b*sb], to word a*rw + b/k of w, lane
// b%k, for k elements a word: they read k source rows side by side, each from one cache line at
// a time, and store whole words. Rows past nb repeat the last one; nothing reads those lanes.

func pack8(w []uint64, rw int64, s []byte, sb, na, nb int64) {
	for b := int64(0); b < nb; b += 8 {
		c0, c1, c2, c3 := s[b*sb:][:na], s[min(b+1, nb-1)*sb:][:na], s[min(b+2, nb-1)*sb:][:na], s[min(b+3, nb-1)*sb:][:na]
		c4, c5, c6, c7 := s[min(b+4, nb-1)*sb:][:na], s[min(b+5, nb-1)*sb:][:na], s[min(b+6, nb-1)*sb:][:na],
			s[min(b+7, nb-1)*sb:][:na]
		out := w[b/8:]
		for a := range c0 {
			out[int64(a)*rw] = uint64(c0[a]) | uint64(c1[a])<<8 | uint64(c2[a])<<16 | uint64(c3[a])<<24 |
				uint64(c4[a])<<32 | uint64(c5[a])<<40 | uint64(c6[a])<<48 | uint64(c7[a])<<56
		}
	}
}

// pack4 packs the corner the vector kernel can, then the elements right of it and the rows below
// it with the word loop.
func pack4(w []uint64, rw int64, s []uint16, sb, na, nb int64) {
	va, vb := pack4Vector(w, rw, s, sb, na, nb)
	if va < na {
		pack4Words(w[va*rw:], rw, s[va:], sb, na-va, vb)
	}
	if vb < nb {
		pack4Words(w[vb/4:], rw, s[vb*sb:], sb, na, nb-vb)
	}
}

// pack4Words is pack4 over 64-bit words: the portable loop, and the reference the vector one is
// tested against.
func pack4Words(w []uint64, rw int64, s []uint16, sb, na, nb int64) {
	for b := int64(0); b < nb; b += 4 {
		c0, c1, c2, c3 := s[b*sb:][:na], s[min(b+1, nb-1)*sb:][:na], s[min(b+2, nb-1)*sb:][:na], s[min(b+3, nb-1)*sb:][:na]
		out := w[b/4:]
		for a := range c0 {
			out[int64(a)*rw] = uint64(c0[a]) | uint64(c1[a])<<16 | uint64(c2[a])<<32 | uint64(c3[a])<<48
		}
	}
}

// pack2 packs the corner the vector kernel can, then the elements right of it and the rows below
// it with the word loop.
func pack2(w []uint64, rw int64, s []uint32, sb, na, nb int64) {
	va, vb := pack2Vector(w, rw, s, sb, na, nb)
	if va < na {
		pack2Words(w[va*rw:], rw, s[va:], sb, na-va, vb)
	}
	if vb < nb {
		pack2Words(w[vb/2:], rw, s[vb*sb:], sb, na, nb-vb)
	}
}

// pack2Words is pack2 over 64-bit words: the portable loop, and the reference the vector one is
// tested against.
func pack2Words(w []uint64, rw int64, s []uint32, sb, na, nb int64) {
	for b := int64(0); b < nb; b += 2 {
		c0, c1 := s[b*sb:][:na], s[min(b+1, nb-1)*sb:][:na]
		out := w[b/2:]
		for a := range c0 {
			out[int64(a)*rw] = uint64(c0[a]) | uint64(c1[a])<<32
		}
	}
}

func pack1(w []uint64, rw int64, s []uint64, sb, na, nb int64) {
	for b := range nb {
		out := w[b:]
		for a, x := range s[b*sb:][:na] {
			out[int64(a)*rw] = x
		}
	}
}
