package verify_test

import (
	"bytes"
	"crypto"
	"errors"
	"testing"

	"github.com/shardsrv/shardsrv/internal/budget"
	"github.com/shardsrv/shardsrv/internal/oms"
	"github.com/shardsrv/shardsrv/internal/store/storetest"
	"github.com/shardsrv/shardsrv/internal/verify"
)

// A model.sig is verified within the memory budget the verifier is charged to: seven times its
// length is held while it is read and verified, so while others hold the budget the first Stat
// under it waits and then fails with ErrBusy (a 503), and once they let go it verifies, and every
// byte comes back.
func TestSignatureIsVerifiedWithinTheBudget(t *testing.T) {
	raw, put := storetest.Local(t)
	data := pattern(64<<10, 5)
	src := oms.FileSource{Path: "w.bin", Size: int64(len(data)), R: bytes.NewReader(data)}
	m, err := oms.BuildShards("model", []oms.FileSource{src}, 64)
	if err != nil {
		t.Fatal(err)
	}
	key := newKey(t)
	bundle, err := oms.Sign(m, key)
	if err != nil {
		t.Fatal(err)
	}
	put("m/w.bin", data)
	put("m/model.sig", bundle)
	n := int64(len(bundle))
	mem := budget.New(budget.Config{Bytes: 8 * n})
	others, err := mem.Reserve(ctx, 2*n)
	if err != nil {
		t.Fatal(err)
	}
	s := verify.New(raw, verify.ModeRequired, []crypto.PublicKey{key.Public()}, nil)
	s.Reserve = mem.Reserve
	if _, err := s.Stat(ctx, "m/w.bin"); !errors.Is(err, budget.ErrBusy) {
		t.Fatalf("a %d-byte model.sig with %d of a %d-byte budget free: %v, want ErrBusy", n, 6*n, 8*n, err)
	}
	others(2 * n)
	if _, err := s.Stat(ctx, "m/w.bin"); err != nil {
		t.Fatal(err)
	}
	if got := mem.Held(); got != 0 {
		t.Fatalf("the budget holds %d bytes after the signature was verified", got)
	}
}
