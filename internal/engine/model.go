package engine

import (
	"encoding/json"
	"fmt"

	"github.com/shardsrv/shardsrv/api"
)

// model accumulates the parameters of one rank.
type model struct {
	cfg     config
	tensors map[string]TensorInfo
	par     Parallel
	rel     *release
	dtype   api.DType
	// blockN and blockK are the FP8 scale block (quantization_config.weight_block_size); zero
	// when the checkpoint is not block-quantized.
	blockN, blockK int64
	// mxfp4 is a checkpoint whose experts are MXFP4 (quant_method "mxfp4"), which only the
	// architectures in mxfp4Experts lay out.
	mxfp4 bool
	// attention is the group the attention's projections split over and embedding the
	// embedding's: the TP group, except where an engine's option narrows them (SGLang's DP
	// attention).
	attention, embedding tpGroup
	out                  []api.TensorRequest
}

// tpGroup is a tensor-parallel group a layer splits over: its size and this rank's place in it.
type tpGroup struct{ size, rank int64 }

// tp is the rank's whole tensor-parallel group.
func (m *model) tp() tpGroup { return tpGroup{m.par.TP, m.par.TPRank} }

func (m *model) readQuantization() error {
	q, _ := m.cfg["quantization_config"].(map[string]any)
	if q == nil {
		return nil
	}
	if config(q).str("quant_method") == "mxfp4" {
		if !mxfp4Experts[m.cfg.architecture()] {
			return checkpointError("MXFP4 quantization is laid out for gpt-oss only, not %s", m.cfg.architecture())
		}
		m.mxfp4 = true
		return nil
	}
	block, err := intList("quantization_config/weight_block_size", q["weight_block_size"])
	if err != nil {
		return err
	}
	if method := config(q).str("quant_method"); method != "fp8" || len(block) != 2 || block[0] < 1 || block[1] < 1 {
		return checkpointError(
			"quantization %q with weight_block_size %v is not laid out here; block-quantized FP8 is",
			method,
			block,
		)
	}
	m.blockN, m.blockK = block[0], block[1]
	return nil
}

// shape returns a checkpoint tensor's shape, checking its rank.
func (m *model) shape(name string, dims int) ([]int64, error) {
	t, ok := m.tensors[name]
	if !ok {
		return nil, checkpointError("the checkpoint has no tensor %q, which the architecture needs", name)
	}
	if len(t.Shape) != dims {
		return nil, checkpointError("%q has shape %v, not %d-d", name, t.Shape, dims)
	}
	return t.Shape, checkDims(name, t.Shape)
}

func (m *model) has(name string) bool { _, ok := m.tensors[name]; return ok }

// divide is vLLM's divide(): an exact split or a 422 naming what does not split.
func divide(what string, n, parts int64, pointer string) (int64, error) {
	if parts < 1 || n%parts != 0 {
		return 0, &Error{pointer, fmt.Sprintf("%s (%d) does not split evenly over %d ranks", what, n, parts)}
	}
	return n / parts, nil
}

func ceilDiv(a, b int64) int64 { return (a + b - 1) / b }

// param is one destination tensor under construction: the rank's parameter, whole.
type param struct{ t *api.TensorRequest }

func (m *model) param(name string, dtype api.DType, shape ...int64) param {
	if shape == nil {
		shape = []int64{} // a scalar: its shape and box are empty lists, not absent
	}
	blocks := []api.Block{}
	m.out = append(m.out, api.TensorRequest{Name: name, Dtype: dtype, Shape: shape, Blocks: &blocks,
		Boxes: []api.Box{{Offsets: make([]int64, len(shape)), Lengths: shape}}})
	return param{&m.out[len(m.out)-1]}
}

// place copies the box of src starting at base with the given lengths (one per source dimension)
// to dst, which may have leading dimensions the source lacks (the expert index of stacked
// experts); those are one long.
func (p param) place(src string, dst, base, lengths []int64) {
	lead := len(dst) - len(base)
	coeff := make([][]int64, len(base))
	full := make([]int64, len(dst))
	for i := range full {
		full[i] = 1
	}
	for s := range coeff {
		coeff[s] = make([]int64, len(dst))
		coeff[s][lead+s] = 1
		full[lead+s] = lengths[s]
	}
	*p.t.Blocks = append(*p.t.Blocks, api.Block{Offsets: dst, Lengths: full, Source: src, Base: base, Coeff: coeff})
}

// replicated is a checkpoint tensor every rank holds whole, in dtype.
func (m *model) replicated(name, src string, dtype api.DType) error {
	t, ok := m.tensors[src]
	if !ok {
		_, err := m.shape(src, 0)
		return err
	}
	p := m.param(name, dtype, t.Shape...)
	p.place(src, make([]int64, len(t.Shape)), make([]int64, len(t.Shape)), t.Shape)
	return nil
}

