package main

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"encoding/pem"
	"fmt"
	"os"
	"path/filepath"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/oms"
)

// verifyScenario: the 1 GiB direct shard of the local scenario from a signed checkpoint, with
// --verify required against --verify off, with the digest declined (so the hashing measured is
// the verification's alone) and with the defaults (the digest on). The warm-up read of each server
// is the first: the timed ones are later reads of the same file, which a local file's shard
// verdicts serve from the page cache without hashing (by sendfile), and whose digest each server
// has memoised by then.
func verifyScenario(r *report, bin, store string) {
	const gib = 1 << 30
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	must(err)
	der, err := x509.MarshalPKCS8PrivateKey(key)
	must(err)
	pub, err := x509.MarshalPKIXPublicKey(key.Public())
	must(err)
	keyFile, pubFile := filepath.Join(scratch, "sign.pem"), filepath.Join(scratch, "sign.pub.pem")
	must(os.WriteFile(keyFile, pem.EncodeToMemory(&pem.Block{Type: "PRIVATE KEY", Bytes: der}), 0o600))
	must(os.WriteFile(pubFile, pem.EncodeToMemory(&pem.Block{Type: "PUBLIC KEY", Bytes: pub}), 0o644))
	run(bin, "sign", "--key", keyFile, filepath.Join(store, "big"))
	defer os.Remove(filepath.Join(store, "big", oms.SignatureFile)) // later scenarios read it unsigned
	off := startServer(bin, store, "--verify", "off")
	on := startServer(bin, store, "--verify", "required", "--trust-key", pubFile)
	direct := bodyFile(rowSlab("big", 0, gib/rowBytes, 1, api.BF16))
	ds := interleaved(
		func() { curl("http://"+off.addr+"/v1/shards", direct, gib, declined) },
		func() { curl("http://"+on.addr+"/v1/shards", direct, gib, declined) },
		func() { curl("http://"+off.addr+"/v1/shards", direct, gib) },
		func() { curl("http://"+on.addr+"/v1/shards", direct, gib) },
	)
	off.stop()
	on.stop()
	r.goal(goal{"--verify required, later reads of the same file (digest declined)", throughput(gib, ds[1]),
		"--verify off: " + throughput(gib, ds[0]), fmt.Sprintf("%.2f×", ratio(ds[0], ds[1])), "≥ 0.85×"})
	r.goal(goal{"the same, default flags (digest on; memoised on later reads)", throughput(gib, ds[3]),
		"--verify off: " + throughput(gib, ds[2]), fmt.Sprintf("%.2f×", ratio(ds[2], ds[3])), "≥ 0.85×"})
	r.add("Verification: 1 GiB direct shard of a signed local checkpoint (1 MiB shards)",
		row{"--verify off, digest declined", throughput(gib, ds[0]), ""},
		row{"--verify required, digest declined, later reads (each shard hashed once per file version, then sent unhashed)",
			throughput(gib, ds[1]), fmt.Sprintf("%.2f× --verify off (goal ≥ 0.85×)", ratio(ds[0], ds[1]))},
		row{"--verify off, digest on (the defaults), later reads (the digest memoised)", throughput(gib, ds[2]), ""},
		row{"--verify required, digest on, later reads", throughput(gib, ds[3]),
			fmt.Sprintf("%.2f× --verify off with the digest on (goal ≥ 0.85×)", ratio(ds[2], ds[3]))},
	)
}
