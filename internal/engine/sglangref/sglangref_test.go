package sglangref

import (
	"bytes"
	"errors"
	"fmt"
	"slices"
	"sort"
	"testing"

	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
)

func rank(t *testing.T, variant string, p Parallel) map[string]vllmref.Tensor {
	t.Helper()
	cfg, hf := vllmref.Checkpoint(variant, 7)
	out, err := Rank(cfg, hf, p)
	if err != nil {
		t.Fatalf("%s %+v: %v", variant, p, err)
	}
	return out
}

// rows is rows [start, start+n) of t; cols the same for columns.
func rows(t vllmref.Tensor, start, n int64) vllmref.Tensor {
	return vllmref.NarrowRows(t, start, n, "test")
}
func cols(t vllmref.Tensor, start, n int64) vllmref.Tensor {
	return vllmref.NarrowCols(t, start, n, "test")
}

func sameTensor(a, b vllmref.Tensor) bool {
	return a.DType == b.DType && slices.Equal(a.Shape, b.Shape) && bytes.Equal(a.Data, b.Data)
}

func catCols(ts []vllmref.Tensor) vllmref.Tensor {
	out := ts[0]
	for _, x := range ts[1:] {
		var data []byte
		rb, xb := int(out.Shape[1])*2, int(x.Shape[1])*2
		for r := 0; r < int(out.Shape[0]); r++ {
			data = append(data, out.Data[r*rb:(r+1)*rb]...)
			data = append(data, x.Data[r*xb:(r+1)*xb]...)
		}
		out = vllmref.Tensor{DType: out.DType, Shape: []int64{out.Shape[0], out.Shape[1] + x.Shape[1]}, Data: data}
	}
	return out
}

// The names and shapes a Llama rank saves, in full, at TP 1 and for the tied variant.
func TestLlamaNamesAndShapes(t *testing.T) {
	want := []string{"lm_head.weight [1152 64]", "model.embed_tokens.weight [1152 64]", "model.norm.weight [64]"}
	for i := 0; i < 2; i++ {
		l := fmt.Sprintf("model.layers.%d.", i)
		want = append(want, l+"input_layernorm.weight [64]", l+"post_attention_layernorm.weight [64]",
			l+"self_attn.qkv_proj.weight [192 64]", l+"self_attn.o_proj.weight [64 128]",
			l+"mlp.gate_up_proj.weight [128 64]", l+"mlp.down_proj.weight [64 64]")
	}
	list := func(out map[string]vllmref.Tensor) []string {
		var got []string
		for n, x := range out {
			if x.DType != "BF16" {
				t.Errorf("%s is %s", n, x.DType)
			}
			got = append(got, fmt.Sprintf("%s %v", n, x.Shape))
		}
		sort.Strings(got)
		return got
	}
	sort.Strings(want)
	if got := list(rank(t, "llama", Parallel{TP: 1})); !slices.Equal(got, want) {
		t.Errorf("llama TP 1:\n got %q\nwant %q", got, want)
	}
	tied := slices.DeleteFunc(slices.Clone(want), func(s string) bool { return s == "model.embed_tokens.weight [1152 64]" })
	if got := list(rank(t, "llama-tied", Parallel{TP: 1})); !slices.Equal(got, tied) {
		t.Errorf("llama-tied TP 1 (one tensor, the smaller name):\n got %q\nwant %q", got, tied)
	}
}

