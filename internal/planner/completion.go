package planner

import (
	"fmt"
	"slices"
	"strings"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// completions are the deferred ops this server runs, by op name. A completion is one file of this
// package (its validation, its kernel and the kernel's numerics) plus its line here.
var completions = map[string]completion{
	string(api.Fp8BlockDequant): blockDequant{},
	string(api.Mxfp4Dequant):    mxfp4Dequant{},
	string(api.LoraMerge):       loraMerge{},
}

// A completion computes a destination tensor whole from checkpoint tensors. Completions are
// elementwise-local or row-local, so they are planned like blocks: each segment is one kernel that
// reads only the parts of the sources its box needs, never a whole tensor.
type completion interface {
	// sources is how many checkpoint tensors the op takes.
	sources() int
	// validate checks the op's sources and params against the tensor request; it returns nil
	// having reported what is wrong on c.
	validate(c *completionCheck) completionSpec
}

// A completionSpec is a validated completion of one tensor.
type completionSpec interface {
	// kernel computes the box (off, lens) of the tensor, which is all of one segment.
	kernel(off, lens []int64) Kernel
}

// deferredSpec is a validated completion with the sources it names.
type deferredSpec struct {
	spec    completionSpec
	sources []*checkpoint.Tensor
}

// completionCheck is what a completion validates: the tensor request (at JSON pointer ptr), its
// dtype, the checkpoint, and the errors found so far.
type completionCheck struct {
	*errs
	ptr     string // the tensor's; the op's is ptr + "/deferred"
	t       *api.TensorRequest
	dst     tensor.DType
	ck      *checkpoint.Checkpoint
	sources []*checkpoint.Tensor // as source looked them up
	before  int                  // the errors found before the tensor's deferred op was checked
}

// op is the JSON pointer of the deferred op, plus suffix.
func (c *completionCheck) op(suffix string) string { return c.ptr + "/deferred" + suffix }

// source looks up source i in the checkpoint, reporting it when it is missing.
func (c *completionCheck) source(i int) (*checkpoint.Tensor, bool) {
	name := c.t.Deferred.Sources[i]
	st, ok := c.ck.Tensors[name]
	if !ok {
		c.add(c.op(fmt.Sprintf("/sources/%d", i)), "checkpoint %q has no tensor %q", c.ck.Name, name)
		return nil, false
	}
	c.sources[i] = st
	return st, true
}

// completionNames lists the registered ops for an error message: "a, b and c".
func completionNames() string {
	names := make([]string, 0, len(completions))
	for name := range completions {
		names = append(names, name)
	}
	slices.Sort(names)
	if len(names) < 2 {
		return strings.Join(names, "")
	}
	return strings.Join(names[:len(names)-1], ", ") + " and " + names[len(names)-1]
}

func validateDeferred(e *errs, tptr string, t *api.TensorRequest, dst tensor.DType,
	ck *checkpoint.Checkpoint) *deferredSpec {
	d := t.Deferred
	ptr := tptr + "/deferred"
	before := len(e.Errors)
	op, known := completions[string(d.Op)]
	if !known {
		e.schema(ptr+"/op", "unknown op %q: this server runs %s", d.Op, completionNames())
		return nil
	}
	if t.Blocks != nil && len(*t.Blocks) > 0 {
		e.add(ptr, "a tensor computed by a completion takes no blocks: the completion covers it whole")
	}
	if t.Fill != nil {
		e.add(ptr, "a tensor computed by a completion takes no fill: the completion covers it whole")
	}
	if want := op.sources(); len(d.Sources) != want {
		e.add(ptr+"/sources", "%s needs %d sources, got %d", d.Op, want, len(d.Sources))
		return nil
	}
	for i, name := range d.Sources {
		if j := slices.Index(d.Sources, name); j < i {
			e.add(fmt.Sprintf("%s/sources/%d", ptr, i), "sources must be distinct: %q is also source %d", name, j)
			return nil
		}
	}
	c := &completionCheck{errs: e, ptr: tptr, t: t, dst: dst, ck: ck, before: before,
		sources: make([]*checkpoint.Tensor, len(d.Sources))}
	spec := op.validate(c)
	if spec == nil {
		return nil
	}
	return &deferredSpec{spec: spec, sources: c.sources}
}

// completionSegment plans one segment of a completion: its kernel and the reads of the source
// regions the kernel needs.
func (s *segmenter) completionSegment(d *deferredSpec, off, lens []int64, seg *Segment) (needed int64, reads []Read,
	err error) {
	k := d.spec.kernel(off, lens)
	for _, r := range k.Sources(nil) {
		if reads, err = s.regionReads(reads, r); err != nil {
			return 0, nil, err
		}
		needed += touched(r.Lengths, r.Strides) * r.Elem
	}
	seg.Kernels = append(seg.Kernels, k)
	return needed, reads, nil
}
