package auth

import (
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"
)

// A zero Reload is the default interval; a negative one is refused, not taken for the default.
func TestLoadTokensValidatesItsOptions(t *testing.T) {
	path := filepath.Join(t.TempDir(), "tokens")
	if err := os.WriteFile(path, []byte("alpha-token\n"), 0o600); err != nil {
		t.Fatal(err)
	}
	tokens, err := LoadTokens(path, TokensOptions{})
	if err != nil || tokens.reload != time.Second || !tokens.Valid("alpha-token") {
		t.Fatalf("zero options: %v; want the token, re-read every 1 s", err)
	}
	if _, err := LoadTokens(path, TokensOptions{Reload: -time.Second}); err == nil ||
		!strings.Contains(err.Error(), "negative") {
		t.Errorf("a negative Reload: %v, want it refused", err)
	}
}
