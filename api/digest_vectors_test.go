package api

import (
	"crypto/sha256"
	"encoding/json"
	"errors"
	"os"
	"testing"
)

// digestVectors are the Repr-Digest cases both clients check (testdata/repr_digest.json).
type digestVectors struct {
	Body    string
	Matched string
	Cases   []struct {
		Name            string
		Header, Trailer []string
		Want            string // match, none or mismatch
	}
}

func TestCheckDigestVectors(t *testing.T) {
	raw, err := os.ReadFile("testdata/repr_digest.json")
	if err != nil {
		t.Fatal(err)
	}
	var v digestVectors
	if err := json.Unmarshal(raw, &v); err != nil {
		t.Fatal(err)
	}
	sum := sha256.Sum256([]byte(v.Body))
	for _, c := range v.Cases {
		matched, err := checkDigest(c.Header, c.Trailer, sum[:])
		var de *DigestError
		switch c.Want {
		case "match":
			if err != nil || matched != v.Matched {
				t.Errorf("%s: %q, %v; want %q", c.Name, matched, err, v.Matched)
			}
		case "none":
			if err != nil || matched != "" {
				t.Errorf("%s: %q, %v; want nothing checked", c.Name, matched, err)
			}
		case "mismatch":
			if !errors.As(err, &de) || de.Got != v.Matched || matched != "" {
				t.Errorf("%s: %q, %v; want a *DigestError", c.Name, matched, err)
			}
		default:
			t.Fatalf("%s: want %q", c.Name, c.Want)
		}
	}
	if len(v.Cases) < 10 {
		t.Fatalf("%d cases read", len(v.Cases))
	}
}
