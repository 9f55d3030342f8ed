package server_test

import (
	"encoding/json"
	"math"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/store"
)

// hostileHarness serves the vllmref Mixtral (an MoE checkpoint) from a local store.
func hostileHarness(t *testing.T) (*harness, []byte) {
	t.Helper()
	dir := t.TempDir()
	st, err := store.NewLocal(dir)
	if err != nil {
		t.Fatal(err)
	}
	h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
	cfg, _ := vrefPut(t, h, "moe", "mixtral")
	return h, cfg
}

// layoutRoutes are the routes that expand a layout.
var layoutRoutes = []string{"/v1/plan", "/v1/shards", "/v1/layouts"}

// wantProblem holds a response to a 422 at pointer whose detail says want.
func wantProblem(t *testing.T, what string, res response, pointer, want string) {
	t.Helper()
	if res.status != http.StatusUnprocessableEntity || res.problem.Errors == nil {
		t.Fatalf("%s: %d %s, want a 422 at %s", what, res.status, res.body, pointer)
	}
	fe := (*res.problem.Errors)[0]
	if fe.Pointer != pointer || !strings.Contains(fe.Detail, want) {
		t.Fatalf("%s: %s %q, want %s saying %q", what, fe.Pointer, fe.Detail, pointer, want)
	}
}

// TestLayoutSizesThatOverflow: TP × DP past int64 (it wrapped to 0 and divided by zero, dropping
// the connection) and past the rank bound (it wrapped negative, or held a rank of 2^62, and
// answered 200) are 422s at data_parallel_size on every route that expands a layout.
func TestLayoutSizesThatOverflow(t *testing.T) {
	h, _ := hostileHarness(t)
	for _, layout := range []map[string]any{
		{"tensor_parallel_size": 4, "data_parallel_size": int64(1) << 62, "enable_expert_parallel": true},
		{"tensor_parallel_size": 2, "data_parallel_size": int64(math.MaxInt64), "enable_expert_parallel": true},
		{"data_parallel_size": int64(1)<<62 + 1, "dp_rank": int64(1) << 62, "enable_expert_parallel": true},
		{"tensor_parallel_size": 256, "data_parallel_size": 512},
	} {
		layout["engine"] = "vllm"
		for _, route := range layoutRoutes {
			res := h.do("POST", route, map[string]any{"checkpoint": "moe", "layout": layout})
			wantProblem(t, route, res, "/layout/data_parallel_size", "")
		}
	}
	res := h.do("POST", "/v1/layouts", map[string]any{"checkpoint": "moe",
		"layout": map[string]any{"engine": "vllm", "tensor_parallel_size": int64(1) << 31}})
	wantProblem(t, "TP 2^31", res, "/layout/tensor_parallel_size", "must be in [1, 65536]")
}

// TestLayoutConfigIntegersBounded: an integer of config.json past what any model has is a 422 that
// names the key.
func TestLayoutConfigIntegersBounded(t *testing.T) {
	h, cfg := hostileHarness(t)
	for key, v := range map[string]any{
		"num_local_experts":   int64(1) << 62,
		"num_attention_heads": math.MaxInt64,
		"head_dim":            -1,
		"num_hidden_layers":   1e300,
	} {
		var c map[string]any
		json.Unmarshal(cfg, &c)
		c[key] = v
		raw, _ := json.Marshal(c)
		h.put("moe/config.json", raw)
		for _, route := range layoutRoutes {
			res := h.do("POST", route, map[string]any{"checkpoint": "moe",
				"layout": map[string]any{"engine": "vllm", "tensor_parallel_size": 2, "enable_expert_parallel": true}})
			wantProblem(t, route+" "+key, res, "/layout", "config.json /"+key)
		}
	}
}

// TestLayoutConfigNotUTF8: a config.json with bytes that are not UTF-8 is refused, not read with
// U+FFFD in their place.
func TestLayoutConfigNotUTF8(t *testing.T) {
	h, cfg := hostileHarness(t)
	h.put("moe/config.json", append([]byte("{\"_name_or_path\": \"caf\xe9\", "), cfg[1:]...))
	for _, route := range layoutRoutes {
		res := h.do("POST", route, map[string]any{"checkpoint": "moe", "layout": map[string]any{"engine": "vllm"}})
		wantProblem(t, route, res, "/layout", "config.json is not UTF-8")
	}
}

// TestFilesRouteServesDocumentedFiles: the files route lists and serves the checkpoint's configs,
// tokenizer files and chat templates, and nothing else the folder happens to hold.
func TestFilesRouteServesDocumentedFiles(t *testing.T) {
	h, _ := hostileHarness(t)
	served := []string{"config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
		"chat_template.jinja", "qwen.tiktoken"}
	stray := []string{".env", ".tiktoken", "config.json~", "config.json.bak", "#tokenizer.json#", "notes.txt",
		"model.safetensors", "model.safetensors.index.json"}
	for _, f := range append(served[1:], stray...) {
		if f != "model.safetensors" {
			h.put("moe/"+f, []byte(`{"secret": "`+f+`"}`))
		}
	}
	res := h.do("GET", "/v1/checkpoints/moe/files", nil)
	var list struct{ Files []struct{ Name string } }
	json.Unmarshal(res.body, &list)
	var names []string
	for _, f := range list.Files {
		names = append(names, f.Name)
	}
	slices.Sort(names)
	want := slices.Sorted(slices.Values(served))
	if res.status != 200 || !slices.Equal(names, want) {
		t.Fatalf("listed %d %v, want %v", res.status, names, want)
	}
	for _, f := range served {
		if res := h.do("GET", "/v1/checkpoints/moe/files/"+f, nil); res.status != 200 {
			t.Errorf("%s: %d %s", f, res.status, res.body)
		}
	}
	for _, f := range stray {
		res := h.do("GET", "/v1/checkpoints/moe/files/"+url.PathEscape(f), nil)
		// 404, or 400 for a name the store's key rules refuse outright
		if res.status != http.StatusNotFound && res.status != http.StatusBadRequest ||
			strings.Contains(string(res.body), "secret") {
			t.Errorf("%s: %d %s, want a 404", f, res.status, res.body)
		}
	}
}

// TestLayoutConfigOverLimits: a config.json over --max-config-bytes, nested too deep or holding
// too many values is a 422 that names the file.
func TestLayoutConfigOverLimits(t *testing.T) {
	h, cfg := hostileHarness(t)
	for pad, want := range map[string]string{
		`"` + strings.Repeat("a", 5<<20) + `"`:            "config.json is 5243",
		strings.Repeat("[", 33) + strings.Repeat("]", 33): "config.json nests deeper than 32",
		"[" + strings.Repeat("0,", 1<<16) + "0]":          "config.json holds more than 65536 values",
	} {
		h.put("moe/config.json", append([]byte(`{"_padding":`+pad+`,`), cfg[1:]...))
		for _, route := range layoutRoutes {
			res := h.do("POST", route, map[string]any{"checkpoint": "moe", "layout": map[string]any{"engine": "vllm"}})
			wantProblem(t, route, res, "/layout", want)
		}
	}
	// Brackets and commas inside strings are text, not structure.
	h.put("moe/config.json", append([]byte(`{"_padding":"`+strings.Repeat(`[,\"`, 1<<16)+`",`), cfg[1:]...))
	res := h.do("POST", "/v1/layouts", map[string]any{"checkpoint": "moe", "layout": map[string]any{"engine": "vllm"}})
	if res.status != 200 {
		t.Fatalf("a config.json with brackets in a string: %d %s", res.status, res.body)
	}
}
