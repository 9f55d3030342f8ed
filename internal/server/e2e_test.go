package server_test

import (
	"encoding/binary"
	"encoding/json"
	"net/http"
	"slices"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

func fixture(t *testing.T, h *harness) {
	writeCheckpoint(
		t,
		h,
		"m",
		safetensors.TensorData{Name: "a", DType: "F32", Shape: []int64{4, 3}, Data: f32(arange(0, 12)...)},
		safetensors.TensorData{
			Name:  "step",
			DType: "I64",
			Shape: []int64{},
			Data:  binary.LittleEndian.AppendUint64(nil, 7),
		},
		safetensors.TensorData{Name: "n", DType: "BF16", Shape: []int64{3}, Data: bf16(0.5, 1.5, 2.5)},
		safetensors.TensorData{Name: "i", DType: "I32", Shape: []int64{2}, Data: make([]byte, 8)},
	)
}

func copyOf(src string, shape ...int64) *[]api.Block {
	coeff := make([][]int64, len(shape))
	for s := range coeff {
		coeff[s] = make([]int64, len(shape))
		coeff[s][s] = 1
	}
	return &[]api.Block{
		{
			Offsets: make([]int64, len(shape)),
			Lengths: shape,
			Source:  src,
			Base:    make([]int64, len(shape)),
			Coeff:   coeff,
		},
	}
}

func TestSeveralTensorsScalarsAndBoxesRaw(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		fixture(t, h)
		req := shardReq(
			"m",
			api.TensorRequest{Name: "a.t", Dtype: api.F32, Shape: []int64{4, 3}, Blocks: copyOf("a", 4, 3),
				Boxes: []api.Box{
					{Offsets: []int64{1, 1}, Lengths: []int64{2, 2}},
					{Offsets: []int64{3, 0}, Lengths: []int64{1, 3}},
				}},
			api.TensorRequest{
				Name:   "step",
				Dtype:  api.F64,
				Shape:  []int64{},
				Boxes:  []api.Box{{Offsets: []int64{}, Lengths: []int64{}}},
				Blocks: copyOf("step"),
			},
			api.TensorRequest{Name: "n", Dtype: api.F32, Shape: []int64{3}, Boxes: whole(3), Blocks: copyOf("n", 3)},
		)
		res := h.do("POST", "/v1/shards", req)
		if res.status != 200 {
			t.Fatalf("%d %s", res.status, res.body)
		}
		if got := readF32(res.body[:28]); !slices.Equal(got, []float32{4, 5, 7, 8, 9, 10, 11}) {
			t.Errorf("boxes of a: %v", got)
		}
		if got := binary.LittleEndian.Uint64(res.body[28:36]); got != 0x401C000000000000 { // 7.0
			t.Errorf("scalar step as F64: %#x", got)
		}
		if got := readF32(res.body[36:]); !slices.Equal(got, []float32{0.5, 1.5, 2.5}) {
			t.Errorf("n: %v", got)
		}
	})
}

func TestSafetensorsFormat(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		fixture(t, h)
		st := api.Safetensors
		req := shardReq("m",
			api.TensorRequest{Name: "n", Dtype: api.BF16, Shape: []int64{3}, Boxes: whole(3), Blocks: copyOf("n", 3)},
			api.TensorRequest{Name: "a", Dtype: api.F32, Shape: []int64{4, 3}, Blocks: copyOf("a", 4, 3),
				Boxes: []api.Box{
					{Offsets: []int64{0, 0}, Lengths: []int64{1, 3}},
					{Offsets: []int64{2, 0}, Lengths: []int64{2, 3}},
				}},
		)
		req.Format = &st
		res := h.do("POST", "/v1/shards", req)
		if res.status != 200 || res.header.Get("Content-Type") != "application/vnd.safetensors" {
			t.Fatalf("%d %s", res.status, res.header)
		}
		n, err := safetensors.HeaderLen("body", res.body, int64(len(res.body)))
		if err != nil {
			t.Fatal(err)
		}
		hdr, err := safetensors.Parse("body", res.body[8:8+n], int64(len(res.body)))
		if err != nil {
			t.Fatal(err)
		}
		got := map[string][]byte{}
		for _, tn := range hdr.Tensors {
			got[tn.Name] = res.body[tn.Begin:tn.End]
			if (tn.Begin-hdr.DataStart)%int64(tn.DType.Size()) != 0 {
				t.Errorf("%s is not aligned to its element size", tn.Name)
			}
		}
		if !slices.Equal(readF32(got["a#0"]), []float32{0, 1, 2}) || !slices.Equal(readF32(got["a#1"]), arange(6, 6)) ||
			string(got["n"]) != string(bf16(0.5, 1.5, 2.5)) {
			t.Errorf("stored tensors %v", got)
		}
		var boxes map[string]struct {
			Tensor  string  `json:"tensor"`
			Offsets []int64 `json:"offsets"`
		}
		json.Unmarshal([]byte(hdr.Metadata["shardsrv.boxes"]), &boxes)
		if hdr.Metadata["shardsrv.checkpoint"] != "m" || boxes["a#1"].Tensor != "a" ||
			!slices.Equal(boxes["a#1"].Offsets, []int64{2, 0}) {
			t.Errorf("metadata %v", hdr.Metadata)
		}
	})
}

