package server

import (
	"crypto/sha256"
	"encoding/base64"
	"hash"
	"io"
	"net/http"
	"strconv"
	"strings"
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
	dict, ok := parseDictionary(strings.Join(lines, ","))
	w, found := dict["sha-256"]
	return ok && found && w == 0
}

// parseDictionary parses an RFC 8941 dictionary, keeping each member's integer value (-1 for a
// value of another type); parameters are checked and dropped.
func parseDictionary(s string) (map[string]int64, bool) {
	p := sfParser{s: s}
	dict := map[string]int64{}
	p.skip(" ")
	for p.i < len(p.s) {
		key, ok := p.key()
		if !ok {
			return nil, false
		}
		value := int64(-1) // a bare key is the boolean true
		if p.eat('=') {
			if value, ok = p.bareItem(); !ok {
				return nil, false
			}
		}
		for p.eat(';') { // parameters
			p.skip(" ")
			if _, ok := p.key(); !ok {
				return nil, false
			}
			if p.eat('=') {
				if _, ok := p.bareItem(); !ok {
					return nil, false
				}
			}
		}
		dict[key] = value
		p.skip(" \t")
		if p.i == len(p.s) {
			break
		}
		if !p.eat(',') {
			return nil, false
		}
		p.skip(" \t")
		if p.i == len(p.s) { // a trailing comma
			return nil, false
		}
	}
	return dict, true
}

type sfParser struct {
	s string
	i int
}

func (p *sfParser) eat(c byte) bool {
	if p.i < len(p.s) && p.s[p.i] == c {
		p.i++
		return true
	}
	return false
}

func (p *sfParser) skip(chars string) {
	for p.i < len(p.s) && strings.IndexByte(chars, p.s[p.i]) >= 0 {
		p.i++
	}
}

// span advances over the bytes ok accepts and returns them.
func (p *sfParser) span(ok func(c byte) bool) string {
	start := p.i
	for p.i < len(p.s) && ok(p.s[p.i]) {
		p.i++
	}
	return p.s[start:p.i]
}

func isLower(c byte) bool { return c >= 'a' && c <= 'z' }
func isDigit(c byte) bool { return c >= '0' && c <= '9' }
func isAlpha(c byte) bool { return isLower(c) || c >= 'A' && c <= 'Z' }

// key is lcalpha / "*" then lcalpha, digits, "_", "-", "." and "*".
func (p *sfParser) key() (string, bool) {
	if p.i == len(p.s) || !isLower(p.s[p.i]) && p.s[p.i] != '*' {
		return "", false
	}
	return p.span(func(c byte) bool { return isLower(c) || isDigit(c) || strings.IndexByte("_-.*", c) >= 0 }), true
}

// bareItem parses any bare item and returns an integer's value, -1 for the other types.
func (p *sfParser) bareItem() (int64, bool) {
	if p.i == len(p.s) {
		return 0, false
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		neg := p.eat('-')
		digits := p.span(isDigit)
		if digits == "" || len(digits) > 15 {
			return 0, false
		}
		if p.eat('.') { // a decimal: at most 12 integer and 3 fractional digits
			frac := p.span(isDigit)
			return -1, len(digits) <= 12 && frac != "" && len(frac) <= 3
		}
		v, _ := strconv.ParseInt(digits, 10, 64)
		if neg {
			v = -v
		}
		return v, true
	case c == '"':
		for p.i++; p.i < len(p.s); p.i++ {
			switch p.s[p.i] {
			case '\\':
				if p.i++; p.i == len(p.s) || p.s[p.i] != '"' && p.s[p.i] != '\\' {
					return 0, false
				}
			case '"':
				p.i++
				return -1, true
			default:
				if p.s[p.i] < 0x20 || p.s[p.i] > 0x7e {
					return 0, false
				}
			}
		}
		return 0, false
	case c == ':':
		p.i++
		p.span(func(c byte) bool { return isAlpha(c) || isDigit(c) || strings.IndexByte("+/=", c) >= 0 })
		return -1, p.eat(':')
	case c == '?':
		p.i++
		return -1, p.eat('0') || p.eat('1')
	case isAlpha(c) || c == '*':
		p.span(func(c byte) bool {
			return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
		})
		return -1, true
	}
	return 0, false
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
