package engine

import (
	"encoding/json"
	"fmt"

	"github.com/shardsrv/shardsrv/api"
)

// gpt-oss as vLLM holds it (GptOssForCausalLM, vllm/model_executor/models/gpt_oss.py, read at
// commit a6b6cfaa0cedff84872a0118380c6cfea91b635d for the modules and the MXFP4 loader, a copy from
// before FusedMoEFactory; laid out on release lines with a MoERunner only, whose factory registers
// the experts under mlp.experts.routed_experts.):
//   - model.embedding (the checkpoint's model.embed_tokens), layers, model.norm, lm_head.
//   - attn (the checkpoint's self_attn): sinks, one per query head, split by heads like the
//     queries (the loader narrows heads_per_rank from tp_rank * heads_per_rank); qkv_proj with
//     its biases; o_proj, whose bias every rank holds whole (RowParallelLinear adds it once,
//     after the reduction); the attention's scale buffers.
//   - mlp: router, an nn.Linear with its bias, replicated and not passed to the runner; the
//     experts (mxfp4Experts below); the two layer norms.
//
// Only MXFP4 checkpoints are laid out: the unquantized loader (_load_weights_other) transposes
// the experts and is not modelled here.
func init() {
	register("vllm", gptOss, "GptOssForCausalLM")
}

// mxfp4Experts are the architectures whose experts are laid out from MXFP4 checkpoints.
var mxfp4Experts = map[string]bool{"GptOssForCausalLM": true}

// mxfp4Block is the elements one E8M0 scale covers, and 16 the bytes that hold them (two E2M1
// values a byte).
const mxfp4Block = 32

func gptOss(m *model) error {
	if !m.mxfp4 {
		return checkpointError("gpt-oss is laid out from MXFP4 checkpoints only (quantization_config quant_method \"mxfp4\")")
	}
	heads, kvHeads, headDim, err := m.attentionShape()
	if err != nil {
		return err
	}
	perRank, err := divide("num_attention_heads", heads, m.par.TP, "/layout/tensor_parallel_size")
	if err != nil {
		return err
	}
	layers, err := m.cfg.int("num_hidden_layers", -1)
	if err != nil {
		return err
	}
	experts, err := m.cfg.int("num_local_experts", -1)
	if err != nil {
		return err
	}
	if err := m.vocabParallel(m.tp(), "model.embedding.weight", "model.embed_tokens.weight"); err != nil {
		return err
	}
	for i := range layers {
		pre := fmt.Sprintf("model.layers.%d.", i)
		at, src := pre+"attn.", pre+"self_attn."
		if sh, err := m.shape(src+"sinks", 1); err != nil {
			return err
		} else if sh[0] != heads {
			return checkpointError("%ssinks has %d entries for %d heads", src, sh[0], heads)
		}
		sinks := m.param(at+"sinks", m.dtype, perRank)
		sinks.place(src+"sinks", []int64{0}, []int64{m.par.TPRank * perRank}, []int64{perRank})
		if err := m.qkv(m.tp(), at, src, heads, kvHeads, headDim); err != nil {
			return err
		}
		if err := m.rowLinear(at+"o_proj", src+"o_proj"); err != nil {
			return err
		}
		if err := m.attentionScales(at+"attn.", src); err != nil {
			return err
		}
		mlp := pre + "mlp."
		for _, t := range []string{"router.weight", "router.bias"} {
			if err := m.replicated(mlp+t, mlp+t, m.dtype); err != nil {
				return err
			}
		}
		if err := m.mxfp4Experts(m.moeNames(mlp).routed, mlp+"experts.", experts); err != nil {
			return err
		}
		if err := m.norm(pre+"input_layernorm.weight", pre+"post_attention_layernorm.weight"); err != nil {
			return err
		}
	}
	if err := m.norm("model.norm.weight"); err != nil {
		return err
	}
	return m.vocabParallel(m.tp(), "lm_head.weight", "lm_head.weight")
}

