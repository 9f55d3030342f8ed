package server

import (
	"crypto/sha256"
	"encoding/base64"
	"net/http"
	"strings"

	lru "github.com/hashicorp/golang-lru/v2"

	"github.com/shardsrv/shardsrv/internal/sfv"
)

// A shard response proves its own integrity with an RFC 9530 Repr-Digest trailer: the SHA-256 of
// the body, computed while it streams (the executor's stream hashes it on a goroutine of its
// own, behind the writer). Hashing needs every byte in memory, so with the digest on a file
// section is copied through the stream's buffers instead of going to the socket by sendfile; a
// client that checks integrity otherwise declines it with "Want-Repr-Digest: sha-256=0".
// SHA-256 is the faster of the two algorithms RFC 9530 registers without known weaknesses on
// CPUs with the SHA extensions, which Go uses (sha-512 ran at a third of its speed here).

// Many pods fetch the same shard of the same checkpoint version, and the same request over files
// at the same versions streams the same body (resolve.Resolved.BodyKey). So a body streamed whole,
// its file versions confirmed to its last byte, leaves its SHA-256 in a memo; a later request for
// the same body gets it as a Repr-Digest header field (RFC 9530 allows a header or a trailer),
// with Content-Length, no chunking and no hashing: the stream of a client that declines the
// digest, file sections by sendfile to another host. Its reads carry the same versions, so a file
// changed since aborts the stream as it would any other, before the body's last byte.

// memoDigests is how many bodies' digests the memo keeps: two 32-byte hashes each, about 400 KB
// with the LRU's bookkeeping.
const memoDigests = 4096

// digestMemo maps body keys to the SHA-256 of the body each streamed.
type digestMemo = lru.Cache[[sha256.Size]byte, [sha256.Size]byte]

func newDigestMemo() *digestMemo {
	memo, _ := lru.New[[sha256.Size]byte, [sha256.Size]byte](memoDigests)
	return memo
}

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
	return ok && found && w.Int == 0
}

// reprDigest is the Repr-Digest field value of a body whose SHA-256 is sum.
func reprDigest(sum []byte) string {
	return "sha-256=:" + base64.StdEncoding.EncodeToString(sum) + ":"
}
