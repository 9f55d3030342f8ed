package planner

import "github.com/shardsrv/shardsrv/api"

// reportEntryBytes is what one read or piece of a plan report takes while it is built and
// encoded: its Go value and about 60 bytes of JSON.
const reportEntryBytes = 200

// ReportBytes is about how much memory the plan's Report takes while it is built and encoded
// whole, for the server to charge to its memory budget.
func (p *Plan) ReportBytes() int64 {
	var entries int64
	for _, it := range p.Items {
		entries += int64(len(it.Pieces))
	}
	return (entries + p.ReadRequests) * reportEntryBytes
}

// Report is the plan as /v1/plan answers it (docs/contract.md): the summary, and every box of
// every tensor in request order with its place in the body, its pieces and its reads. Pieces are
// there only when the plan was made with them (Options.NoPieces unset).
func (p *Plan) Report() api.PlanResponse {
	resp := api.PlanResponse{
		Summary: api.PlanSummary{
			OutputBytes:  p.BodyBytes,
			NeededBytes:  p.NeededBytes,
			ReadBytes:    p.ReadBytes,
			ReadRequests: p.ReadRequests,
		},
	}
	boxes := []int{} // boxes per tensor, in request order; items are in body order
	for _, it := range p.Items {
		for len(boxes) <= it.Tensor {
			boxes = append(boxes, 0)
		}
		boxes[it.Tensor] = max(boxes[it.Tensor], it.Box+1)
	}
	resp.Tensors = make([]api.TensorPlan, len(boxes))
	for i, n := range boxes {
		resp.Tensors[i].Boxes = make([]api.BoxPlan, n)
	}
	for _, it := range p.Items {
		box := api.BoxPlan{
			Offsets:      it.Offsets,
			Lengths:      it.Lengths,
			OutputOffset: it.Output,
			OutputBytes:  it.Bytes,
			Pieces:       []api.PiecePlan{},
			Reads:        []api.ReadPlan{},
		}
		for _, pc := range it.Pieces {
			mode := api.Gather
			if pc.Direct {
				mode = api.Direct
			}
			box.Pieces = append(box.Pieces,
				api.PiecePlan{Block: pc.Block, Source: pc.Source, Offsets: pc.Offsets, Lengths: pc.Lengths, Mode: mode})
		}
		for _, rd := range it.Reads() {
			box.Reads = append(box.Reads, api.ReadPlan{File: rd.Key, Offset: rd.Offset, Length: rd.Length})
		}
		resp.Tensors[it.Tensor].Name = it.Name
		resp.Tensors[it.Tensor].Boxes[it.Box] = box
	}
	return resp
}
