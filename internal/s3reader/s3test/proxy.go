package s3test

import (
	"net/http"

	"github.com/shardsrv/shardsrv/internal/store/objstore/faultproxy"
)

// Fault is what the proxy does to one request.
type Fault = faultproxy.Fault

// The faults, under S3's names.
const (
	Pass      = faultproxy.Pass
	SlowDown  = faultproxy.Throttle // 503 SlowDown, as S3 sheds load
	Reset     = faultproxy.Reset
	Truncate  = faultproxy.Truncate
	Stall     = faultproxy.Stall
	Forbidden = faultproxy.Forbidden // 403 AccessDenied
)

// Proxy sits between a client and the gateway and injects faults into ranged GETs (data reads).
// SigV4 signatures survive: the Host header is kept.
type Proxy = faultproxy.Proxy

// NewProxy starts a proxy in front of the gateway.
func (g *Gateway) NewProxy() *Proxy { return faultproxy.Start(g.Endpoint, s3Errors) }

// s3Errors writes S3's answers to the faults.
func s3Errors(w http.ResponseWriter, f Fault) {
	if f == Forbidden {
		faultproxy.XMLError(w, http.StatusForbidden, "AccessDenied", "Access Denied")
		return
	}
	faultproxy.XMLError(w, http.StatusServiceUnavailable, "SlowDown", "Please reduce your request rate.")
}
