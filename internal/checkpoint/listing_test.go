package checkpoint

import (
	"encoding/json"
	"fmt"
	"math/rand/v2"
	"reflect"
	"sort"
	"sync"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

// A listing over several chunks answers, for every index, asked in any order and at once, the
// JSON of the tensor of that rank in name order, and After finds the entry after any name.
func TestListingIsEveryTensorInNameOrder(t *testing.T) {
	rng := rand.New(rand.NewPCG(1, 2))
	ck := &Checkpoint{Name: "ck", Tensors: map[string]*Tensor{}}
	for len(ck.Tensors) < 2*listingChunkLen+17 {
		name := fmt.Sprintf("model.layers.%d.w%d", rng.IntN(4000), rng.IntN(10))
		shape := make([]int64, rng.IntN(3))
		for i := range shape {
			shape[i] = 1 + rng.Int64N(9)
		}
		ck.Tensors[name] = &Tensor{Key: fmt.Sprintf("ck/model-%05d.safetensors", rng.IntN(3)),
			Tensor: safetensors.Tensor{Name: name, DTypeName: []string{"BF16", "F32", "F8_E4M3"}[rng.IntN(3)], Shape: shape}}
	}
	names := make([]string, 0, len(ck.Tensors))
	for n := range ck.Tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	l := ck.Listing()
	if ck.Listing() != l || l.Len() != len(names) {
		t.Fatalf("a listing of %d entries (the same one each time: %v) for %d tensors",
			l.Len(), ck.Listing() == l, len(names))
	}
	var wg sync.WaitGroup
	for _, i := range rng.Perm(len(names)) {
		wg.Go(func() {
			tn := ck.Tensors[names[i]]
			want := api.TensorInfo{Name: names[i], Dtype: tn.DTypeName, Shape: tn.Shape, File: tn.Key[len("ck/"):]}
			var got api.TensorInfo
			if err := json.Unmarshal(l.Entry(i), &got); err != nil || !reflect.DeepEqual(got, want) || l.Name(i) != names[i] {
				t.Errorf("entry %d: %s (%v) named %q, want %+v", i, l.Entry(i), err, l.Name(i), want)
			}
		})
	}
	wg.Wait()
	for i, n := range names {
		if got := l.After(n); got != i+1 {
			t.Fatalf("After(%q), entry %d: %d", n, i, got)
		}
		if got := l.After(n[:len(n)-1]); got != sort.SearchStrings(names, n[:len(n)-1]) {
			t.Fatalf("After(%q), a name not listed: %d", n[:len(n)-1], got)
		}
	}
	if l.After("") != 0 || l.After("~") != len(names) {
		t.Fatalf("After before the first name: %d, after the last: %d", l.After(""), l.After("~"))
	}
}
