// Package s3test starts a real S3 server for tests and benchmarks: versitygw over a temporary
// folder on 127.0.0.1, installed by `make` at a pinned version (Makefile `tools`).
package s3test

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/credentials"
	"github.com/aws/aws-sdk-go-v2/service/s3"
)

// The gateway's root credentials. They are test values, never real ones.
const (
	AccessKey = "shardsrv-test"
	SecretKey = "shardsrv-test-secret"
)

// Gateway is a running versitygw.
type Gateway struct {
	Endpoint string
	Dir      string
	Client   *s3.Client
	cmd      *exec.Cmd
}

// Binary finds versitygw: $VERSITYGW, the module's .tools/bin, or PATH.
func Binary() (string, error) {
	if p := os.Getenv("VERSITYGW"); p != "" {
		return p, nil
	}
	_, file, _, _ := runtime.Caller(0)
	local := filepath.Join(filepath.Dir(file), "..", "..", "..", ".tools", "bin", "versitygw")
	if _, err := os.Stat(local); err == nil {
		return local, nil
	}
	return exec.LookPath("versitygw")
}

// Start runs a gateway for the test (skipped without versitygw unless SHARDSRV_REQUIRE_S3 is
// set, as `make test` does) and sets the AWS credential variables the store's chain reads.
func Start(t testing.TB) *Gateway {
	t.Helper()
	bin, err := Binary()
	if err != nil {
		if os.Getenv("SHARDSRV_REQUIRE_S3") != "" {
			t.Fatalf("versitygw not found (run 'make tools'): %v", err)
		}
		t.Skip("versitygw not found; 'make test' installs it")
	}
	g, err := Run(bin, t.TempDir())
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(g.Stop)
	t.Setenv("AWS_ACCESS_KEY_ID", AccessKey)
	t.Setenv("AWS_SECRET_ACCESS_KEY", SecretKey)
	t.Setenv("AWS_REGION", "us-east-1")
	return g
}

// DieWithParent makes a child process exit when this one does, even on a crash.
func DieWithParent(cmd *exec.Cmd) { dieWithParent(cmd) }

// Run starts versitygw on a free loopback port over dir.
func Run(bin, dir string) (*Gateway, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, err
	}
	addr := ln.Addr().String()
	ln.Close()
	cmd := exec.Command(bin, "--port", addr, "posix", dir)
	cmd.Env = append(os.Environ(), "ROOT_ACCESS_KEY="+AccessKey, "ROOT_SECRET_KEY="+SecretKey)
	var logs bytes.Buffer
	cmd.Stdout, cmd.Stderr = &logs, &logs
	dieWithParent(cmd)
	if err := cmd.Start(); err != nil {
		return nil, err
	}
	g := &Gateway{Endpoint: "http://" + addr, Dir: dir, cmd: cmd}
	g.Client = s3.New(s3.Options{Region: "us-east-1", BaseEndpoint: aws.String(g.Endpoint), UsePathStyle: true,
		Credentials: credentials.NewStaticCredentialsProvider(AccessKey, SecretKey, "")})
	for range 200 {
		if res, err := http.Get(g.Endpoint); err == nil {
			res.Body.Close()
			return g, nil
		}
		time.Sleep(25 * time.Millisecond)
	}
	g.Stop()
	return nil, fmt.Errorf("versitygw did not start: %s", logs.String())
}

// Stop ends the gateway.
func (g *Gateway) Stop() {
	g.cmd.Process.Kill()
	g.cmd.Wait()
}

// CreateBucket makes a bucket.
func (g *Gateway) CreateBucket(t testing.TB, bucket string) {
	t.Helper()
	if _, err := g.Client.CreateBucket(context.Background(), &s3.CreateBucketInput{Bucket: &bucket}); err != nil {
		t.Fatal(err)
	}
}

// DeleteBucket deletes a bucket and every object in it.
func (g *Gateway) DeleteBucket(t testing.TB, bucket string) {
	t.Helper()
	ctx := context.Background()
	list, err := g.Client.ListObjectsV2(ctx, &s3.ListObjectsV2Input{Bucket: &bucket})
	if err != nil {
		t.Fatal(err)
	}
	for _, o := range list.Contents {
		if _, err := g.Client.DeleteObject(ctx, &s3.DeleteObjectInput{Bucket: &bucket, Key: o.Key}); err != nil {
			t.Fatal(err)
		}
	}
	if _, err := g.Client.DeleteBucket(ctx, &s3.DeleteBucketInput{Bucket: &bucket}); err != nil {
		t.Fatal(err)
	}
}

// Put writes (or replaces) an object.
func (g *Gateway) Put(t testing.TB, bucket, key string, data []byte) {
	t.Helper()
	if err := g.PutErr(bucket, key, data); err != nil {
		t.Fatal(err)
	}
}

// PutErr writes (or replaces) an object.
func (g *Gateway) PutErr(bucket, key string, data []byte) error {
	_, err := g.Client.PutObject(
		context.Background(),
		&s3.PutObjectInput{Bucket: &bucket, Key: &key, Body: bytes.NewReader(data)},
	)
	return err
}
