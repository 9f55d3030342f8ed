package vllmref

import (
	"fmt"
	"math"
	"slices"
)

// e2m1 is the value of each 4-bit E2M1 code, the FP4_VALUES table of transformers'
// integrations/mxfp4.py: codes 0-7 are +0, 0.5, 1, 1.5, 2, 3, 4, 6 and codes 8-15 the same
// negated (the high bit is the sign).
var e2m1 = [16]float64{0, 0.5, 1, 1.5, 2, 3, 4, 6, -0.0, -0.5, -1, -1.5, -2, -3, -4, -6}

// DecodeMXFP4 dequantizes MXFP4 bytes as transformers documents its packing
// (convert_moe_packed_tensors in integrations/mxfp4.py): each byte of blocks holds two elements,
// the low nibble the even one and the high nibble the odd one, and each run of 16 bytes (32
// elements) shares one scale, an E8M0 exponent s meaning 2^(s - 127). The shapes do not matter,
// only the row-major order: the checkpoint's [..., G, 16] blocks with [..., G] scales and the
// engine's [..., G*16] with [..., G] decode alike, to 32 elements a scale.
func DecodeMXFP4(blocks, scales Tensor) ([]float64, error) {
	if blocks.DType != "U8" || scales.DType != "U8" {
		return nil, fmt.Errorf("MXFP4 blocks and scales are U8, got %s and %s", blocks.DType, scales.DType)
	}
	if len(blocks.Data) != 16*len(scales.Data) {
		return nil, fmt.Errorf("%d block bytes for %d scales: 16 bytes a scale", len(blocks.Data), len(scales.Data))
	}
	out := make([]float64, 2*len(blocks.Data))
	for i, b := range blocks.Data {
		scale := math.Ldexp(1, int(scales.Data[i/16])-127)
		out[2*i] = e2m1[b&0x0F] * scale
		out[2*i+1] = e2m1[b>>4] * scale
	}
	return out, nil
}

// decodeExperts decodes an MXFP4 tensor of experts, [E, rows, ...] bytes with [E, rows, ...]
// scales, into E x rows rows of values.
func decodeExperts(blocks, scales Tensor) ([][][]float64, error) {
	vals, err := DecodeMXFP4(blocks, scales)
	if err != nil {
		return nil, err
	}
	e, rows := blocks.Shape[0], blocks.Shape[1]
	cols := int64(len(vals)) / (e * rows)
	out := make([][][]float64, e)
	for i := range out {
		out[i] = make([][]float64, rows)
		for r := range out[i] {
			o := (int64(i)*rows + int64(r)) * cols
			out[i][r] = vals[o : o+cols]
		}
	}
	return out, nil
}

// GptOssExpertsReassemble decodes, element by element, the MXFP4 experts of one gpt-oss MoE layer
// (prefix "model.layers.N.mlp.experts.") held by every rank of an engine, in rank order
// (dp_rank * TP + tp_rank), and reports how they differ from the checkpoint's decoded
// gate_up_proj and down_proj: with expert parallelism the ranks' experts must follow one another,
// without it every expert's w13 rows and w2 columns must. It checks what the bytes mean, not where
// a rule put them, so it holds any layout to the checkpoint independently of the slicing rule.
func GptOssExpertsReassemble(hf map[string]Tensor, prefix string, ranks []map[string]Tensor, ep bool) error {
	full13, err := decodeExperts(hf[prefix+"gate_up_proj_blocks"], hf[prefix+"gate_up_proj_scales"])
	if err != nil {
		return err
	}
	full2, err := decodeExperts(hf[prefix+"down_proj_blocks"], hf[prefix+"down_proj_scales"])
	if err != nil {
		return err
	}
	experts := len(full13)
	got13, got2 := make([][][]float64, experts), make([][][]float64, experts)
	next := 0
	for i, out := range ranks {
		name := prefix + "routed_experts."
		w13, ok := out[name+"w13_weight"]
		if !ok {
			continue // a rank whose slice is empty holds none
		}
		r13, err := decodeExperts(w13, out[name+"w13_weight_scale"])
		if err != nil {
			return fmt.Errorf("rank %d w13: %w", i, err)
		}
		r2, err := decodeExperts(out[name+"w2_weight"], out[name+"w2_weight_scale"])
		if err != nil {
			return fmt.Errorf("rank %d w2: %w", i, err)
		}
		if ep {
			if next+len(r13) > experts {
				return fmt.Errorf("the ranks hold more than %d experts", experts)
			}
			copy(got13[next:], r13)
			copy(got2[next:], r2)
			next += len(r13)
			continue
		}
		if len(r13) != experts || len(r2) != experts {
			return fmt.Errorf("rank %d holds %d experts, want %d", i, len(r13), experts)
		}
		for e := range r13 {
			got13[e] = append(got13[e], r13[e]...)
			if got2[e] == nil {
				got2[e] = make([][]float64, len(r2[e]))
			}
			if len(r2[e]) != len(got2[e]) {
				return fmt.Errorf("rank %d: w2 of expert %d has %d rows", i, e, len(r2[e]))
			}
			for h := range r2[e] {
				got2[e][h] = append(got2[e][h], r2[e][h]...)
			}
		}
	}
	for e := 0; e < experts; e++ {
		if !equalRows(got13[e], full13[e]) {
			return fmt.Errorf("expert %d: the decoded w13 rows do not reassemble gate_up_proj", e)
		}
		if !equalRows(got2[e], full2[e]) {
			return fmt.Errorf("expert %d: the decoded w2 columns do not reassemble down_proj", e)
		}
	}
	return nil
}

func equalRows(a, b [][]float64) bool {
	return slices.EqualFunc(a, b, func(x, y []float64) bool { return slices.Equal(x, y) })
}
