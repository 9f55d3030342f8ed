package sfv_test

import (
	"bytes"
	"maps"
	"testing"

	"github.com/shardsrv/shardsrv/internal/sfv"
)

// Dictionaries from RFC 8941's grammar: members with integers, byte sequences, other bare items
// and parameters, and the malformed ones a receiver ignores whole.
func TestParseDictionary(t *testing.T) {
	none := sfv.Item{Int: -1}
	for in, want := range map[string]map[string]sfv.Item{
		"sha-256=0":                     {"sha-256": {}},
		"sha-512=3, sha-256=10":         {"sha-512": {Int: 3}, "sha-256": {Int: 10}},
		"a=1, a=2":                      {"a": {Int: 2}},
		"a, b;x=1;y, c=\"s\", d=:AQ==:": {"a": none, "b": none, "c": none, "d": {Int: -1, Bytes: []byte{1}}},
		"e=?1, f=tok/en, g=-5, h=1.25":  {"e": none, "f": none, "g": {Int: -5}, "h": none},
		"sha-256=:AAEC:;note=1, x=::":   {"sha-256": {Int: -1, Bytes: []byte{0, 1, 2}}, "x": {Int: -1, Bytes: []byte{}}},
		"":                              {},
		"A=1":                           nil, // keys are lowercase
		"a=1,":                          nil, // a trailing comma
		"a=1234567890123456":            nil, // 16 digits
		"a=\"unterminated":              nil,
		"a=1 b=2":                       nil,
		"d=:not*base64:":                nil,
		"d=:AQ:, e=:AAE:":               {"d": {Int: -1, Bytes: []byte{1}}, "e": {Int: -1, Bytes: []byte{0, 1}}}, // unpadded
		"d=:AQ=:":                       nil,                                                                     // a padding byte short
		"d=:A:":                         nil,                                                                     // a byte and a quarter
		"a=1, b=(1 2)":                  nil,                                                                     // inner lists are not kept, so not accepted
	} {
		got, ok := sfv.ParseDictionary(in)
		if ok != (want != nil) || ok && !maps.EqualFunc(got, want, equalItems) {
			t.Errorf("%q: %v, %v; want %v", in, got, ok, want)
		}
	}
}

func equalItems(a, b sfv.Item) bool {
	return a.Int == b.Int && bytes.Equal(a.Bytes, b.Bytes) && (a.Bytes == nil) == (b.Bytes == nil)
}
