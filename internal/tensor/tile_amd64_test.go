package tensor

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// pack4 with the vector kernel writes the words pack4Words writes, and no others, for tiles of
// random shapes (ragged against the kernel's 16 × 8 steps or not), source strides (odd, or just the
// tile's width) and destination row widths.
func TestPack4MatchesTheWordLoop(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2 on this CPU")
	}
	r := rand.New(rand.NewPCG(9, 10))
	vectorised := 0
	for iter := range 2000 {
		na, nb := 1+r.Int64N(300), 1+r.Int64N(140)
		if iter%4 == 0 { // whole steps
			na, nb = 16*(1+r.Int64N(20)), 8*(1+r.Int64N(17))
		}
		sb := na + r.Int64N(40)
		rw := (nb+3)/4 + r.Int64N(3)
		s := make([]uint16, na+(nb-1)*sb)
		for i := range s {
			s[i] = uint16(r.Uint32())
		}
		want := make([]uint64, na*rw+r.Int64N(3))
		for i := range want {
			want[i] = 0xA5A5A5A5A5A5A5A5
		}
		got := slices.Clone(want)
		pack4Words(want, rw, s, sb, na, nb)
		pack4(got, rw, s, sb, na, nb)
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%d × %d, stride %d, row %d words: word %d is %#x, want %#x", na, nb, sb, rw, i, got[i], want[i])
			}
		}
		if na >= 16 && nb >= 8 {
			vectorised++
		}
	}
	if vectorised < 1000 {
		t.Errorf("only %d of the tiles were large enough for the vector kernel", vectorised)
	}
}

// The tiled copies give the same bytes through the word loops alone.
func TestCopyTiledWithoutVectorKernels(t *testing.T) {
	defer func(had bool) { hasAVX2 = had }(hasAVX2)
	hasAVX2 = false
	t.Run("random boxes", TestCopyTiledMatchesElementwise)
	t.Run("squares", TestTransposeSquare)
}
