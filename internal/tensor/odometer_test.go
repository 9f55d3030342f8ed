package tensor

import (
	"math"
	"slices"
	"testing"
)

// The odometer visits every index of a box in row-major order, with the offsets of each.
func TestOdometerVisitsEveryIndex(t *testing.T) {
	lengths, src, dst := []int64{2, 1, 3}, []int64{100, 7, 10}, []int64{0, 5, 1}
	var got [][]int64
	var o Odometer
	o.Reset(lengths, src, dst, 1000, 0)
	for more := true; more; more = o.Next() {
		got = append(got, append(slices.Clone(o.Index), o.Src, o.Dst))
	}
	var want [][]int64
	for i := range int64(2) {
		for k := range int64(3) {
			want = append(want, []int64{i, 0, k, 1000 + 100*i + 10*k, k})
		}
	}
	if !slices.EqualFunc(got, want, slices.Equal) {
		t.Errorf("visited %v, want %v", got, want)
	}
	o.Reset(nil, nil, nil, 3, 4) // no dimensions: one index
	if o.Src != 3 || o.Dst != 4 || o.Next() {
		t.Errorf("a box of no dimensions is one index")
	}
}

func TestCheckedMul(t *testing.T) {
	for _, c := range []struct {
		a, b, p int64
		ok      bool
	}{{3, 4, 12, true}, {0, math.MaxInt64, 0, true}, {math.MaxInt64, 2, 0, false}, {1 << 32, 1 << 31, 0, false},
		{1 << 31, 1 << 31, 1 << 62, true}, {-1, 0, 0, false}, {2, -3, 0, false}} {
		if p, ok := CheckedMul(c.a, c.b); p != c.p || ok != c.ok {
			t.Errorf("CheckedMul(%d, %d) = %d, %v", c.a, c.b, p, ok)
		}
	}
	if p, ok := CheckedProduct(); p != 1 || !ok {
		t.Errorf("the empty product is %d, %v", p, ok)
	}
	if _, ok := CheckedProduct(1<<40, 1<<20, 1<<3); ok {
		t.Errorf("2^63 fits")
	}
}
