package s3reader

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"net/url"
	"syscall"
	"testing"

	awshttp "github.com/aws/aws-sdk-go-v2/aws/transport/http"
	"github.com/aws/smithy-go"
	smithyhttp "github.com/aws/smithy-go/transport/http"

	"github.com/shardsrv/shardsrv/internal/store"
)

func responseError(status int, code string) error {
	var err error = &smithy.GenericAPIError{Code: code, Message: "test"}
	return &smithy.OperationError{ServiceID: "S3", OperationName: "GetObject", Err: &awshttp.ResponseError{
		ResponseError: &smithyhttp.ResponseError{
			Response: &smithyhttp.Response{Response: &http.Response{StatusCode: status}},
			Err:      err,
		}}}
}

func sendError(err error) error {
	return &smithy.OperationError{
		ServiceID:     "S3",
		OperationName: "GetObject",
		Err:           &smithyhttp.RequestSendError{Err: err},
	}
}

func TestTransientClassification(t *testing.T) {
	for _, c := range []struct {
		name string
		err  error
		want bool
	}{
		{"500", responseError(500, "InternalError"), true},
		{"503 SlowDown", responseError(503, "SlowDown"), true},
		{"429", responseError(429, ""), true},
		{"403", responseError(403, "AccessDenied"), false},
		{"404", responseError(404, "NoSuchKey"), false},
		{"412", responseError(412, "PreconditionFailed"), false},
		{"connection reset", sendError(&net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}), true},
		{
			"connection refused",
			sendError(&url.Error{Op: "Get", URL: "http://x",
				Err: &net.OpError{Op: "dial", Net: "tcp", Err: syscall.ECONNREFUSED}}),
			true,
		},
		{"host not found", &url.Error{Op: "Get", URL: "http://x", Err: &net.OpError{Op: "dial", Net: "tcp",
			Err: &net.DNSError{Err: "no such host", Name: "x", IsNotFound: true}}}, false},
		{"cancelled", context.Canceled, false},
		{"changed", fmt.Errorf("x: %w", store.ErrChanged), false},
		{"plain error", errors.New("something"), false},
	} {
		if got := (&bucket{}).Transient(c.err); got != c.want {
			t.Errorf("%s: transient = %v, want %v", c.name, got, c.want)
		}
	}
}

func TestClassifySentinels(t *testing.T) {
	b := &bucket{name: "b"}
	for _, c := range []struct {
		err  error
		want error
	}{
		{responseError(403, "AccessDenied"), store.ErrPermissionDenied},
		{responseError(403, "SignatureDoesNotMatch"), store.ErrPermissionDenied},
		{responseError(404, "NoSuchKey"), store.ErrNotFound},
		{responseError(412, "PreconditionFailed"), store.ErrChanged},
		{responseError(416, "InvalidRange"), store.ErrOutOfRange},
		{responseError(503, "SlowDown"), store.ErrUnavailable},
	} {
		if got := b.Classify(c.err); !errors.Is(got, c.want) {
			t.Errorf("Classify(%v) = %v, want %v", c.err, got, c.want)
		}
	}
}
