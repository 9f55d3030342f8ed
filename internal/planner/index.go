package planner

import (
	"context"
	"math"
	"math/bits"
	"slices"
)

// checker makes planning stoppable: every loop whose length the request controls ticks it, and
// every checkEvery ticks it asks the context whether planning should stop. The first error sticks,
// so deep loops only need to look at err.
type checker struct {
	ctx   context.Context
	ticks int
	err   error
	// checks counts the context checks made and work the ticks (tests assert how often planning
	// looks, and how the work grows with the request).
	checks int
	work   int64
}

// checkEvery bounds the work between two looks at the context: a tick is at most a few hundred
// nanoseconds (an index node, a block, a run of a copy), so planning notices a cancellation well
// within 100 ms.
const checkEvery = 1024

func newChecker(ctx context.Context) *checker {
	if ctx == nil {
		ctx = context.Background()
	}
	return &checker{ctx: ctx}
}

// tick counts n units of work and reports whether planning must stop.
func (c *checker) tick(n int) bool {
	if c.err != nil {
		return true
	}
	c.work += int64(n)
	if c.ticks += n; c.ticks >= checkEvery {
		c.ticks = 0
		c.checks++
		c.err = c.ctx.Err()
	}
	return c.err != nil
}

// blockIndex answers "which blocks meet this box" in about O(log n + k) for the block layouts
// requests use (grids, stacks, column and row slabs), instead of testing every block: a bounding
// volume hierarchy, each node split at the median of the block centres along its widest
// dimension, leaves of at most leafBlocks blocks.
//
// Tables whose blocks differ along one dimension only (row or column slabs, stacked experts or
// heads, the common huge tables) get a sorted list instead: when their intervals along it are
// disjoint, no two blocks overlap and a box finds its blocks by binary search.
type blockIndex struct {
	rank   int
	n      int     // blocks
	bounds []int64 // around every block: lo[rank] then hi[rank]
	boxes  []int64 // per stored block: lo[rank] then hi[rank], in leaf order
	ids    []int32 // per stored block: its position in the tensor's blocks
	nodes  []bvhNode
	lohi   []int64 // per node: the bounds of its blocks, lo[rank] then hi[rank]
	// line: the blocks are disjoint intervals along dimension dim, sorted, and share one range
	// along every other dimension (that of boxes[0:2*rank] before sorting, kept in common).
	line   bool
	dim    int
	lo, hi []int64 // the sorted intervals along dim
	common []int64 // lo[rank] then hi[rank]
}

type bvhNode struct {
	left, right int32 // children; left < 0 for a leaf
	from, to    int32 // a leaf's range of boxes and ids
}

const leafBlocks = 8

// newBlockIndex indexes blocks; it returns nil when c stops planning.
func newBlockIndex(blocks []blockSpec, c *checker) *blockIndex {
	rank := 0
	if len(blocks) > 0 {
		rank = len(blocks[0].Offsets)
	}
	x := &blockIndex{rank: rank, n: len(blocks), bounds: make([]int64, 2*rank)}
	if x.tryLine(blocks, c) || c.err != nil {
		if c.err != nil {
			return nil
		}
		copy(x.bounds, x.common)
		x.bounds[x.dim], x.bounds[rank+x.dim] = x.lo[0], x.hi[len(x.hi)-1]
		return x
	}
	n := len(blocks)
	boxes := make([]int64, 2*rank*n)
	perm := make([]int32, n)
	for i := range blocks {
		perm[i] = int32(i)
		b := boxes[2*rank*i:]
		for d := range rank {
			b[d], b[rank+d] = blocks[i].Offsets[d], blocks[i].Offsets[d]+blocks[i].Lengths[d]
		}
	}
	if n > 0 {
		x.nodes = make([]bvhNode, 0, n/2+2) // leaves hold 4 to 8 blocks
		x.lohi = make([]int64, 0, 2*rank*cap(x.nodes))
		x.build(boxes, perm, 0, n, c)
	}
	if c.err != nil {
		return nil
	}
	if n > 0 {
		copy(x.bounds, x.lohi[:2*rank]) // the root's
	}
	// Store the boxes in leaf order, so a leaf's boxes are contiguous.
	x.boxes = make([]int64, len(boxes))
	for i, p := range perm {
		copy(x.boxes[2*rank*i:2*rank*(i+1)], boxes[2*rank*int(p):])
	}
	x.ids = perm
	return x
}