func TestFillCoversWhatNoBlockDoes(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		fixture(t, h)
		fill := json.Number("-1")
		blocks := []api.Block{
			{Offsets: []int64{1}, Lengths: []int64{3}, Source: "n", Base: []int64{0}, Coeff: [][]int64{{1}}},
		}
		res := h.do(
			"POST",
			"/v1/shards",
			shardReq(
				"m",
				api.TensorRequest{
					Name:   "padded",
					Dtype:  api.F32,
					Shape:  []int64{6},
					Boxes:  whole(6),
					Blocks: &blocks,
					Fill:   &fill,
				},
			),
		)
		if got := readF32(res.body); !slices.Equal(got, []float32{-1, 0.5, 1.5, 2.5, -1, -1}) {
			t.Errorf("%d %v", res.status, got)
		}
	})
}

func TestInvalidRequestsAreProblems(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		fixture(t, h)
		ok := func() api.TensorRequest {
			return api.TensorRequest{
				Name:   "a",
				Dtype:  api.F32,
				Shape:  []int64{4, 3},
				Boxes:  whole(4, 3),
				Blocks: copyOf("a", 4, 3),
			}
		}
		with := func(f func(*api.TensorRequest)) api.ShardRequest {
			tr := ok()
			f(&tr)
			return shardReq("m", tr)
		}
		blocks := func(b ...api.Block) *[]api.Block { return &b }
		rows := func(n int64, dst int64) api.Block { return rowsBlock("a", 0, n, 3, dst) }
		cases := []struct {
			name    string
			body    any
			status  int
			pointer string
		}{
			{"malformed JSON", `{"checkpoint":`, 400, ""},
			{"empty body", ``, 400, ""},
			{"not an object", `[1]`, 400, ""},
			{"unknown field", `{"checkpoint":"m","tensors":[],"extra":1}`, 400, "/extra"},
			{
				"nested unknown field",
				`{"checkpoint":"m","tensors":[{"name":"a","dtype":"F32","shape":[1],"boxes":[{"offsets":[0],"lengths":[1],` +
					`"x":1}]}]}`,
				400,
				"/tensors/0/boxes/0/x",
			},
			{
				"tensors and layout",
				`{"checkpoint":"m","tensors":[{"name":"a","dtype":"F32","shape":[1],"boxes":[{"offsets":[0],"lengths":[1]}]}],` +
					`"layout":{"engine":"vllm"}}`,
				400,
				"/layout",
			},
			{"layout without config.json", `{"checkpoint":"m","layout":{"engine":"vllm"}}`, 422, "/layout"},
			{"layout type", `{"checkpoint":"m","layout":{"engine":"vllm","tp_rank":"1"}}`, 400, "/layout/tp_rank"},
			{"trailing data", `{"checkpoint":"m","tensors":[]} {}`, 400, ""},
			{
				"wrong type",
				`{"checkpoint":"m","tensors":[{"name":"a","dtype":"F32","shape":"x","boxes":[]}]}`,
				400,
				"/tensors/0/shape",
			},
			{
				"huge integer",
				`{"checkpoint":"m","tensors":[{"name":"a","dtype":"F32","shape":[99999999999999999999],"boxes":[]}]}`,
				400,
				"",
			},
			{"no checkpoint", `{"tensors":[]}`, 400, "/checkpoint"},
			{"no tensors", shardReq("m"), 400, "/tensors"},
			{"bad format", `{"checkpoint":"m","format":"npy","tensors":[]}`, 400, "/format"},
			{"unknown dtype", with(func(t *api.TensorRequest) { t.Dtype = "F4" }), 400, "/tensors/0/dtype"},
			{"no boxes", with(func(t *api.TensorRequest) { t.Boxes = nil }), 400, "/tensors/0/boxes"},
			{
				"zero length",
				with(func(t *api.TensorRequest) { t.Boxes[0].Lengths = []int64{0, 3} }),
				400,
				"/tensors/0/boxes/0/lengths/0",
			},
			{
				"box rank",
				with(func(t *api.TensorRequest) { t.Boxes[0].Offsets = []int64{0} }),
				422,
				"/tensors/0/boxes/0",
			},
			{
				"box outside",
				with(func(t *api.TensorRequest) { t.Boxes[0].Offsets = []int64{1, 0} }),
				422,
				"/tensors/0/boxes/0",
			},
			{
				"block outside",
				with(func(t *api.TensorRequest) { t.Blocks = blocks(rows(4, 1)) }),
				422,
				"/tensors/0/blocks/0",
			},
			{
				"overlap",
				with(func(t *api.TensorRequest) { t.Blocks = blocks(rows(3, 0), rowsBlock("a", 0, 2, 3, 2)) }),
				422,
				"/tensors/0/blocks/1",
			},
			{
				"uncovered",
				with(func(t *api.TensorRequest) { t.Blocks = blocks(rows(3, 0)) }),
				422,
				"/tensors/0/boxes/0",
			},
			{
				"missing source",
				with(func(t *api.TensorRequest) { (*t.Blocks)[0].Source = "nope" }),
				422,
				"/tensors/0/blocks/0/source",
			},
			{
				"base rank",
				with(func(t *api.TensorRequest) { (*t.Blocks)[0].Base = []int64{0} }),
				422,
				"/tensors/0/blocks/0/base",
			},
			{
				"coeff rows",
				with(func(t *api.TensorRequest) { (*t.Blocks)[0].Coeff = [][]int64{{1, 0}} }),
				422,
				"/tensors/0/blocks/0/coeff",
			},
			{
				"coeff cols",
				with(func(t *api.TensorRequest) { (*t.Blocks)[0].Coeff = [][]int64{{1}, {0, 1}} }),
				422,
				"/tensors/0/blocks/0/coeff/0",
			},
			{
				"negative step",
				with(func(t *api.TensorRequest) { (*t.Blocks)[0].Coeff = [][]int64{{-1, 0}, {0, 1}} }),
				400,
				"/tensors/0/blocks/0/coeff/0/0",
			},
			{
				"past the end",
				with(func(t *api.TensorRequest) { (*t.Blocks)[0].Coeff = [][]int64{{2, 0}, {0, 1}} }),
				422,
				"/tensors/0/blocks/0",
			},
			{
				"overflow",
				with(func(t *api.TensorRequest) { (*t.Blocks)[0].Coeff = [][]int64{{1 << 62, 0}, {0, 1}} }),
				422,
				"/tensors/0/blocks/0",
			},
			{
				"huge shape",
				with(func(t *api.TensorRequest) { t.Shape = []int64{1 << 40, 1 << 40} }),
				422,
				"/tensors/0/shape",
			},
			{"float to int", with(func(t *api.TensorRequest) { t.Dtype = api.I32 }), 422, "/tensors/0/blocks/0"},
			{
				"float op on int",
				shardReq("m", api.TensorRequest{Name: "i", Dtype: api.I64, Shape: []int64{2}, Boxes: whole(2),
					Blocks: &[]api.Block{
						{
							Offsets: []int64{0},
							Lengths: []int64{2},
							Source:  "i",
							Base:    []int64{0},
							Coeff:   [][]int64{{1}},
							Post:    &[]api.PostOp{{Op: "neg"}},
						},
					}}),
				422,
				"/tensors/0/blocks/0/post/0",
			},
			{
				"mul without value",
				with(func(t *api.TensorRequest) { (*t.Blocks)[0].Post = &[]api.PostOp{{Op: "mul"}} }),
				400,
				"/tensors/0/blocks/0/post/0/value",
			},
			{
				"unknown op",
				with(func(t *api.TensorRequest) { (*t.Blocks)[0].Post = &[]api.PostOp{{Op: "sqrt"}} }),
				400,
				"/tensors/0/blocks/0/post/0/op",
			},
			{
				"bad fill",
				shardReq(
					"m",
					api.TensorRequest{
						Name:  "b",
						Dtype: api.BOOL,
						Shape: []int64{2},
						Boxes: whole(2),
						Fill:  ptr(json.Number("2")),
					},
				),
				422,
				"/tensors/0/fill",
			},
			{"duplicate names", shardReq("m", ok(), ok()), 422, "/tensors/1/name"},
			{"unknown checkpoint", shardReq("nope", ok()), 404, ""},
			{"traversal", shardReq("../m", ok()), 400, "/checkpoint"},
			{"absolute", shardReq("/etc", ok()), 400, "/checkpoint"},
			{"escape inside", shardReq("m/../../x", ok()), 400, "/checkpoint"},
			{"too large", `{"checkpoint":"m","tensors":[` + strings.Repeat(" ", 2<<20) + `]}`, 413, ""},
		}
		for _, c := range cases {
			t.Run(c.name, func(t *testing.T) {
				for _, path := range []string{"/v1/shards", "/v1/plan"} {
					res := h.do("POST", path, c.body)
					if res.status != c.status || res.header.Get("Content-Type") != "application/problem+json" ||
						res.problem.Status != c.status ||
						res.problem.Title == "" {
						t.Fatalf("%s: %d %s, want a %d problem", path, res.status, res.body, c.status)
					}
					if body := string(res.body); strings.Contains(body, "(and 0 more)") ||
						strings.Contains(body, "api.") {
						t.Errorf("%s: the problem leaks a Go type or counts nothing: %s", path, body)
					}
					if c.pointer != "" &&
						(res.problem.Errors == nil ||
							!slices.ContainsFunc(*res.problem.Errors, func(e api.FieldError) bool { return e.Pointer == c.pointer })) {
						t.Errorf("%s: errors %s, want pointer %s", path, res.body, c.pointer)
					}
				}
			})
		}
	})
}

