// Package sfv parses RFC 8941 structured field values, as far as the service and its client read
// them: a dictionary's members and their integer or byte-sequence values (Want-Repr-Digest's
// preferences and Repr-Digest's digests, RFC 9530).
package sfv

import (
	"encoding/base64"
	"strconv"
	"strings"
)

// Item is a member's value, as far as it is kept.
type Item struct {
	Int   int64  // an integer's value, -1 for a value of another type
	Bytes []byte // a byte sequence's bytes, nil for a value of another type
}

// ParseDictionary parses an RFC 8941 dictionary, keeping each member's integer or byte-sequence
// value; parameters are checked and dropped, and a later member of a key overrides an earlier one.
// ok is false when s is not a dictionary, which RFC 8941 says to ignore whole, or has an inner
// list as a value, which neither field has any use for. Byte sequences may lack their padding.
func ParseDictionary(s string) (map[string]Item, bool) {
	p := sfParser{s: s}
	dict := map[string]Item{}
	p.skip(" ")
	for p.i < len(p.s) {
		key, ok := p.key()
		if !ok {
			return nil, false
		}
		value := Item{Int: -1} // a bare key is the boolean true
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

// bareItem parses any bare item and returns an integer's value or a byte sequence's bytes.
func (p *sfParser) bareItem() (Item, bool) {
	none := Item{Int: -1}
	if p.i == len(p.s) {
		return none, false
	}
	switch c := p.s[p.i]; {
	case c == '-' || isDigit(c):
		neg := p.eat('-')
		digits := p.span(isDigit)
		if digits == "" || len(digits) > 15 {
			return none, false
		}
		if p.eat('.') { // a decimal: at most 12 integer and 3 fractional digits
			frac := p.span(isDigit)
			return none, len(digits) <= 12 && frac != "" && len(frac) <= 3
		}
		v, _ := strconv.ParseInt(digits, 10, 64)
		if neg {
			v = -v
		}
		return Item{Int: v}, true
	case c == '"':
		for p.i++; p.i < len(p.s); p.i++ {
			switch p.s[p.i] {
			case '\\':
				if p.i++; p.i == len(p.s) || p.s[p.i] != '"' && p.s[p.i] != '\\' {
					return none, false
				}
			case '"':
				p.i++
				return none, true
			default:
				if p.s[p.i] < 0x20 || p.s[p.i] > 0x7e {
					return none, false
				}
			}
		}
		return none, false
	case c == ':':
		p.i++
		b64 := p.span(func(c byte) bool { return isAlpha(c) || isDigit(c) || strings.IndexByte("+/=", c) >= 0 })
		encoding := base64.StdEncoding
		if len(b64)%4 != 0 { // RFC 8941 asks parsers to accept a byte sequence without its padding
			encoding = base64.RawStdEncoding
		}
		b, err := encoding.DecodeString(b64)
		if err != nil || !p.eat(':') {
			return none, false
		}
		return Item{Int: -1, Bytes: b}, true
	case c == '?':
		p.i++
		return none, p.eat('0') || p.eat('1')
	case isAlpha(c) || c == '*':
		p.span(func(c byte) bool {
			return isAlpha(c) || isDigit(c) || strings.IndexByte("!#$%&'*+-.^_`|~:/", c) >= 0
		})
		return none, true
	}
	return none, false
}