// tryLine makes x a line index when the blocks vary along one dimension only and are disjoint
// along it; otherwise it reports false and x is left for the hierarchy.
func (x *blockIndex) tryLine(blocks []blockSpec, c *checker) bool {
	n, rank := len(blocks), x.rank
	if n < 2 || rank == 0 {
		return false
	}
	first := &blocks[0]
	dim := -1
	for d := range rank {
		for i := range blocks {
			if blocks[i].Offsets[d] != first.Offsets[d] || blocks[i].Lengths[d] != first.Lengths[d] {
				if dim >= 0 && dim != d {
					return false // a second dimension varies
				}
				dim = d
				break
			}
		}
		if c.tick(n) {
			return false
		}
	}
	if dim < 0 {
		return false // all alike: they overlap, and the hierarchy reports it
	}
	keys := make([]keyed, n)
	for i := range keys {
		keys[i] = keyed{uint64(blocks[i].Offsets[dim]), int32(i)}
	}
	if keys = radixSort(keys, c); keys == nil {
		return false
	}
	ids := make([]int32, n)
	for i, k := range keys {
		ids[i] = k.id
	}
	lo, hi := make([]int64, n), make([]int64, n)
	for i, id := range ids {
		b := &blocks[id]
		lo[i], hi[i] = b.Offsets[dim], b.Offsets[dim]+b.Lengths[dim]
		if i > 0 && lo[i] < hi[i-1] {
			return false // an overlap: the hierarchy finds the first one in request order
		}
	}
	x.line, x.dim, x.ids, x.lo, x.hi = true, dim, ids, lo, hi
	x.common = make([]int64, 2*rank)
	for d := range rank {
		x.common[d], x.common[rank+d] = first.Offsets[d], first.Offsets[d]+first.Lengths[d]
	}
	return true
}

type keyed struct {
	key uint64
	id  int32
}

// radixSort sorts by key, stably, 16 bits a pass (as many passes as the largest key needs),
// looking at c between chunks of work; nil when c stops planning.
func radixSort(a []keyed, c *checker) []keyed {
	var top uint64
	sorted := true
	for i := range a {
		top = max(top, a[i].key)
		sorted = sorted && (i == 0 || a[i-1].key <= a[i].key)
	}
	if sorted {
		return a
	}
	if c.tick(len(a)) {
		return nil
	}
	b := make([]keyed, len(a))
	var count [1 << 16]int
	for shift := uint(0); shift < uint(bits.Len64(top)); shift += 16 {
		clear(count[:])
		for i := range a {
			count[a[i].key>>shift&0xffff]++
		}
		sum := 0
		for d, n := range count {
			count[d], sum = sum, sum+n
		}
		for i := range a {
			d := a[i].key >> shift & 0xffff
			b[count[d]] = a[i]
			count[d]++
		}
		a, b = b, a
		if c.tick(2 * len(a)) {
			return nil
		}
	}
	return a
}

// build makes the node of perm[from:to] and returns its number. A node splits at the median of
// the block centres along the dimension where they spread most (judged on a sample of a large
// node); its bounds are its blocks' at a leaf and its children's union above, so a level of the
// tree costs one pass over one key per block.
func (x *blockIndex) build(boxes []int64, perm []int32, from, to int, c *checker) int32 {
	rank := x.rank
	id := int32(len(x.nodes))
	x.nodes = append(x.nodes, bvhNode{left: -1, from: int32(from), to: int32(to)})
	at := len(x.lohi)
	x.lohi = append(x.lohi, make([]int64, 2*rank)...)
	leaf := func() int32 {
		lo, hi := x.lohi[at:at+rank], x.lohi[at+rank:at+2*rank]
		for k, p := range perm[from:to] {
			b := boxes[2*rank*int(p):]
			for d := range rank {
				if k == 0 || b[d] < lo[d] {
					lo[d] = b[d]
				}
				if k == 0 || b[rank+d] > hi[d] {
					hi[d] = b[rank+d]
				}
			}
		}
		return id
	}
	if to-from <= leafBlocks || c.tick(to-from) {
		return leaf()
	}
	dim := x.widest(boxes, perm[from:to], max(1, (to-from)/256))
	if dim < 0 {
		dim = x.widest(boxes, perm[from:to], 1) // the sample saw one centre: look at them all
	}
	if dim < 0 { // every centre is the same point: these blocks overlap one another, keep them together
		return leaf()
	}
	mid := (from + to) / 2
	key := func(p int32) int64 { return boxes[2*rank*int(p)+dim] + boxes[2*rank*int(p)+rank+dim] }
	selectNth(perm[from:to], mid-from, key)
	left := x.build(boxes, perm, from, mid, c)
	right := x.build(boxes, perm, mid, to, c)
	x.nodes[id].left, x.nodes[id].right = left, right
	l, r := 2*rank*int(left), 2*rank*int(right)
	for d := range rank {
		x.lohi[at+d] = min(x.lohi[l+d], x.lohi[r+d])
		x.lohi[at+rank+d] = max(x.lohi[l+rank+d], x.lohi[r+rank+d])
	}
	return id
}

