package server

import (
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"io"
	"net/http"
	"strings"

	"github.com/shardsrv/shardsrv/internal/sfv"
)

// A shard response proves its own integrity with an RFC 9530 Repr-Digest trailer: the SHA-256 of
// the body, computed while it streams. Hashing needs every byte in memory, so with the digest on
// a file section is copied through the stream's buffer instead of going to the socket by
// sendfile; a client that checks integrity otherwise declines it with "Want-Repr-Digest:
// sha-256=0".

// sendsDigest reports whether a shard response trails a Repr-Digest: unless the client declines
// it, over any HTTP that can carry trailers (HTTP/1.0 cannot).
func sendsDigest(r *http.Request) bool {
	return r.ProtoAtLeast(1, 1) && !declinesDigest(r.Header.Values("Want-Repr-Digest"))
}

// declinesDigest reports whether Want-Repr-Digest field lines (RFC 9530 §4: a structured-field
// dictionary of algorithm = preference, an integer from 0 to 10) give sha-256 the preference 0,
// "not acceptable". Lines are one dictionary, later members override earlier ones; a field that
// does not parse is ignored, as RFC 8941 requires; sha-256 absent or preferred is not declined.
func declinesDigest(lines []string) bool {
	if len(lines) == 0 {
		return false
	}
	dict, ok := sfv.ParseDictionary(strings.Join(lines, ","))
	w, found := dict["sha-256"]
	return ok && found && w == 0
}

// digester hashes the body on its way to w, on another core than the one writing: a hashing
// goroutine reads each write's bytes while they are written to w, and the write returns once
// both are done, so the bytes are never copied or held past the write, no memory beyond the
// stream's own buffers is needed, and value waits for no hashing at all. It has no ReadFrom: over
// HTTP/1.1 the trailer needs the chunked coding, and net/http sends a chunked body by copying,
// never by sendfile.
type digester struct {
	w      io.Writer
	h      hash.Hash
	todo   chan []byte   // the bytes being written, for the hasher to read
	done   chan struct{} // the hasher has hashed them
	closed bool
}

func newDigester(w io.Writer) *digester {
	d := &digester{w: w, h: sha256.New(), todo: make(chan []byte), done: make(chan struct{})}
	go d.hash()
	return d
}

func (d *digester) hash() {
	for p := range d.todo {
		d.h.Write(p)
		d.done <- struct{}{}
	}
}

// Write hashes p while writing it; it returns only when the hasher no longer reads p.
func (d *digester) Write(p []byte) (int, error) {
	d.todo <- p
	defer func() { <-d.done }() // even if w panics, so the hasher is not left holding p
	return d.w.Write(p)
}

// value is the Repr-Digest field value of what was written; it ends the body.
func (d *digester) value() string {
	d.close()
	return "sha-256=:" + base64.StdEncoding.EncodeToString(d.h.Sum(nil)) + ":"
}

// close stops the hasher; a body that failed is closed without a value.
func (d *digester) close() {
	if !d.closed {
		d.closed = true
		close(d.todo)
	}
}
