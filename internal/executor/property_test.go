package executor_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/executor"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

// value is one element as the brute-force evaluator holds it.
type value struct {
	f float64 // floats, exactly
	i int64   // signed integers
	u uint64  // unsigned integers and BOOL
}

func isFloat(d tensor.DType) bool { return d.IsFloat() }
func isSigned(d tensor.DType) bool {
	return d == tensor.I8 || d == tensor.I16 || d == tensor.I32 || d == tensor.I64
}

// round32 rounds a float64 to dtype d (at most 32 bits) the way docs/numerics.md says: to float32 first.
func round32(d tensor.DType, x float64) float64 {
	f := float32(x)
	switch d {
	case tensor.BF16:
		return float64(tensor.F32FromBF16(tensor.BF16FromF32(f)))
	case tensor.F16:
		return float64(tensor.F32FromF16(tensor.F16FromF32(f)))
	case tensor.F8E4M3:
		return float64(tensor.F32FromE4M3(tensor.E4M3FromF32(f)))
	case tensor.F8E5M2:
		return float64(tensor.F32FromE5M2(tensor.E5M2FromF32(f)))
	}
	return float64(f)
}

func load(d tensor.DType, b []byte) value {
	le := binary.LittleEndian
	switch d {
	case tensor.F32:
		return value{f: float64(math.Float32frombits(le.Uint32(b)))}
	case tensor.F64:
		return value{f: math.Float64frombits(le.Uint64(b))}
	case tensor.BF16:
		return value{f: float64(tensor.F32FromBF16(le.Uint16(b)))}
	case tensor.F16:
		return value{f: float64(tensor.F32FromF16(le.Uint16(b)))}
	case tensor.F8E4M3:
		return value{f: float64(tensor.F32FromE4M3(b[0]))}
	case tensor.F8E5M2:
		return value{f: float64(tensor.F32FromE5M2(b[0]))}
	case tensor.BOOL:
		if b[0] != 0 {
			return value{u: 1, i: 1}
		}
		return value{}
	case tensor.I8:
		return value{i: int64(int8(b[0]))}
	case tensor.I16:
		return value{i: int64(int16(le.Uint16(b)))}
	case tensor.I32:
		return value{i: int64(int32(le.Uint32(b)))}
	case tensor.I64:
		return value{i: int64(le.Uint64(b))}
	case tensor.U8:
		return value{u: uint64(b[0])}
	case tensor.U16:
		return value{u: uint64(le.Uint16(b))}
	case tensor.U32:
		return value{u: uint64(le.Uint32(b))}
	}
	return value{u: le.Uint64(b)}
}

// convert moves v from dtype w to dtype t, as copy_ would.
func convert(v value, w, t tensor.DType) value {
	switch {
	case isFloat(w) && t == tensor.F64:
		return v
	case isFloat(w):
		return value{f: round32(t, v.f)}
	case isFloat(t) && isSigned(w):
		if t == tensor.F64 {
			return value{f: float64(v.i)}
		}
		return value{f: round32(t, float64(float32(v.i)))}
	case isFloat(t):
		if t == tensor.F64 {
			return value{f: float64(v.u)}
		}
		return value{f: round32(t, float64(float32(v.u)))}
	case w == tensor.BOOL:
		return value{i: int64(v.u), u: v.u}
	}
	return v
}

func store1(d tensor.DType, v value) []byte {
	out := make([]byte, d.Size())
	le := binary.LittleEndian
	switch d {
	case tensor.F32:
		le.PutUint32(out, math.Float32bits(float32(v.f)))
	case tensor.F64:
		le.PutUint64(out, math.Float64bits(v.f))
	case tensor.BF16:
		le.PutUint16(out, tensor.BF16FromF32(float32(v.f)))
	case tensor.F16:
		le.PutUint16(out, tensor.F16FromF32(float32(v.f)))
	case tensor.F8E4M3:
		out[0] = tensor.E4M3FromF32(float32(v.f))
	case tensor.F8E5M2:
		out[0] = tensor.E5M2FromF32(float32(v.f))
	case tensor.I8, tensor.I16, tensor.I32, tensor.I64:
		for i := range out {
			out[i] = byte(v.i >> (8 * i))
		}
	default:
		for i := range out {
			out[i] = byte(v.u >> (8 * i))
		}
	}
	return out
}

