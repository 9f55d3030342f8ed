package api

import (
	"context"
	"net/http"
)

// Prefetch asks the server to fill its cache — each chunk on the replica that owns it — with what
// req reads, or with every file of the checkpoint when req names neither tensors nor a layout.
func (c *Client) Prefetch(ctx context.Context, req *ShardRequest) (*PrefetchResponse, error) {
	var out PrefetchResponse
	err := c.getJSON(ctx, http.MethodPost, "/v1/prefetch", req, &out)
	return &out, err
}
