package server_test

import (
	"encoding/json"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"testing"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/store"
)

// /v1/tensors comes a page at a time: 10,000 tensors by default (a 1.35M-tensor checkpoint is
// never one 100 MB response), `limit` up to 100,000, and next_page_token to go on.
func TestTensorsArePaginated(t *testing.T) {
	dir := t.TempDir()
	const n = 12_345
	tensors := make([]safetensors.TensorData, n)
	names := make([]string, n)
	for i := range tensors {
		names[i] = fmt.Sprintf("layers.%d.w", i)
		tensors[i] = safetensors.TensorData{Name: names[i], DType: "U8", Shape: []int64{1}, Data: []byte{byte(i)}}
	}
	slices.Sort(names)
	st, _ := store.NewLocal(dir)
	h := newHarness(t, planner.DefaultOptions(), st, localPut(t, dir))
	writeCheckpoint(t, h, "big", tensors...)

	page := func(query string) api.TensorList {
		t.Helper()
		res := h.do("GET", "/v1/tensors?checkpoint=big"+query, nil)
		if res.status != 200 {
			t.Fatalf("GET /v1/tensors?checkpoint=big%s: %d %s", query, res.status, res.body)
		}
		var l api.TensorList
		if err := json.Unmarshal(res.body, &l); err != nil {
			t.Fatal(err)
		}
		return l
	}
	first := page("")
	if len(first.Tensors) != 10_000 || first.NextPageToken == nil || first.Checkpoint != "big" {
		t.Fatalf("the first page by default: %d tensors, token %v", len(first.Tensors), first.NextPageToken)
	}
	for _, c := range []struct{ limit, pages int }{{10_000, 2}, {1000, 13}, {4096, 4}, {100_000, 1}, {1, 3}} {
		limit := c.limit
		var got []string
		token := ""
		for pages := 1; pages <= c.pages; pages++ {
			q := "&limit=" + strconv.Itoa(limit)
			if token != "" {
				q += "&page_token=" + url.QueryEscape(token)
			}
			l := page(q)
			if len(l.Tensors) != min(limit, n-len(got)) {
				t.Fatalf("limit %d: page %d holds %d", limit, pages, len(l.Tensors))
			}
			for _, ti := range l.Tensors {
				got = append(got, ti.Name)
				if ti.File != "model.safetensors" || ti.Dtype != "U8" || !slices.Equal(ti.Shape, []int64{1}) {
					t.Fatalf("entry %+v", ti)
				}
			}
			if (l.NextPageToken == nil) != (len(got) == n) {
				t.Fatalf("limit %d: page %d ends at %d of %d with token %v", limit, pages, len(got), n, l.NextPageToken)
			}
			if l.NextPageToken == nil {
				break
			}
			token = *l.NextPageToken
		}
		if !slices.Equal(got, names[:len(got)]) || len(got) != min(n, limit*c.pages) {
			t.Errorf(
				"limit %d: the pages hold %d names, not the first %d in order",
				limit,
				len(got),
				min(n, limit*c.pages),
			)
		}
	}
	// Pages are cut from JSON kept per checkpoint version: a changed checkpoint lists anew.
	writeCheckpoint(t, h, "big", tensors[:3]...)
	if l := page(""); len(l.Tensors) != 3 || l.NextPageToken != nil {
		t.Errorf("after the checkpoint changed: %d tensors, token %v", len(l.Tensors), l.NextPageToken)
	}
	for _, q := range []string{"&limit=0", "&limit=100001", "&limit=-3", "&limit=x", "&page_token=%21%21"} {
		if res := h.do("GET", "/v1/tensors?checkpoint=big"+q, nil); res.status != 400 {
			t.Errorf("%s: %d %s, want 400", q, res.status, res.body)
		}
	}
}