// evaluate is post(source) then the store into dst, element by element, straight from docs/numerics.md.
func evaluate(src tensor.DType, ops []tensor.Op, dst tensor.DType, b []byte) []byte {
	v := load(src, b)
	w := src
	if w.IsFP8() {
		w = tensor.F32
	}
	for _, op := range ops {
		if op.Kind == tensor.OpCast {
			v = convert(v, w, op.DType)
			w = op.DType
			if w.IsFP8() {
				w = tensor.F32
			}
			continue
		}
		if w == tensor.F64 {
			switch op.Kind {
			case tensor.OpNeg:
				v.f = -v.f
			case tensor.OpMul:
				v.f *= op.Value
			case tensor.OpAdd:
				v.f += op.Value
			case tensor.OpExp:
				v.f = math.Exp(v.f)
			}
			continue
		}
		x, operand := float32(v.f), float32(round32(w, op.Value))
		switch op.Kind {
		case tensor.OpNeg:
			x = -x
		case tensor.OpMul:
			x *= operand
		case tensor.OpAdd:
			x += operand
		case tensor.OpExp:
			x = float32(math.Exp(float64(x)))
		}
		v.f = round32(w, float64(x))
	}
	return store1(dst, convert(v, w, dst))
}

type srcTensor struct {
	name  string
	dtype tensor.DType
	shape []int64
	data  []byte
}

func (s *srcTensor) at(idx []int64) []byte {
	off := int64(0)
	for d, x := range idx {
		off = off*s.shape[d] + x
	}
	n := int64(s.dtype.Size())
	return s.data[off*n : (off+1)*n]
}

type box struct{ off, len []int64 }

func guillotine(r *rand.Rand, b box, depth int) []box {
	var cuttable []int
	for d, n := range b.len {
		if n > 1 {
			cuttable = append(cuttable, d)
		}
	}
	if depth == 0 || len(cuttable) == 0 || r.Float64() < 0.25 {
		return []box{b}
	}
	d := cuttable[r.IntN(len(cuttable))]
	c := 1 + r.Int64N(b.len[d]-1)
	lo, hi := box{slices.Clone(b.off), slices.Clone(b.len)}, box{slices.Clone(b.off), slices.Clone(b.len)}
	lo.len[d] = c
	hi.off[d] += c
	hi.len[d] -= c
	return append(guillotine(r, lo, depth-1), guillotine(r, hi, depth-1)...)
}

func randomOps(r *rand.Rand, src, dst tensor.DType) []tensor.Op {
	for range 20 {
		var ops []tensor.Op
		for range r.IntN(4) {
			switch r.IntN(6) {
			case 0:
				ops = append(ops, tensor.Op{Kind: tensor.OpNeg})
			case 1:
				ops = append(ops, tensor.Op{Kind: tensor.OpMul, Value: r.NormFloat64() * 3})
			case 2:
				ops = append(ops, tensor.Op{Kind: tensor.OpAdd, Value: r.NormFloat64()})
			case 3:
				ops = append(ops, tensor.Op{Kind: tensor.OpExp})
			default:
				ops = append(
					ops,
					tensor.Op{Kind: tensor.OpCast, DType: tensor.AllDTypes[r.IntN(len(tensor.AllDTypes))]},
				)
			}
		}
		if _, err := tensor.NewPipeline(src, ops, dst); err == nil {
			return ops
		}
	}
	return nil
}

func apiOps(ops []tensor.Op) *[]api.PostOp {
	if len(ops) == 0 {
		return nil
	}
	out := make([]api.PostOp, len(ops))
	for i, op := range ops {
		out[i].Op = api.PostOpOp(op.Kind.String())
		switch op.Kind {
		case tensor.OpMul, tensor.OpAdd:
			v := op.Value
			out[i].Value = &v
		case tensor.OpCast:
			d := api.DType(op.DType.String())
			out[i].Dtype = &d
		}
	}
	return &out
}

// TestPropertyAgainstBruteForce plans and executes random layouts and checks every element of the
// body against the block formula evaluated element by element.
func TestPropertyAgainstBruteForce(t *testing.T) {
	iterations := 1000
	if testing.Short() {
		iterations = 200
	}
	for iter := range iterations {
		t.Run(fmt.Sprint(iter), func(t *testing.T) { propertyCase(t, uint64(iter)) })
	}
}

