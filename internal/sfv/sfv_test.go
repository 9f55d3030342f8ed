package sfv_test

import (
	"maps"
	"testing"

	"github.com/shardsrv/shardsrv/internal/sfv"
)

// Dictionaries from RFC 8941's grammar: members with integers, other bare items and parameters,
// and the malformed ones a receiver ignores whole.
func TestParseDictionary(t *testing.T) {
	for in, want := range map[string]map[string]int64{
		"sha-256=0":                     {"sha-256": 0},
		"sha-512=3, sha-256=10":         {"sha-512": 3, "sha-256": 10},
		"a=1, a=2":                      {"a": 2},
		"a, b;x=1;y, c=\"s\", d=:AQ==:": {"a": -1, "b": -1, "c": -1, "d": -1},
		"e=?1, f=tok/en, g=-5, h=1.25":  {"e": -1, "f": -1, "g": -5, "h": -1},
		"":                              {},
		"A=1":                           nil, // keys are lowercase
		"a=1,":                          nil, // a trailing comma
		"a=1234567890123456":            nil, // 16 digits
		"a=\"unterminated":              nil,
		"a=1 b=2":                       nil,
	} {
		got, ok := sfv.ParseDictionary(in)
		if ok != (want != nil) || ok && !maps.Equal(got, want) {
			t.Errorf("%q: %v, %v; want %v", in, got, ok, want)
		}
	}
}