// widest is the dimension along which the centres (2·lo + length, in whole numbers) of every
// step-th block spread most, or -1 when they are one point.
func (x *blockIndex) widest(boxes []int64, perm []int32, step int) int {
	rank := x.rank
	dim, spread := -1, int64(0)
	for d := range rank {
		lo, hi := int64(math.MaxInt64), int64(math.MinInt64)
		for i := 0; i < len(perm); i += step {
			b := boxes[2*rank*int(perm[i]):]
			centre := b[d] + b[rank+d]
			lo, hi = min(lo, centre), max(hi, centre)
		}
		if hi-lo > spread {
			dim, spread = d, hi-lo
		}
	}
	return dim
}

// selectNth reorders p so that p[nth] has the key it would have sorted, with no greater key
// before it and no smaller one after it: quickselect with a three-way partition, falling back to
// a sort (O(n log n) at worst) when the pivots keep being poor.
func selectNth(p []int32, nth int, key func(int32) int64) {
	lo, hi := 0, len(p)
	budget := 2*bits.Len(uint(len(p))) + 4
	rnd := uint64(len(p))*0x9E3779B97F4A7C15 | 1 // xorshift: pivots the input's order cannot predict
	for hi-lo > 12 {
		if budget--; budget < 0 {
			slices.SortFunc(p[lo:hi], func(a, b int32) int { return cmp64(key(a), key(b)) })
			return
		}
		at := func() int64 {
			rnd ^= rnd << 13
			rnd ^= rnd >> 7
			rnd ^= rnd << 17
			return key(p[lo+int(rnd%uint64(hi-lo))])
		}
		a, b, m := at(), at(), at()
		pivot := max(min(a, b), min(max(a, b), m)) // the median of three
		lt, i, gt := lo, lo, hi
		for i < gt {
			switch k := key(p[i]); {
			case k < pivot:
				p[lt], p[i] = p[i], p[lt]
				lt++
				i++
			case k > pivot:
				gt--
				p[i], p[gt] = p[gt], p[i]
			default:
				i++
			}
		}
		switch {
		case nth < lt:
			hi = lt
		case nth >= gt:
			lo = gt
		default:
			return
		}
	}
	slices.SortFunc(p[lo:hi], func(a, b int32) int { return cmp64(key(a), key(b)) })
}

func cmp64(a, b int64) int {
	switch {
	case a < b:
		return -1
	case a > b:
		return 1
	}
	return 0
}

// query appends to out the positions of the blocks that share an element with the box
// [off, off+lengths), in increasing order (the order of the request), and returns it. It stops
// early, returning what it has, when c stops planning.
func (x *blockIndex) query(off, lengths []int64, out []int32, c *checker) []int32 {
	start := len(out)
	out = x.collect(off, lengths, out, c)
	if !slices.IsSorted(out[start:]) {
		sortIDs(out[start:], c)
	}
	return out
}