// norm lays out replicated layer-norm weights in the model dtype.
func (m *model) norm(names ...string) error {
	for _, name := range names {
		if err := m.replicated(name, name, m.dtype); err != nil {
			return err
		}
	}
	return nil
}

// vocabParallel lays out VocabParallelEmbedding / ParallelLMHead (vllm/model_executor/layers/
// vocab_parallel_embedding.py): the vocabulary is padded to a multiple of 64 (pad_vocab_size,
// DEFAULT_VOCAB_PADDING_SIZE), or of lcm(64, TP) on lines that pad so (vocabPaddingLCM), and then
// divided over g; rank r holds padded rows [r*per, (r+1)*per) and the rows past the real
// vocabulary are zeros (weight_loader fills them).
func (m *model) vocabParallel(g tpGroup, name, src string) error {
	sh, err := m.shape(src, 2)
	if err != nil {
		return err
	}
	unit := int64(64)
	if m.rel.vocabPaddingLCM {
		unit = lcm(unit, g.size) // TP <= 2^16, so the unit is under 2^22
	}
	return m.vocabRows(g, name, src, ceilDiv(sh[0], unit)*unit)
}

func lcm(a, b int64) int64 {
	g, h := a, b
	for h != 0 {
		g, h = h, g%h
	}
	return a / g * b
}

// kvScaleBuffers are the persistent buffers an Attention module registers on lines with
// attentionScales, in registration order.
var kvScaleBuffers = []string{"_k_scale", "_v_scale", "_q_scale", "_prob_scale"}

// attentionScales lays out the attention module's scale buffers at prefix (the Attention module's
// own prefix, e.g. model.layers.0.self_attn.attn.): F32 scalars holding 1.0, which vLLM keeps when
// the checkpoint has no KV-cache scales. A checkpoint that has them (an FP8 KV cache) would load
// its own values, which this layout does not place: it is refused.
func (m *model) attentionScales(prefix, module string) error {
	if !m.rel.attentionScales {
		return nil
	}
	for _, kv := range []string{"k", "v"} {
		for _, src := range []string{module + kv + "_scale", prefix + kv + "_scale", module + kv + "_proj." + kv + "_scale"} {
			if m.has(src) {
				return checkpointError(
					"the checkpoint carries KV-cache scales (%s); layouts place vLLM's default scales only", src)
			}
		}
	}
	one := json.Number("1")
	for _, b := range kvScaleBuffers {
		m.param(prefix+b, api.F32).t.Fill = &one
	}
	return nil
}

// vocabRows splits a [vocab, hidden] tensor padded to padded rows by rows over g; rows past the
// real vocabulary are zeros.
func (m *model) vocabRows(g tpGroup, name, src string, padded int64) error {
	sh, err := m.shape(src, 2)
	if err != nil {
		return err
	}
	vocab, hidden := sh[0], sh[1]
	per, err := divide("the padded vocabulary", padded, g.size, "/layout/tensor_parallel_size")
	if err != nil {
		return err
	}
	start := g.rank * per
	p := m.param(name, m.dtype, per, hidden)
	if real := min(per, vocab-start); real > 0 {
		p.place(src, []int64{0, 0}, []int64{start, 0}, []int64{real, hidden})
	}
	if start+per > vocab {
		zero := json.Number("0")
		p.t.Fill = &zero
	}
	return nil
}

// slab is the rows [index*n, (index+1)*n) of a linear layer's output features: one part of a
// (merged) column-parallel layer as the rank holds it.
type slab struct {
	module   string // the checkpoint module, e.g. model.layers.0.self_attn.q_proj
	index, n int64
}

// quantized reports whether a checkpoint module is FP8 block-quantized: its weight has a
// weight_scale_inv beside it.
func (m *model) quantized(module string) bool {
	return m.blockN > 0 && m.has(module+".weight_scale_inv")
}

// weightDType is the dtype a linear layer's weight keeps: the checkpoint's when quantized.
func (m *model) weightDType(module string) api.DType {
	if m.quantized(module) {
		return api.DType(m.tensors[module+".weight"].DType)
	}
	return m.dtype
}