func propertyCase(t *testing.T, seed uint64) {
	r := rand.New(rand.NewPCG(seed, 99))
	dst := tensor.AllDTypes[r.IntN(len(tensor.AllDTypes))]
	rank := r.IntN(5)
	shape := make([]int64, rank)
	for d := range shape {
		shape[d] = 1 + r.Int64N(6)
	}
	var fill *json.Number
	if r.Float64() < 0.3 {
		f := float64(r.IntN(2))
		if dst.IsFloat() {
			f = r.NormFloat64() * 10
		}
		n := json.Number(strconv.FormatFloat(f, 'g', -1, 64))
		fill = &n
	}
	blocks := guillotine(r, box{make([]int64, rank), slices.Clone(shape)}, 4)
	var srcs []*srcTensor
	var apiBlocks []api.Block
	type planned struct {
		box
		src   *srcTensor
		base  []int64
		coeff [][]int64
		ops   []tensor.Op
	}
	var table []planned
	for bi, b := range blocks {
		if fill != nil && r.Float64() < 0.3 {
			continue // left to the fill
		}
		srank := 1 + r.IntN(3)
		coeff := make([][]int64, srank)
		for s := range coeff {
			coeff[s] = make([]int64, rank)
		}
		for a := range rank { // each destination dim walks one source dim with a step in 0..3
			s := r.IntN(srank)
			coeff[s][a] = []int64{0, 1, 1, 1, 2, 3}[r.IntN(6)]
		}
		base := make([]int64, srank)
		sshape := make([]int64, srank)
		for s := range srank {
			base[s] = r.Int64N(3)
			reach := base[s]
			for a := range rank {
				reach += coeff[s][a] * (b.len[a] - 1)
			}
			sshape[s] = reach + 1 + r.Int64N(3)
		}
		var src *srcTensor
		if len(srcs) > 0 && r.Float64() < 0.3 { // reuse a source tensor: grow it to fit
			src = srcs[r.IntN(len(srcs))]
			if len(src.shape) != srank {
				src = nil
			} else {
				for s := range srank {
					src.shape[s] = max(src.shape[s], sshape[s])
				}
			}
		}
		if src == nil {
			// Mostly a dtype that can reach dst; sometimes any, to see the 422.
			var legal []tensor.DType
			for _, d := range tensor.AllDTypes {
				if tensor.CanConvert(d, dst) || r.Float64() < 0.05 {
					legal = append(legal, d)
				}
			}
			src = &srcTensor{name: fmt.Sprintf("src.%d", bi), dtype: legal[r.IntN(len(legal))], shape: sshape}
			srcs = append(srcs, src)
		}
		table = append(table, planned{box: b, src: src, base: base, coeff: coeff})
	}
	for _, s := range srcs {
		n := int64(s.dtype.Size())
		for _, d := range s.shape {
			n *= d
		}
		s.data = make([]byte, n)
		for i := range s.data {
			s.data[i] = byte(r.IntN(256))
		}
	}
	for i := range table {
		p := &table[i]
		p.ops = randomOps(r, p.src.dtype, dst)
		apiBlocks = append(
			apiBlocks,
			api.Block{
				Offsets: p.off,
				Lengths: p.len,
				Source:  p.src.name,
				Base:    p.base,
				Coeff:   p.coeff,
				Post:    apiOps(p.ops),
			},
		)
	}
	var boxes []api.Box
	for range 1 + r.IntN(3) {
		b := box{make([]int64, rank), make([]int64, rank)}
		for d := range rank {
			b.off[d] = r.Int64N(shape[d])
			b.len[d] = 1 + r.Int64N(shape[d]-b.off[d])
		}
		boxes = append(boxes, api.Box{Offsets: b.off, Lengths: b.len})
	}
	format := api.Raw
	if r.Float64() < 0.3 {
		format = api.Safetensors
	}
	req := &api.ShardRequest{Checkpoint: "ck", Format: &format, Tensors: []api.TensorRequest{{
		Name: "dst", Dtype: api.DType(dst.String()), Shape: shape, Boxes: boxes, Fill: fill, Blocks: &apiBlocks}}}

	dir := t.TempDir()
	var files []safetensors.TensorData
	for _, s := range srcs {
		files = append(
			files,
			safetensors.TensorData{Name: s.name, DType: s.dtype.String(), Shape: s.shape, Data: s.data},
		)
	}
	var buf bytes.Buffer
	safetensors.Write(&buf, files, nil)
	os.MkdirAll(filepath.Join(dir, "ck"), 0o755)
	os.WriteFile(filepath.Join(dir, "ck", "model.safetensors"), buf.Bytes(), 0o644)
	st, _ := store.NewLocal(dir)
	ck, err := checkpoint.New(st).Open(context.Background(), "ck")
	if err != nil {
		t.Fatal(err)
	}
	opts := planner.Options{
		SegmentBytes:     1 + r.Int64N(256),
		SegmentReadBytes: 1 + r.Int64N(512),
		MaxGap:           r.Int64N(64),
		MaxRead:          1 + r.Int64N(64),
		MaxReads:         1 << 20,
		MaxOverread:      r.Int64N(4),
		Align:            r.Int64N(3) * 16,
	}
	plan, err := planner.New(req, ck, opts)
	legal := true
	for _, p := range table {
		if _, perr := tensor.NewPipeline(p.src.dtype, p.ops, dst); perr != nil {
			legal = false
		}
	}
	if !legal {
		if _, ok := err.(*planner.ValidationError); !ok {
			t.Fatalf("an impossible conversion was planned: %v", err)
		}
		t.Skip("refused")
	}
	if err != nil {
		t.Fatalf("plan: %v\nrequest: %+v", err, req)
	}
	var from store.Store = st // file sections for direct segments
	if r.IntN(2) == 0 {
		from = struct{ store.Store }{st} // every segment through buffers
	}
	mem := budget.New(budget.Config{Bytes: 1 + r.Int64N(4096), AdmitWait: time.Second})
	// File sections sent, copied, or copied and hashed with the rest of the body.
	to := []executor.Output{{Sendfile: true}, {}, {Hash: sha256.New()}}[r.IntN(3)]
	stream, err := executor.New(from, mem, executor.Config{
		Window:      1 + r.IntN(4),
		StreamBytes: 1 + r.Int64N(4096),
		SocketBytes: 1 + r.Int64N(64),
	}).Stream(context.Background(), plan, to)
	if err != nil {
		t.Fatal(err)
	}
	defer stream.Close()
	var out bytes.Buffer
	if _, err := stream.WriteTo(readFromBuffer{&out}); err != nil {
		t.Fatal(err)
	}
	body := out.Bytes()
	if int64(len(body)) != plan.BodyBytes {
		t.Fatalf("body is %d bytes, Content-Length says %d", len(body), plan.BodyBytes)
	}
	if want := sha256.Sum256(body); to.Hash != nil && !bytes.Equal(stream.Sum(), want[:]) {
		t.Fatalf("the stream's hash is not the SHA-256 of its body")
	}
	var fillBytes []byte
	if fill != nil {
		fillBytes, _ = tensor.EncodeFill(dst, fill.String())
	}
	// The expected bytes of each box, element by element.
	expect := func(b api.Box) []byte {
		var out []byte
		n := int64(1)
		for _, l := range b.Lengths {
			n *= l
		}
		x := make([]int64, rank)
		for e := range n {
			rem := e
			for d := rank - 1; d >= 0; d-- {
				x[d] = b.Offsets[d] + rem%b.Lengths[d]
				rem /= b.Lengths[d]
			}
			var got []byte
			for _, p := range table {
				inside := true
				for d := range rank {
					inside = inside && x[d] >= p.off[d] && x[d] < p.off[d]+p.len[d]
				}
				if !inside {
					continue
				}
				si := slices.Clone(p.base)
				for s := range si {
					for a := range rank {
						si[s] += p.coeff[s][a] * (x[a] - p.off[a])
					}
				}
				got = evaluate(p.src.dtype, p.ops, dst, p.src.at(si))
				break
			}
			if got == nil {
				got = fillBytes
			}
			out = append(out, got...)
		}
		return out
	}
	if format == api.Raw {
		var want []byte
		for _, b := range boxes {
			want = append(want, expect(b)...)
		}
		if !bytes.Equal(body, want) {
			t.Fatalf(
				"body differs from the brute-force evaluation\nshape %v dst %s boxes %v\nblocks %+v\ngot  %v\nwant %v",
				shape,
				dst,
				boxes,
				table,
				body,
				want,
			)
		}
		return
	}
	n, err := safetensors.HeaderLen("body", body, int64(len(body)))
	if err != nil {
		t.Fatal(err)
	}
	h, err := safetensors.Parse("body", body[8:8+n], int64(len(body)))
	if err != nil {
		t.Fatalf("the safetensors body does not parse: %v", err)
	}
	if len(h.Tensors) != len(boxes) {
		t.Fatalf("%d tensors in the file, %d boxes", len(h.Tensors), len(boxes))
	}
	for _, ht := range h.Tensors {
		i := 0
		if len(boxes) > 1 {
			fmt.Sscanf(ht.Name, "dst#%d", &i)
		}
		if !bytes.Equal(body[ht.Begin:ht.End], expect(boxes[i])) || !slices.Equal(ht.Shape, boxes[i].Lengths) ||
			(ht.Begin-h.DataStart)%int64(dst.Size()) != 0 {
			t.Fatalf("stored tensor %s differs from box %d", ht.Name, i)
		}
	}
}
