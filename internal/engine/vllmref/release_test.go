package vllmref

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"math"
	"strings"
	"testing"
)

func TestWideCheckpointsAreSmallAndDeterministic(t *testing.T) {
	for _, v := range WideVariants {
		cfg, ts := Checkpoint(v, 1)
		cfg2, ts2 := Checkpoint(v, 1)
		var size int
		for n, x := range ts {
			x.check()
			size += len(x.Data)
			if !same(x, ts2[n]) {
				t.Errorf("%s: %s differs for the same seed", v, n)
			}
		}
		if size > 2<<20 || !bytes.Equal(cfg, cfg2) {
			t.Errorf("%s: %d bytes, deterministic config %v", v, size, bytes.Equal(cfg, cfg2))
		}
	}
}

// At TP 1, 2, 4 and 8 lcm(64, TP) is 64, so "0.29" is "0.10" plus four F32 1.0 scalars under each
// layer's self_attn.attn.
func TestLine029IsLine010PlusAttentionScales(t *testing.T) {
	for _, v := range append([]string{"llama", "llama-tied", "qwen2", "qwen3"}, WideVariants...) {
		cfg, hf := Checkpoint(v, 7)
		for _, tp := range []int{1, 2, 4, 8} {
			p := Parallel{TP: tp, TPRank: tp - 1, DP: 1}
			old, err := RankAt("0.10", cfg, hf, p)
			if err != nil {
				t.Fatalf("%s TP %d: %v", v, tp, err)
			}
			cur, err := RankAt("0.29", cfg, hf, p)
			if err != nil {
				t.Fatalf("%s TP %d: %v", v, tp, err)
			}
			scales := 0
			for n, x := range cur {
				if o, ok := old[n]; ok {
					if !same(o, x) {
						t.Errorf("%s TP %d: %s differs between the lines", v, tp, n)
					}
					continue
				}
				scales++
				s := n[strings.LastIndex(n, ".")+1:]
				if !strings.HasSuffix(n[:len(n)-len(s)], ".self_attn.attn.") ||
					!strings.Contains("_k_scale _v_scale _q_scale _prob_scale", s) {
					t.Errorf("%s: unexpected %s", v, n)
				}
				if x.DType != "F32" || len(x.Shape) != 0 ||
					math.Float32frombits(binary.LittleEndian.Uint32(x.Data)) != 1 {
					t.Errorf("%s: %s is %s %v %x, want an F32 scalar 1.0", v, n, x.DType, x.Shape, x.Data)
				}
			}
			if len(old) != len(cur)-scales || scales != 2*4 {
				t.Errorf("%s TP %d: %d tensors on 0.10, %d on 0.29 of which %d scales", v, tp, len(old), len(cur), scales)
			}
		}
	}
}

func TestLine029PadsVocabularyToLCM(t *testing.T) {
	cfg, hf := Checkpoint("llama-wide", 7)
	if _, err := RankAt("0.10", cfg, hf, Parallel{TP: 6, DP: 1}); err == nil ||
		!strings.Contains(err.Error(), "padded vocab size") {
		t.Fatalf("0.10 at TP 6: 1024 padded rows do not divide by 6, vLLM v0.10.2 refuses; got %v", err)
	}
	var embeds, heads []Tensor
	for r := 0; r < 6; r++ {
		out, err := RankAt("0.29", cfg, hf, Parallel{TP: 6, TPRank: r, DP: 1})
		if err != nil {
			t.Fatal(err)
		}
		e := out["model.embed_tokens.weight"]
		if e.Shape[0] != 192 {
			t.Fatalf("rank %d: %d vocabulary rows, want lcm(64, 6) * 6 / 6 = 192", r, e.Shape[0])
		}
		embeds, heads = append(embeds, e), append(heads, out["lm_head.weight"])
		// 24 heads over 6 ranks, 2 KV heads each replicated on 3 ranks.
		qkv := out["model.layers.0.self_attn.qkv_proj.weight"]
		k := hf["model.layers.0.self_attn.k_proj.weight"]
		if qkv.Shape[0] != 4*wideHeadDim+2*wideHeadDim ||
			!same(NarrowRows(qkv, 4*wideHeadDim, wideHeadDim, "k"), NarrowRows(k, int64(r/3)*wideHeadDim, wideHeadDim, "k")) {
			t.Errorf("rank %d: qkv %v does not hold 4 q heads and KV head %d", r, qkv.Shape, r/3)
		}
	}
	for name, parts := range map[string][]Tensor{"model.embed_tokens.weight": embeds, "lm_head.weight": heads} {
		all := CatRows(parts...)
		if !same(NarrowRows(all, 0, 1000, name), hf[name]) {
			t.Errorf("%s: the ranks' rows do not reassemble the checkpoint", name)
		}
		if pad := NarrowRows(all, 1000, 152, name); !bytes.Equal(pad.Data, make([]byte, len(pad.Data))) {
			t.Errorf("%s: the 152 padding rows are not zero", name)
		}
	}
}

func TestUnknownLinesAndLCM(t *testing.T) {
	cfg, hf := Checkpoint("llama", 7)
	if _, err := RankAt("0.11", cfg, hf, Parallel{TP: 1, DP: 1}); err == nil {
		t.Error("an unknown line is modelled")
	}
	if lcm(64, 6) != 192 || lcm(64, 24) != 192 || lcm(64, 8) != 64 || lcm(64, 3) != 192 || lcm(64, 1) != 64 {
		t.Error(fmt.Sprint("lcm ", lcm(64, 6), lcm(64, 24)))
	}
}