// columnLinear lays out a (merged) column-parallel linear layer — ColumnParallelLinear,
// MergedColumnParallelLinear, QKVParallelLinear (vllm/model_executor/layers/linear.py) — as the
// concatenation of its parts' slabs; tp is the layer's TP size (1 with disable_tp). The bias, when
// the checkpoint has one, and an FP8 weight_scale_inv follow the weight: scale slabs in block units,
// at ceil(offset/block_n) as the block-quant branch of the weight loaders places them.
func (m *model) columnLinear(name string, tp int64, parts ...slab) error {
	var in, rows, total int64
	var sizes []int64
	quant := m.quantized(parts[0].module)
	for i, s := range parts {
		sh, err := m.shape(s.module+".weight", 2)
		if err != nil {
			return err
		}
		if i > 0 && sh[1] != in {
			return checkpointError(
				"%s.weight has %d input features where %s.weight has %d",
				s.module,
				sh[1],
				parts[0].module,
				in,
			)
		}
		if m.quantized(s.module) != quant {
			return checkpointError(
				"%s and %s are fused by the engine but only one is quantized",
				s.module,
				parts[0].module,
			)
		}
		if (s.index+1)*s.n > sh[0] {
			return checkpointError(
				"%s.weight has %d rows; the rank needs rows up to %d",
				s.module,
				sh[0],
				(s.index+1)*s.n,
			)
		}
		in, rows, total = sh[1], rows+s.n, total+sh[0]
		sizes = append(sizes, s.n)
	}
	if quant {
		if err := m.checkBlockShape(name, tp, in, in, total, sizes); err != nil {
			return err
		}
	}
	w := m.param(name+".weight", m.weightDType(parts[0].module), rows, in)
	var at int64
	for _, s := range parts {
		w.place(s.module+".weight", []int64{at, 0}, []int64{s.index * s.n, 0}, []int64{s.n, in})
		at += s.n
	}
	if m.has(parts[0].module + ".bias") {
		b := m.param(name+".bias", m.dtype, rows)
		at = 0
		for _, s := range parts {
			b.place(s.module+".bias", []int64{at}, []int64{s.index * s.n}, []int64{s.n})
			at += s.n
		}
	}
	if quant {
		cols := ceilDiv(in, m.blockK)
		sc := m.param(name+".weight_scale_inv", api.F32, ceilDiv(rows, m.blockN), cols)
		at = 0
		for _, s := range parts {
			n := ceilDiv(s.n, m.blockN)
			sc.place(
				s.module+".weight_scale_inv",
				[]int64{ceilDiv(at, m.blockN), 0},
				[]int64{s.index * n, 0},
				[]int64{n, cols},
			)
			at += s.n
		}
	}
	return nil
}

// rowLinear lays out RowParallelLinear over the TP group.
func (m *model) rowLinear(name, module string) error { return m.rowLinearOver(m.tp(), name, module) }

// rowLinearOver lays out RowParallelLinear over g: rank r holds input features
// [r*in/size, (r+1)*in/size).
func (m *model) rowLinearOver(g tpGroup, name, module string) error {
	sh, err := m.shape(module+".weight", 2)
	if err != nil {
		return err
	}
	out, in := sh[0], sh[1]
	per, err := divide(module+"'s input features", in, g.size, "/layout/tensor_parallel_size")
	if err != nil {
		return err
	}
	quant := m.quantized(module)
	if quant {
		if err := m.checkBlockShape(name, g.size, in, per, out, []int64{out}); err != nil {
			return err
		}
	}
	w := m.param(name+".weight", m.weightDType(module), out, per)
	w.place(module+".weight", []int64{0, 0}, []int64{0, g.rank * per}, []int64{out, per})
	if quant {
		rows, n := ceilDiv(out, m.blockN), ceilDiv(per, m.blockK)
		sc := m.param(name+".weight_scale_inv", api.F32, rows, n)
		sc.place(module+".weight_scale_inv", []int64{0, 0}, []int64{0, g.rank * n}, []int64{rows, n})
	}
	if m.has(module + ".bias") { // added once, after the reduction: every rank holds it whole
		return m.replicated(name+".bias", module+".bias", m.dtype)
	}
	return nil
}

// checkBlockShape refuses what vLLM's block-FP8 create_weights refuses
// (validate_fp8_block_shape in layers/quantization/fp8.py): a TP split of the input features that
// is not whole blocks, and output partitions (all of a TP split, all but the last of a merged
// layer) that are not whole blocks — a scale block straddling a rank or part boundary.
func (m *model) checkBlockShape(name string, tp, in, inPart, out int64, outParts []int64) error {
	if tp > 1 && in == inPart*tp && inPart%m.blockK != 0 {
		return &Error{"/layout/tensor_parallel_size", fmt.Sprintf(
			"%s: the rank's %d input features are not whole FP8 scale blocks of %d (vLLM refuses this split)",
			name,
			inPart,
			m.blockK,
		)}
	}
	var sum int64
	for _, p := range outParts {
		sum += p
	}
	split := tp > 1 && out == sum*tp
	check := outParts
	if !split && len(outParts) > 1 {
		check = outParts[:len(outParts)-1]
	} else if !split {
		check = nil
	}
	for _, p := range check {
		if p%m.blockN != 0 {
			return &Error{"/layout/tensor_parallel_size", fmt.Sprintf(
				"%s: an output partition of %d features is not whole FP8 scale blocks of %d (vLLM refuses this split)",
				name,
				p,
				m.blockN,
			)}
		}
	}
	return nil
}