// Every column-split tensor's rank slices concatenate back to the checkpoint's tensor, every
// row-split one's columns do, and the vocabulary is padded to a multiple of 64 with zero rows.
func TestSplitsReassemble(t *testing.T) {
	for _, variant := range []string{"llama", "qwen3"} {
		cfg, hf := vllmref.Checkpoint(variant, 7)
		model := vllmref.ParseConfig(cfg).ModelDType()
		full := func(n string) vllmref.Tensor { return vllmref.Convert(hf[n], model) }
		for _, tp := range []int{1, 2, 4, 8} {
			var ranks []map[string]vllmref.Tensor
			for r := 0; r < tp; r++ {
				ranks = append(ranks, rank(t, variant, Parallel{TP: tp, TPRank: r}))
			}
			what := fmt.Sprintf("%s TP %d", variant, tp)
			embed := vllmref.CatRows(func() []vllmref.Tensor {
				var ts []vllmref.Tensor
				for _, o := range ranks {
					ts = append(ts, o["model.embed_tokens.weight"])
				}
				return ts
			}()...)
			if embed.Shape[0] != 1152 || !sameTensor(rows(embed, 0, 1100), full("model.embed_tokens.weight")) ||
				!bytes.Equal(rows(embed, 1100, 52).Data, make([]byte, 52*64*2)) {
				t.Errorf("%s: the embedding does not reassemble to the checkpoint's 1100 rows and 52 zero rows", what)
			}
			for i := 0; i < 2; i++ {
				l := fmt.Sprintf("model.layers.%d.", i)
				var q, k, gate, up, down, o []vllmref.Tensor
				inter := int64(64 / tp)
				qs, kvs := int64(128/tp), int64(max(32/tp, 16))
				for r, out := range ranks {
					qkv := out[l+"self_attn.qkv_proj.weight"]
					q = append(q, rows(qkv, 0, qs))
					if r%max(tp/2, 1) == 0 { // the first rank of each KV head's replicas
						k = append(k, rows(qkv, qs, kvs))
					}
					if !sameTensor(rows(qkv, qs+kvs, kvs), rows(full(l+"self_attn.v_proj.weight"), int64(r/max(tp/2, 1))*kvs, kvs)) {
						t.Errorf("%s rank %d %s: v rows", what, r, l)
					}
					gu := out[l+"mlp.gate_up_proj.weight"]
					gate, up = append(gate, rows(gu, 0, inter)), append(up, rows(gu, inter, inter))
					down, o = append(down, out[l+"mlp.down_proj.weight"]), append(o, out[l+"self_attn.o_proj.weight"])
				}
				for _, c := range []struct {
					name string
					got  vllmref.Tensor
				}{
					{"self_attn.q_proj.weight", vllmref.CatRows(q...)}, {"self_attn.k_proj.weight", vllmref.CatRows(k...)},
					{"mlp.gate_proj.weight", vllmref.CatRows(gate...)}, {"mlp.up_proj.weight", vllmref.CatRows(up...)},
					{"mlp.down_proj.weight", catCols(down)}, {"self_attn.o_proj.weight", catCols(o)},
				} {
					if !sameTensor(c.got, full(l+c.name)) {
						t.Errorf("%s: %s does not reassemble", what, l+c.name)
					}
				}
			}
		}
	}
}

// Every expert of every layer is held whole, across the MoE TP ranks, by exactly the EP rank
// whose block it is in; the router is replicated.
func TestExpertsReassemble(t *testing.T) {
	cfg, hf := vllmref.Checkpoint("qwen3moe-sparse", 7)
	for _, c := range []struct{ tp, ep int }{{1, 1}, {2, 1}, {2, 2}, {4, 2}, {8, 2}, {8, 1}} {
		local, moeTP := 10/c.ep, c.tp/c.ep
		ipp := int64(32 / moeTP)
		for l := 0; l < 3; l++ {
			p := fmt.Sprintf("model.layers.%d.mlp.", l)
			gates, ups, downs := map[int][]vllmref.Tensor{}, map[int][]vllmref.Tensor{}, map[int][]vllmref.Tensor{}
			for r := 0; r < c.tp; r++ {
				out, err := Rank(cfg, hf, Parallel{TP: c.tp, TPRank: r, EP: c.ep})
				if err != nil {
					t.Fatal(err)
				}
				if !sameTensor(out[p+"gate.weight"], hf[p+"gate.weight"]) {
					t.Errorf("TP %d EP %d rank %d: the router is not the checkpoint's", c.tp, c.ep, r)
				}
				w13, w2 := out[p+"experts.w13_weight"], out[p+"experts.w2_weight"]
				if !slices.Equal(w13.Shape, []int64{int64(local), 2 * ipp, 64}) || !slices.Equal(w2.Shape, []int64{int64(local), 64, ipp}) {
					t.Fatalf("TP %d EP %d rank %d: w13 %v w2 %v", c.tp, c.ep, r, w13.Shape, w2.Shape)
				}
				for j := 0; j < local; j++ {
					e := r/moeTP*local + j
					x := rows(w13, int64(j), 1)
					x.Shape = x.Shape[1:]
					y := rows(w2, int64(j), 1)
					y.Shape = y.Shape[1:]
					gates[e], ups[e] = append(gates[e], rows(x, 0, ipp)), append(ups[e], rows(x, ipp, ipp))
					downs[e] = append(downs[e], y)
				}
			}
			for e := 0; e < 10; e++ {
				x := fmt.Sprintf("%sexperts.%d.", p, e)
				if len(gates[e]) != moeTP || !sameTensor(vllmref.CatRows(gates[e]...), hf[x+"gate_proj.weight"]) ||
					!sameTensor(vllmref.CatRows(ups[e]...), hf[x+"up_proj.weight"]) ||
					!sameTensor(catCols(downs[e]), hf[x+"down_proj.weight"]) {
					t.Errorf("TP %d EP %d: expert %d of layer %d does not reassemble", c.tp, c.ep, e, l)
				}
			}
		}
	}
}

