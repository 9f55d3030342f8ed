package tensor

import (
	"math/rand/v2"
	"slices"
	"testing"
)

// pack4 and pack2 with their vector kernels write the words their word loops write, and no others.
func TestPacksMatchTheWordLoops(t *testing.T) {
	if !hasAVX2 {
		t.Skip("no AVX2 on this CPU")
	}
	t.Run("16-bit", func(t *testing.T) { checkPack(t, pack4, pack4Words, 4, 16) })
	t.Run("32-bit", func(t *testing.T) { checkPack(t, pack2, pack2Words, 2, 8) })
}

// checkPack runs pack and words (k elements a word, the vector kernel stepping stepA elements of a
// source row and 8 rows) over tiles of random shapes, ragged against the kernel's steps or not,
// source strides (odd, or just the tile's width) and destination row widths.
func checkPack[T uint16 | uint32](t *testing.T, pack, words func(w []uint64, rw int64, s []T, sb, na, nb int64), k, stepA int64) {
	r := rand.New(rand.NewPCG(9, 10))
	vectorised := 0
	for iter := range 2000 {
		na, nb := 1+r.Int64N(300), 1+r.Int64N(140)
		if iter%4 == 0 { // whole steps
			na, nb = stepA*(1+r.Int64N(20)), 8*(1+r.Int64N(17))
		}
		sb := na + r.Int64N(40)
		rw := (nb+k-1)/k + r.Int64N(3)
		s := make([]T, na+(nb-1)*sb)
		for i := range s {
			s[i] = T(r.Uint32())
		}
		want := make([]uint64, na*rw+r.Int64N(3))
		for i := range want {
			want[i] = 0xA5A5A5A5A5A5A5A5
		}
		got := slices.Clone(want)
		words(want, rw, s, sb, na, nb)
		pack(got, rw, s, sb, na, nb)
		for i := range got {
			if got[i] != want[i] {
				t.Fatalf("%d × %d, stride %d, row %d words: word %d is %#x, want %#x", na, nb, sb, rw, i, got[i], want[i])
			}
		}
		if na >= stepA && nb >= 8 {
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