// mxfp4Experts lays out the MXFP4 experts as GptOssModel._load_weights_mxfp4 narrows them into
// Mxfp4MoEMethod's parameters (layers/quantization/mxfp4.py at
// afdb4a4ff429377d0fcfac3752e814ffc36ea41d: w13_weight, w13_weight_scale, w13_bias, w2_weight,
// w2_weight_scale, w2_bias, the biases BF16). The checkpoint's gate_up_proj_blocks [E, 2I, H/32,
// 16] is read as [E, 2I, H/2] and down_proj_blocks [E, H, I/32, 16] as [E, H, I/2]; gate_up rows
// interleave gate and up and are narrowed as they are.
//
// Without expert parallelism the MoE group's rank (TP flattened across DP and PCP) holds whole
// MXFP4 blocks of the intermediate features: cdiv(I/32, group) blocks a rank, the last ranks
// fewer or none, so its rows are [2s, 2e) of gate_up and its columns [s, e) of down, s = rank ·
// per, e = min(s + per, I). w2_bias, added once after the reduction, is loaded whole on rank 0
// and zeroed on the others. With expert parallelism the rank holds E / EP whole experts from
// ep_rank · E / EP (the loader's own split), w2_bias of its experts included.
//
// vLLM pads these parameters for its kernels (the intermediate size per rank to a multiple of 64,
// 128 or 256 and the hidden size to 128 or 256, by backend) and the loader narrows into them;
// ShardedStateLoader narrows a parameter to the saved tensor's shape when that is smaller, so the
// table holds the unpadded rank, which loads on every backend. A rank past the last block holds
// no features: its gate_up and down tensors would be empty and are left out (w2_bias stays), as
// _filter_subtensors leaves out empty tensors; vLLM's padded parameters for them are not empty,
// so such a rank's saved directory holds their zeros and the loader asks for them.
func (m *model) mxfp4Experts(dst, src string, count int64) error {
	g, err := m.moeGroup(count, 0)
	if err != nil {
		return err
	}
	// FusedMoE gives the first ranks one expert more where the experts do not divide; the
	// loader would narrow count / EP of them into those parameters.
	if ep := m.par.TP * m.par.PCP * m.par.DP; g.tp == 1 && ep > 1 && count%ep != 0 {
		return &Error{"/layout/enable_expert_parallel", fmt.Sprintf(
			"gpt-oss's loader gives each of the %d expert-parallel ranks num_local_experts / %d experts; %d do not split evenly",
			ep, ep, count)}
	}
	local := int64(len(g.slots))
	if local == 0 {
		return nil
	}
	e0 := g.slots[0]
	gu, err := m.shape(src+"gate_up_proj_blocks", 4)
	if err != nil {
		return err
	}
	inter2, hb := gu[1], gu[2]
	inter, hidden := inter2/2, hb*mxfp4Block
	dn, err := m.shape(src+"down_proj_blocks", 4)
	if err != nil {
		return err
	}
	want := map[string][]int64{
		"gate_up_proj_blocks": {count, 2 * inter, hb, mxfp4Block / 2},
		"gate_up_proj_scales": {count, 2 * inter, hb},
		"gate_up_proj_bias":   {count, 2 * inter},
		"down_proj_blocks":    {count, hidden, dn[2], mxfp4Block / 2},
		"down_proj_scales":    {count, hidden, dn[2]},
		"down_proj_bias":      {count, hidden},
	}
	for name, shape := range want {
		sh, err := m.shape(src+name, len(shape))
		if err != nil {
			return err
		}
		if fmt.Sprint(sh) != fmt.Sprint(shape) {
			return checkpointError("%s%s has shape %v, want %v", src, name, sh, shape)
		}
	}
	if inter2%2 != 0 || dn[2]*mxfp4Block != inter {
		return checkpointError("%sdown_proj_blocks has %d blocks of the %d intermediate features", src, dn[2], inter)
	}
	per := ceilDiv(inter/mxfp4Block, g.tp) * mxfp4Block
	start := min(g.tpRank*per, inter)
	n := min(start+per, inter) - start

	if n > 0 {
		w13 := m.param(dst+"w13_weight", api.U8, local, 2*n, hidden/2)
		w13.placePacked(src+"gate_up_proj_blocks", e0, 2*start, 0, hb)
		s13 := m.param(dst+"w13_weight_scale", api.U8, local, 2*n, hb)
		s13.place(src+"gate_up_proj_scales", []int64{0, 0, 0}, []int64{e0, 2 * start, 0}, []int64{local, 2 * n, hb})
		b13 := m.param(dst+"w13_bias", api.BF16, local, 2*n)
		b13.place(src+"gate_up_proj_bias", []int64{0, 0}, []int64{e0, 2 * start}, []int64{local, 2 * n})
		w2 := m.param(dst+"w2_weight", api.U8, local, hidden, n/2)
		w2.placePacked(src+"down_proj_blocks", e0, 0, start/mxfp4Block, n/mxfp4Block)
		s2 := m.param(dst+"w2_weight_scale", api.U8, local, hidden, n/mxfp4Block)
		s2.place(src+"down_proj_scales", []int64{0, 0, 0}, []int64{e0, 0, start / mxfp4Block},
			[]int64{local, hidden, n / mxfp4Block})
	}
	b2 := m.param(dst+"w2_bias", api.BF16, local, hidden)
	if g.tpRank == 0 {
		b2.place(src+"down_proj_bias", []int64{0, 0}, []int64{e0, 0}, []int64{local, hidden})
	} else {
		zero := json.Number("0")
		b2.t.Fill = &zero
	}
	return nil
}

// placePacked copies MXFP4 blocks [experts, rows, blocks, 16] into a [local, rows', blocks'·16]
// parameter: the parameter's experts and rows from (e0, row0) of the source, its blocks from
// block0 on, one source block column at a time (a block's 16 bytes follow the one before it).
func (p param) placePacked(src string, e0, row0, block0, blocks int64) {
	local, rows := p.t.Shape[0], p.t.Shape[1]
	coeff := [][]int64{{1, 0, 0}, {0, 1, 0}, {0, 0, 0}, {0, 0, 1}}
	for b := range blocks {
		*p.t.Blocks = append(*p.t.Blocks, api.Block{
			Offsets: []int64{0, 0, b * mxfp4Block / 2}, Lengths: []int64{local, rows, mxfp4Block / 2},
			Source: src, Base: []int64{e0, row0, block0 + b, 0}, Coeff: coeff,
		})
	}
}
