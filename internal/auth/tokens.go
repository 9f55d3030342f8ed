// Package auth holds the bearer tokens a server accepts: a file of them, read again as it changes,
// so tokens rotate without a restart and revocation fails closed. Reading the Authorization header
// is the HTTP server's.
package auth

import (
	"bufio"
	"bytes"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"strings"
	"sync"
	"syscall"
	"time"
)

// Tokens are the bearer tokens a client may present, read from a file (one per line, '#' starts
// a comment) and read again every Reload, so tokens rotate without a restart.
//
// Revocation fails closed: a file that becomes empty, holds only comments, cannot be read, is
// deleted, or is replaced by a directory or anything else that is not a regular file leaves no
// token valid, and every re-read that finds it so logs an error. Changes are found by the content's
// hash, never by size or modification time, so a same-size rewrite with the old mtime is seen.
type Tokens struct {
	path   string
	reload time.Duration
	log    *slog.Logger

	mu      sync.Mutex
	tokens  [][]byte
	hash    [sha256.Size]byte
	checked time.Time
}

// TokensOptions tune LoadTokens.
type TokensOptions struct {
	// Reload is how often the file is read again: the longest a revoked token may still work.
	// Zero: 1 s; negative: refused.
	Reload time.Duration
	// Logger receives an error for each re-read that revoked every token, and a line when the
	// tokens change. Default: nothing is logged.
	Logger *slog.Logger
}

// Validate reports what LoadTokens refuses: a negative Reload.
func (o TokensOptions) Validate() error {
	if o.Reload < 0 {
		return fmt.Errorf("auth: the tokens file's reload interval %s is negative", o.Reload)
	}
	return nil
}

// maxTokensFile bounds the tokens file read.
const maxTokensFile = 1 << 20

// LoadTokens reads a tokens file; at start it must hold at least one token.
func LoadTokens(path string, opts ...TokensOptions) (*Tokens, error) {
	t := &Tokens{path: path, reload: time.Second, log: slog.New(slog.DiscardHandler)}
	for _, o := range opts {
		if err := o.Validate(); err != nil {
			return nil, err
		}
		if o.Reload > 0 {
			t.reload = o.Reload
		}
		if o.Logger != nil {
			t.log = o.Logger
		}
	}
	data, err := readTokensFile(path)
	if err != nil {
		return nil, err
	}
	tokens := parseTokens(data)
	if len(tokens) == 0 {
		return nil, fmt.Errorf("auth tokens file %s holds no token", path)
	}
	t.tokens, t.hash, t.checked = tokens, sha256.Sum256(data), time.Now()
	return t, nil
}

// readTokensFile reads the file without ever blocking on it (a FIFO in its place would) and only
// when it is a regular file.
func readTokensFile(path string) ([]byte, error) {
	f, err := os.OpenFile(path, os.O_RDONLY|syscall.O_NONBLOCK|syscall.O_NOCTTY, 0)
	if err != nil {
		return nil, fmt.Errorf("auth tokens file: %w", err)
	}
	defer f.Close()
	fi, err := f.Stat()
	if err != nil {
		return nil, fmt.Errorf("auth tokens file: %w", err)
	}
	if !fi.Mode().IsRegular() {
		return nil, fmt.Errorf("auth tokens file %s is not a regular file (%s)", path, fi.Mode().Type())
	}
	data, err := io.ReadAll(io.LimitReader(f, maxTokensFile+1))
	if err != nil {
		return nil, fmt.Errorf("auth tokens file: %w", err)
	}
	if len(data) > maxTokensFile {
		return nil, fmt.Errorf("auth tokens file %s is over %d bytes", path, maxTokensFile)
	}
	return data, nil
}

func parseTokens(data []byte) [][]byte {
	var tokens [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, maxTokensFile+1)
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line != "" {
			tokens = append(tokens, []byte(line))
		}
	}
	return tokens
}

// refresh reads the file again; t.mu is held. Any failure revokes every token.
func (t *Tokens) refresh() {
	data, err := readTokensFile(t.path)
	if err == nil {
		h := sha256.Sum256(data)
		if h == t.hash && len(t.tokens) > 0 {
			return
		}
		t.hash = h
		if tokens := parseTokens(data); len(tokens) > 0 {
			t.tokens = tokens
			t.log.Info("auth tokens file changed: tokens reloaded", "tokens", len(tokens))
			return
		}
		err = errors.New("auth tokens file " + t.path + " holds no token")
	}
	t.tokens, t.hash = nil, [sha256.Size]byte{}
	t.log.Error("every bearer token is revoked until the tokens file holds one again", "err", err)
}

// list returns the tokens, reading the file again at most once per Reload.
func (t *Tokens) list() [][]byte {
	t.mu.Lock()
	defer t.mu.Unlock()
	if time.Since(t.checked) >= t.reload {
		t.checked = time.Now()
		t.refresh()
	}
	return t.tokens
}

// First returns the file's first token, "" while it holds none: what a replica presents to its
// peers, so a rotation lists the new secret second, then first, then alone.
func (t *Tokens) First() string {
	if tokens := t.list(); len(tokens) > 0 {
		return string(tokens[0])
	}
	return ""
}

// Valid reports whether token is one of the tokens, comparing in constant time.
func (t *Tokens) Valid(token string) bool {
	tokens := t.list()
	ok := 0
	for _, want := range tokens {
		ok |= subtle.ConstantTimeCompare([]byte(token), want)
	}
	return ok == 1 && token != ""
}
