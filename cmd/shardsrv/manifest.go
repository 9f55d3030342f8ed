package main

import (
	"encoding/json"
	"fmt"
	"os"
	"slices"

	"github.com/shardsrv/shardsrv/api"
)

// manifestEntry is one tensor of a live model's saved state, as clients/python's shardsrv.manifest
// writes it (dump, saved): the names, shapes and dtypes the engine's loader expects.
type manifestEntry struct {
	Name  string  `json:"name"`
	Shape []int64 `json:"shape"`
	DType string  `json:"dtype"`
}

func readManifest(path string) ([]manifestEntry, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	var m []manifestEntry
	if err := json.Unmarshal(raw, &m); err != nil {
		return nil, fmt.Errorf("%s: not a JSON list of {name, shape, dtype}: %w", path, err)
	}
	return m, nil
}

// manifestDiff lists every difference between the table the server lays out and the manifest a
// live engine dumped, one line each, in the manifest's order then the table's: a tensor the engine
// holds and the table lacks, one the table serves and the engine does not hold, and a shape or
// dtype that differs.
func manifestDiff(table []api.TensorRequest, manifest []manifestEntry) []string {
	served := map[string]api.TensorRequest{}
	for _, t := range table {
		served[t.Name] = t
	}
	held := map[string]bool{}
	var out []string
	for _, e := range manifest {
		held[e.Name] = true
		t, ok := served[e.Name]
		switch {
		case !ok:
			out = append(out, fmt.Sprintf("missing: %s %s %v (the engine holds it; the table does not)",
				e.Name, e.DType, e.Shape))
		case !slices.Equal(t.Shape, e.Shape):
			out = append(out, fmt.Sprintf("shape: %s is %v in the table, %v in the engine", e.Name, t.Shape, e.Shape))
		}
		if ok && string(t.Dtype) != e.DType {
			out = append(out, fmt.Sprintf("dtype: %s is %s in the table, %s in the engine", e.Name, t.Dtype, e.DType))
		}
	}
	for _, t := range table {
		if !held[t.Name] {
			out = append(out, fmt.Sprintf("extra: %s %s %v (the table serves it; the engine does not hold it)",
				t.Name, t.Dtype, t.Shape))
		}
	}
	return out
}
