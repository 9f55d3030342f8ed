package server_test

import (
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/auth"
	"github.com/shardsrv/shardsrv/internal/server"
	"github.com/shardsrv/shardsrv/internal/store"
)

const tokenReload = 50 * time.Millisecond

func tokenServer(t *testing.T, contents string) (e *opsEnv, file string, logs *syncBuffer) {
	file = filepath.Join(t.TempDir(), "tokens")
	os.WriteFile(file, []byte(contents), 0o600)
	logs = &syncBuffer{}
	tokens, err := auth.LoadTokens(
		file,
		auth.TokensOptions{Reload: tokenReload, Logger: slog.New(slog.NewJSONHandler(logs, nil))},
	)
	if err != nil {
		t.Fatal(err)
	}
	return opsServer(t, func(c *server.Config, st store.Store) { c.Tokens = tokens }), file, logs
}

func (e *opsEnv) status(t *testing.T, auth string) int {
	res, _ := e.post(t, "/v1/plan", e.req, "Authorization", auth)
	return res.StatusCode
}

// Every way a tokens file can stop holding tokens revokes every token within the reload period
// (fails closed), with an error logged at each re-read; a good file brings them back.
func TestTokensFileRevocationFailsClosed(t *testing.T) {
	e, file, logs := tokenServer(t, "alpha-token\n")
	restore := func() {
		os.RemoveAll(file)
		os.WriteFile(file, []byte("alpha-token\n"), 0o600)
	}
	cases := []struct {
		name   string
		change func() bool // false: not possible here
	}{
		{"emptied", func() bool { return os.WriteFile(file, nil, 0o600) == nil }},
		{"comments only", func() bool {
			return os.WriteFile(file, []byte("# alpha-token was here\n\n   # and left\n"), 0o600) == nil
		}},
		{"deleted", func() bool { return os.Remove(file) == nil }},
		{"a directory", func() bool { os.Remove(file); return os.Mkdir(file, 0o700) == nil }},
		{"a FIFO", func() bool { os.Remove(file); return syscall.Mkfifo(file, 0o600) == nil }},
		{"a symlink loop", func() bool { os.Remove(file); return os.Symlink(file, file) == nil }},
		{"unreadable", func() bool { return os.Getuid() != 0 && os.Chmod(file, 0) == nil }},
	}
	for _, c := range cases {
		time.Sleep(2 * tokenReload)
		if got := e.status(t, "Bearer alpha-token"); got != 200 {
			t.Fatalf("before %s: %d", c.name, got)
		}
		if !c.change() {
			t.Logf("%s: not possible here (root reads any file)", c.name)
			restore()
			continue
		}
		errorsBefore := strings.Count(logs.String(), `"level":"ERROR"`)
		start := time.Now()
		for e.status(t, "Bearer alpha-token") != 401 {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("the tokens file %s: alpha-token still works after 10 s", c.name)
			}
			time.Sleep(10 * time.Millisecond)
		}
		time.Sleep(2 * tokenReload)
		if got := e.status(t, "Bearer alpha-token"); got != 401 {
			t.Errorf("the tokens file %s: a later re-read let alpha-token back in: %d", c.name, got)
		}
		if n := strings.Count(logs.String(), `"level":"ERROR"`) - errorsBefore; n < 2 {
			t.Errorf("the tokens file %s: %d errors logged over two re-reads, want one each", c.name, n)
		}
		t.Logf("%s: revoked after %v", c.name, time.Since(start).Round(time.Millisecond))
		restore()
		start = time.Now()
		for e.status(t, "Bearer alpha-token") != 200 {
			if time.Since(start) > 10*time.Second {
				t.Fatalf("after %s: a good file again does not bring the token back", c.name)
			}
			time.Sleep(10 * time.Millisecond)
		}
	}
	if strings.Contains(logs.String(), "alpha-token") {
		t.Error("a token was logged")
	}
}

// Changes are found by content: a rewrite of the same size that puts the old mtime back still
// rotates the tokens.
func TestTokensFileChangeSeenByContent(t *testing.T) {
	e, file, _ := tokenServer(t, "alpha-token\n")
	fi, _ := os.Stat(file)
	os.WriteFile(file, []byte("gamma-token\n"), 0o600) // same size
	os.Chtimes(file, fi.ModTime(), fi.ModTime())
	time.Sleep(2 * tokenReload)
	if got := e.status(t, "Bearer alpha-token"); got != 401 {
		t.Errorf("a token rewritten away (same size, same mtime) still works: %d", got)
	}
	if got := e.status(t, "Bearer gamma-token"); got != 200 {
		t.Errorf("the token written in (same size, same mtime) does not work: %d", got)
	}
}

// The auth scheme is case-insensitive (RFC 9110 §11.1); the token is not.
func TestBearerSchemeIsCaseInsensitive(t *testing.T) {
	e, _, _ := tokenServer(t, "alpha-token\n")
	for header, want := range map[string]int{
		"Bearer alpha-token": 200, "bearer alpha-token": 200, "BEARER alpha-token": 200, "bEaReR   alpha-token": 200,
		"Bearer ALPHA-TOKEN": 401, "Bearer": 401, "Bearer ": 401, "Bearerx alpha-token": 401,
		"Basic alpha-token": 401, "alpha-token": 401,
	} {
		if got := e.status(t, header); got != want {
			t.Errorf("Authorization %q: %d, want %d", header, got, want)
		}
	}
}