// column is a plain ColumnParallelLinear over TP.
func (m *model) column(name, module string) error {
	sh, err := m.shape(module+".weight", 2)
	if err != nil {
		return err
	}
	per, err := divide(module+"'s output features", sh[0], m.par.TP, "/layout/tensor_parallel_size")
	if err != nil {
		return err
	}
	return m.columnLinear(name, m.par.TP, slab{module, m.par.TPRank, per})
}

// replicatedLinear is ReplicatedLinear, or a merged layer with disable_tp: the parts whole.
func (m *model) replicatedLinear(name string, modules ...string) error {
	parts := make([]slab, len(modules))
	for i, mod := range modules {
		sh, err := m.shape(mod+".weight", 2)
		if err != nil {
			return err
		}
		parts[i] = slab{mod, 0, sh[0]}
	}
	return m.columnLinear(name, 1, parts...)
}

// gateUp is MergedColumnParallelLinear over [gate, up] (the MLPs' gate_up_proj): [gate_r; up_r].
func (m *model) gateUp(name, gate, up string) error {
	sh, err := m.shape(gate+".weight", 2)
	if err != nil {
		return err
	}
	per, err := divide(gate+"'s intermediate size", sh[0], m.par.TP, "/layout/tensor_parallel_size")
	if err != nil {
		return err
	}
	return m.columnLinear(name, m.par.TP, slab{gate, m.par.TPRank, per}, slab{up, m.par.TPRank, per})
}

// mlp is a dense gated MLP: gate_up_proj column-parallel, down_proj row-parallel.
func (m *model) mlp(dst, src, gate, up, down string) error {
	if err := m.gateUp(dst+"gate_up_proj", src+gate, src+up); err != nil {
		return err
	}
	return m.rowLinear(dst+"down_proj", src+down)
}

// qkv is QKVParallelLinear over q_proj, k_proj and v_proj (the bias too, when the checkpoint has
// one), split over g: rank r holds [q_r; k_r; v_r]. With more ranks than KV heads each KV head is
// replicated over size/kv ranks and rank r holds KV head r / (size/kv).
func (m *model) qkv(g tpGroup, dst, src string, heads, kvHeads, headDim int64) error {
	tp, r := g.size, g.rank
	q, err := divide("num_attention_heads", heads, tp, "/layout/tensor_parallel_size")
	if err != nil {
		return err
	}
	kvIndex, kvLocal := r, int64(0)
	if tp >= kvHeads {
		replicas, err := divide(
			"the ranks replicating num_key_value_heads",
			tp,
			kvHeads,
			"/layout/tensor_parallel_size",
		)
		if err != nil {
			return err
		}
		kvIndex, kvLocal = r/replicas, 1
	} else if kvLocal, err = divide("num_key_value_heads", kvHeads, tp, "/layout/tensor_parallel_size"); err != nil {
		return err
	}
	return m.columnLinear(
		dst+"qkv_proj",
		tp,
		slab{
			src + "q_proj",
			r,
			q * headDim,
		},
		slab{src + "k_proj", kvIndex, kvLocal * headDim},
		slab{src + "v_proj", kvIndex, kvLocal * headDim},
	)
}

// embedAndHead lays out the vocabulary embedding, the layers, the final norm and the LM head. With
// tied embeddings lm_head and embed_tokens are one parameter, and ShardedStateLoader's
// _filter_subtensors keeps the smaller key, "lm_head.weight", at the embedding's place in the
// state dict: the rank holds it first, under that name only.
func (m *model) embedAndHead(layers func() error) error {
	tied := m.cfg.bool("tie_word_embeddings")
	embed := "model.embed_tokens.weight"
	if tied {
		embed = "lm_head.weight"
	}
	if err := m.vocabParallel(m.embedding, embed, "model.embed_tokens.weight"); err != nil {
		return err
	}
	if err := layers(); err != nil {
		return err
	}
	if err := m.norm("model.norm.weight"); err != nil {
		return err
	}
	if tied {
		return nil
	}
	return m.vocabParallel(m.tp(), "lm_head.weight", "lm_head.weight")
}