// Under DP attention Qwen3's attention is split by TP / DP, its embedding whole, its MLP and LM
// head by TP; Llama's modules ignore the flag.
func TestDPAttention(t *testing.T) {
	plain := rank(t, "qwen3", Parallel{TP: 4, TPRank: 3})
	attn2 := rank(t, "qwen3", Parallel{TP: 2, TPRank: 1})
	for _, r := range []int{1, 3} {
		dpa := rank(t, "qwen3", Parallel{TP: 4, TPRank: r, DP: 2, EnableDPAttention: true})
		for n, x := range dpa {
			var want vllmref.Tensor
			switch {
			case n == "model.embed_tokens.weight":
				want = rank(t, "qwen3", Parallel{TP: 1})[n]
			case bytes.Contains([]byte(n), []byte("self_attn.qkv_proj")) || bytes.Contains([]byte(n), []byte("self_attn.o_proj")):
				want = attn2[n]
			default:
				want = rank(t, "qwen3", Parallel{TP: 4, TPRank: r})[n]
			}
			if !sameTensor(x, want) {
				t.Errorf("qwen3 TP 4 DP 2 DP-attention rank %d: %s %v", r, n, x.Shape)
			}
		}
		if len(dpa) != len(plain) {
			t.Errorf("rank %d: %d tensors, %d without DP attention", r, len(dpa), len(plain))
		}
	}
	for _, v := range []string{"llama", "llama-tied"} {
		for r := 0; r < 4; r++ {
			a := rank(t, v, Parallel{TP: 4, TPRank: r, DP: 2, EnableDPAttention: true})
			b := rank(t, v, Parallel{TP: 4, TPRank: r, DP: 2})
			for n := range b {
				if !sameTensor(a[n], b[n]) {
					t.Errorf("%s rank %d: %s changes under DP attention", v, r, n)
				}
			}
		}
	}
}

// What SGLang refuses, and what the reference leaves out.
func TestRefusals(t *testing.T) {
	var refusal vllmref.Refusal
	var unmodelled Unmodelled
	for _, c := range []struct {
		variant string
		p       Parallel
		refused bool
	}{
		{"qwen3moe", Parallel{TP: 1}, true},               // dense layers SGLang would leave unfilled
		{"qwen3moe-sparse", Parallel{TP: 4, EP: 4}, true}, // 10 experts over 4 EP ranks
		{"qwen3moe-sparse", Parallel{TP: 4, EP: 3}, true}, // EP does not divide TP
		{"qwen3moe-sparse", Parallel{TP: 6}, true},        // 8 heads over 6
		{"llama-wide", Parallel{TP: 6}, true},             // 1024 padded rows over 6
		{"qwen3-wide", Parallel{TP: 4, DP: 3, EnableDPAttention: true}, true},
		{"qwen2", Parallel{TP: 1}, false},
		{"deepseekv3", Parallel{TP: 1}, false},
		{"deepseekv3-fp8", Parallel{TP: 1}, false},
	} {
		cfg, hf := vllmref.Checkpoint(c.variant, 7)
		_, err := Rank(cfg, hf, c.p)
		if c.refused && !errors.As(err, &refusal) || !c.refused && !errors.As(err, &unmodelled) {
			t.Errorf("%s %+v: %v (%T)", c.variant, c.p, err, err)
		}
	}
}

// Every variant the reference lists works at TP 1, 2 and 4, with DP attention over 2 at TP 4.
func TestEveryVariantShards(t *testing.T) {
	for _, v := range Variants {
		for _, p := range []Parallel{{TP: 1}, {TP: 2, TPRank: 1}, {TP: 4, TPRank: 2}, {TP: 4, TPRank: 3, DP: 2, EnableDPAttention: true}} {
			if out := rank(t, v, p); len(out) == 0 {
				t.Errorf("%s %+v: no tensors", v, p)
			}
		}
	}
}
