package jsonbody

import (
	"errors"
	"strings"
	"testing"
	"unicode"
)

// TestFoldKeyIsEqualFold holds foldKey to strings.EqualFold over every pair of runes that fold
// together and their neighbours: equal folds exactly when EqualFold says so.
func TestFoldKeyIsEqualFold(t *testing.T) {
	for r := rune(0); r <= unicode.MaxRune; r += 1 + r/64 {
		for f := unicode.SimpleFold(r); ; f = unicode.SimpleFold(f) {
			for _, o := range []rune{f, f + 1, f - 1} {
				a, b := "k"+string(r), "K"+string(o)
				if got, want := foldKey([]byte(a)) == foldKey([]byte(b)), strings.EqualFold(a, b); got != want {
					t.Fatalf("foldKey(%q) == foldKey(%q) is %t, EqualFold %t", a, b, got, want)
				}
			}
			if f == r {
				break
			}
		}
	}
}

func TestDecodeRefuses(t *testing.T) {
	type inner struct{ Fill float64 }
	type body struct {
		Name string  `json:"name"`
		List []inner `json:"list"`
	}
	for _, c := range []struct{ in, pointer string }{
		{`{"list":[{"fill":1},{"fill":1,"FILL":2}]}`, "/list/1/FILL"},
		{`{"list":[{"fill":1e999}]}`, "/list/0/fill"},
		{`{"list":[{"fill":"x"}]}`, "/list/0/fill"},
		{`{"list":[{},{"other":1}]}`, "/list/1/other"},
		{`{"name":"a"} {}`, ""},
		{``, ""},
	} {
		var v body
		err := Decode([]byte(c.in), &v)
		var e *Error
		if !errors.As(err, &e) || e.Kind != Malformed || e.Pointer != c.pointer {
			t.Errorf("Decode(%s) = %v (%+v), want Malformed at %q", c.in, err, e, c.pointer)
		}
	}
	var v body
	if err := Decode([]byte(`{"name":"a","list":[{"fill":1},{"Fill":2}]}`), &v); err != nil {
		t.Errorf("a valid body: %v", err)
	}
}