func ptr[T any](v T) *T { return &v }

func TestListingEndpoints(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		fixture(t, h)
		var cks api.CheckpointList
		json.Unmarshal(h.do("GET", "/v1/checkpoints", nil).body, &cks)
		if !slices.Equal(cks.Checkpoints, []string{"m"}) {
			t.Errorf("checkpoints %v", cks)
		}
		var ts api.TensorList
		json.Unmarshal(h.do("GET", "/v1/tensors?checkpoint=m", nil).body, &ts)
		if len(ts.Tensors) != 4 || ts.Tensors[0].Name != "a" || ts.Tensors[0].File != "model.safetensors" ||
			!slices.Equal(ts.Tensors[0].Shape, []int64{4, 3}) {
			t.Errorf("tensors %+v", ts)
		}
		for path, status := range map[string]int{
			"/v1/tensors?checkpoint=nope": 404,
			"/v1/tensors":                 400,
			"/v1/tensors?checkpoint=../x": 400,
			"/healthz":                    200,
			"/readyz":                     200,
			"/nope":                       404,
		} {
			if res := h.do("GET", path, nil); res.status != status {
				t.Errorf("GET %s: %d %s, want %d", path, res.status, res.body, status)
			}
		}
		if res := h.do("DELETE", "/v1/shards", nil); res.status != http.StatusMethodNotAllowed ||
			res.problem.Status != 405 {
			t.Errorf("DELETE /v1/shards: %d", res.status)
		}
	})
}

func TestRequestIDIsEchoed(t *testing.T) {
	eachStore(t, planner.DefaultOptions(), func(t *testing.T, h *harness) {
		fixture(t, h)
		req, _ := http.NewRequest("GET", h.url+"/healthz", nil)
		req.Header.Set("X-Request-Id", "abc-123")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		res.Body.Close()
		if res.Header.Get("X-Request-Id") != "abc-123" {
			t.Errorf("X-Request-Id %q", res.Header.Get("X-Request-Id"))
		}
	})
}
