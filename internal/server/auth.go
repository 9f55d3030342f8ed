package server

import (
	"bufio"
	"bytes"
	"crypto/subtle"
	"fmt"
	"os"
	"strings"
	"sync"
	"time"
)

// Tokens are the bearer tokens a client may present, read from a file (one per line, '#' starts
// a comment) and read again when the file changes, so tokens rotate without a restart.
type Tokens struct {
	path    string
	mu      sync.Mutex
	tokens  [][]byte
	modTime time.Time
	size    int64
	checked time.Time
}

// LoadTokens reads a tokens file; it must hold at least one token.
func LoadTokens(path string) (*Tokens, error) {
	t := &Tokens{path: path}
	if err := t.reload(); err != nil {
		return nil, err
	}
	return t, nil
}

func (t *Tokens) reload() error {
	fi, err := os.Stat(t.path)
	if err != nil {
		return fmt.Errorf("auth tokens file: %w", err)
	}
	if fi.ModTime().Equal(t.modTime) && fi.Size() == t.size {
		return nil
	}
	data, err := os.ReadFile(t.path)
	if err != nil {
		return fmt.Errorf("auth tokens file: %w", err)
	}
	var tokens [][]byte
	sc := bufio.NewScanner(bytes.NewReader(data))
	for sc.Scan() {
		line, _, _ := strings.Cut(sc.Text(), "#")
		if line = strings.TrimSpace(line); line != "" {
			tokens = append(tokens, []byte(line))
		}
	}
	if len(tokens) == 0 {
		return fmt.Errorf("auth tokens file %s holds no token", t.path)
	}
	t.tokens, t.modTime, t.size = tokens, fi.ModTime(), fi.Size()
	return nil
}

// Valid reports whether token is one of the tokens, comparing in constant time. The file is
// looked at again at most once a second; a file that became unreadable keeps the last tokens.
func (t *Tokens) Valid(token string) bool {
	t.mu.Lock()
	if time.Since(t.checked) > time.Second {
		t.checked = time.Now()
		t.reload()
	}
	tokens := t.tokens
	t.mu.Unlock()
	ok := 0
	for _, want := range tokens {
		ok |= subtle.ConstantTimeCompare([]byte(token), want)
	}
	return ok == 1
}
