package main

import (
	"bytes"
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// sign then verify a folder end to end; a flipped byte, an unsigned file and a shard size servers
// would refuse are each an error that names what is wrong.
func TestSignThenVerify(t *testing.T) {
	dir, keys := t.TempDir(), t.TempDir()
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatal(err)
	}
	priv, _ := x509.MarshalPKCS8PrivateKey(key)
	pub, _ := x509.MarshalPKIXPublicKey(&key.PublicKey)
	privFile, pubFile := filepath.Join(keys, "key.pem"), filepath.Join(keys, "key.pub.pem")
	must := func(err error) {
		t.Helper()
		if err != nil {
			t.Fatal(err)
		}
	}
	must(os.WriteFile(privFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: priv}), 0o600))
	must(os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o600))
	weights := bytes.Repeat([]byte("0123456789abcdef"), 5000) // 80,000 bytes: 20 shards of 4 KiB
	must(os.WriteFile(filepath.Join(dir, "model.safetensors"), weights, 0o644))
	must(os.WriteFile(filepath.Join(dir, "config.json"), []byte(`{"a":1}`), 0o644))

	var out, errs bytes.Buffer
	if err := signCmd([]string{"--key", privFile, "--shard-size", "4KiB", dir}, &out, &errs); err != nil {
		t.Fatalf("sign: %v\n%s", err, errs.String())
	}
	verifyOut := func() (string, error) {
		var out bytes.Buffer
		err := verifyCmd([]string{"--trust-key", pubFile, dir}, &out, &bytes.Buffer{})
		return out.String(), err
	}
	if got, err := verifyOut(); err != nil || !strings.Contains(got, "verified 2 files") {
		t.Fatalf("verify of what sign wrote: %q, %v", got, err)
	}

	weights[40_000] ^= 1
	must(os.WriteFile(filepath.Join(dir, "model.safetensors"), weights, 0o644))
	if _, err := verifyOut(); err == nil || !strings.Contains(err.Error(), "model.safetensors") {
		t.Errorf("verify of a flipped byte: %v, want an error naming the file", err)
	}
	weights[40_000] ^= 1
	must(os.WriteFile(filepath.Join(dir, "model.safetensors"), weights, 0o644))
	must(os.WriteFile(filepath.Join(dir, "extra.bin"), []byte("x"), 0o644))
	if _, err := verifyOut(); err == nil || !strings.Contains(err.Error(), "extra.bin is not covered") {
		t.Errorf("verify of a file added after signing: %v", err)
	}

	for _, size := range []string{"8MiB", "3000"} {
		err = signCmd([]string{"--key", privFile, "--shard-size", size, dir}, &out, &bytes.Buffer{})
		if err == nil || !strings.Contains(err.Error(), "power of two up to 4194304") {
			t.Errorf("sign with %s shards, which servers refuse: %v", size, err)
		}
	}
}
