package planner

import (
	"encoding/json"
	"slices"
	"sort"
	"testing"

	"github.com/shardsrv/shardsrv/api"
)

// The report holds every box of the request where the request put it, the boxes tile the body in
// order after the header, and its reads and pieces are the ones the summary counts, each piece
// naming its block's source.
func TestReportHoldsEveryBoxOfTheRequest(t *testing.T) {
	for _, s := range fuzzSeeds {
		var req api.ShardRequest
		if err := json.Unmarshal([]byte(s), &req); err != nil {
			t.Fatal(err)
		}
		for _, noPieces := range []bool{false, true} {
			opts := Options{SegmentBytes: 7, SegmentReadBytes: 7, MaxGap: 8, MaxRead: 16, NoPieces: noPieces}
			p, err := New(&req, testCheckpoint(), opts)
			if err != nil {
				t.Fatalf("%s: %v", s, err)
			}
			checkReport(t, s, &req, p, noPieces)
		}
	}
}

func checkReport(t *testing.T, seed string, req *api.ShardRequest, p *Plan, noPieces bool) {
	t.Helper()
	r := p.Report()
	want := api.PlanSummary{OutputBytes: p.BodyBytes, NeededBytes: p.NeededBytes, ReadBytes: p.ReadBytes,
		ReadRequests: p.ReadRequests}
	if r.Summary != want {
		t.Fatalf("%s: summary %+v, want %+v", seed, r.Summary, want)
	}
	if len(r.Tensors) != len(req.Tensors) {
		t.Fatalf("%s: %d tensors reported, %d requested", seed, len(r.Tensors), len(req.Tensors))
	}
	var boxes []api.BoxPlan
	var reads, readBytes, pieces int64
	for i, tr := range req.Tensors {
		got := r.Tensors[i]
		if got.Name != tr.Name || len(got.Boxes) != len(tr.Boxes) {
			t.Fatalf("%s: tensor %d reported as %q with %d boxes, requested %q with %d",
				seed, i, got.Name, len(got.Boxes), tr.Name, len(tr.Boxes))
		}
		for j, b := range got.Boxes {
			if !slices.Equal(b.Offsets, tr.Boxes[j].Offsets) || !slices.Equal(b.Lengths, tr.Boxes[j].Lengths) {
				t.Fatalf("%s: tensor %d box %d reported at %v+%v, requested at %v+%v",
					seed, i, j, b.Offsets, b.Lengths, tr.Boxes[j].Offsets, tr.Boxes[j].Lengths)
			}
			if noPieces && len(b.Pieces) > 0 {
				t.Fatalf("%s: a plan without pieces reports %d", seed, len(b.Pieces))
			}
			for _, pc := range b.Pieces {
				if tr.Deferred != nil { // a completion is one piece of the box, named after its first source
					if pc.Block != -1 || pc.Source != tr.Deferred.Sources[0] {
						t.Fatalf("%s: tensor %d box %d: completion piece of block %d from %q", seed, i, j, pc.Block, pc.Source)
					}
					continue
				}
				if pc.Block < 0 || pc.Block >= len(*tr.Blocks) || pc.Source != (*tr.Blocks)[pc.Block].Source {
					t.Fatalf("%s: tensor %d box %d: piece of block %d from %q", seed, i, j, pc.Block, pc.Source)
				}
			}
			for _, rd := range b.Reads {
				reads++
				readBytes += rd.Length
			}
			pieces += int64(len(b.Pieces))
			boxes = append(boxes, b)
		}
	}
	if reads != p.ReadRequests || readBytes != p.ReadBytes {
		t.Fatalf("%s: the boxes read %d bytes in %d requests, the summary says %d in %d",
			seed, readBytes, reads, p.ReadBytes, p.ReadRequests)
	}
	if p.ReportBytes() < (reads+pieces)*reportEntryBytes {
		t.Fatalf("%s: the report of %d reads and %d pieces is charged %d bytes", seed, reads, pieces, p.ReportBytes())
	}
	sort.Slice(boxes, func(a, b int) bool { return boxes[a].OutputOffset < boxes[b].OutputOffset })
	at := int64(len(p.Header))
	for _, b := range boxes {
		if b.OutputOffset != at {
			t.Fatalf("%s: a box starts at byte %d of the body, the one before it ends at %d", seed, b.OutputOffset, at)
		}
		at += b.OutputBytes
	}
	if at != p.BodyBytes {
		t.Fatalf("%s: the boxes end at byte %d of a %d-byte body", seed, at, p.BodyBytes)
	}
}