// collect is query without the sort: the blocks in index order.
func (x *blockIndex) collect(off, lengths []int64, out []int32, c *checker) []int32 {
	if x == nil || x.n == 0 {
		return out
	}
	rank := x.rank
	inside := true // a box around every block (a whole tensor, as a rule) meets them all
	for d := range rank {
		inside = inside && off[d] <= x.bounds[d] && x.bounds[rank+d] <= off[d]+lengths[d]
	}
	if inside {
		if c.tick(x.n) {
			return out
		}
		out = slices.Grow(out, x.n)
		for i := range int32(x.n) {
			out = append(out, i)
		}
		return out
	}
	if x.line {
		for d := range rank {
			if d != x.dim && (x.common[d] >= off[d]+lengths[d] || x.common[rank+d] <= off[d]) {
				return out
			}
		}
		lo, hi := off[x.dim], off[x.dim]+lengths[x.dim]
		i, _ := slices.BinarySearch(x.hi, lo+1) // the first interval ending after lo
		for ; i < len(x.lo) && x.lo[i] < hi; i++ {
			if c.tick(1) {
				return out
			}
			out = append(out, x.ids[i])
		}
		return out
	}
	meets := func(lo, hi []int64) bool {
		for d := range rank {
			if lo[d] >= off[d]+lengths[d] || hi[d] <= off[d] {
				return false
			}
		}
		return true
	}
	var stack [64]int32
	todo := append(stack[:0], 0)
	for len(todo) > 0 {
		n := todo[len(todo)-1]
		todo = todo[:len(todo)-1]
		if c.tick(1) {
			return out
		}
		at := 2 * rank * int(n)
		if !meets(x.lohi[at:at+rank], x.lohi[at+rank:at+2*rank]) {
			continue
		}
		node := &x.nodes[n]
		if node.left >= 0 {
			todo = append(todo, node.right, node.left)
			continue
		}
		c.tick(int(node.to - node.from))
		for i := node.from; i < node.to; i++ {
			b := x.boxes[2*rank*int(i):]
			if meets(b[:rank], b[rank:2*rank]) {
				out = append(out, x.ids[i])
			}
		}
	}
	return out
}

// anyOverlap reports whether two blocks share an element, asking the hierarchy once per leaf (for
// the blocks meeting the leaf's bounds) rather than once per block.
func (x *blockIndex) anyOverlap(c *checker) bool {
	if x == nil || x.line || x.n < 2 {
		return false
	}
	rank := x.rank
	var near []int32 // positions in leaf order
	for l := range x.nodes {
		leaf := &x.nodes[l]
		if leaf.left >= 0 {
			continue
		}
		at := 2 * rank * l
		lo, hi := x.lohi[at:at+rank], x.lohi[at+rank:at+2*rank]
		near = near[:0]
		var stack [64]int32
		todo := append(stack[:0], 0)
		for len(todo) > 0 {
			n := todo[len(todo)-1]
			todo = todo[:len(todo)-1]
			if c.tick(1) {
				return false
			}
			if !boxesMeet(x.lohi[2*rank*int(n):], lo, hi, rank) {
				continue
			}
			if node := &x.nodes[n]; node.left >= 0 {
				todo = append(todo, node.right, node.left)
			} else {
				for i := node.from; i < node.to; i++ {
					if boxesMeet(x.boxes[2*rank*int(i):], lo, hi, rank) {
						near = append(near, i)
					}
				}
			}
		}
		c.tick(len(near) * int(leaf.to-leaf.from))
		for i := leaf.from; i < leaf.to; i++ {
			bi := x.boxes[2*rank*int(i):]
			for _, j := range near {
				if j != i && boxesMeet(x.boxes[2*rank*int(j):], bi[:rank], bi[rank:2*rank], rank) {
					return true
				}
			}
		}
	}
	return false
}

// boxesMeet reports whether the box b (lo[rank] then hi[rank]) shares an element with [lo, hi).
func boxesMeet(b []int64, lo, hi []int64, rank int) bool {
	for d := range rank {
		if b[d] >= hi[d] || b[rank+d] <= lo[d] {
			return false
		}
	}
	return true
}

// sortIDs sorts block positions: a radix sort when there are many (a box over a million blocks).
func sortIDs(ids []int32, c *checker) {
	if len(ids) < 1<<12 {
		slices.Sort(ids)
		return
	}
	keys := make([]keyed, len(ids))
	for i, id := range ids {
		keys[i] = keyed{uint64(id), id}
	}
	if keys = radixSort(keys, c); keys != nil {
		for i, k := range keys {
			ids[i] = k.id
		}
	}
}
