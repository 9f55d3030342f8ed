package example

import "testing"

// TestByteLevelAlphabet holds byteLevel to GPT-2's bytes_to_unicode at the characters every GPT-2
// style tokenizer.json shows (Ġ for a space, Ċ for a newline) and to being a bijection.
func TestByteLevelAlphabet(t *testing.T) {
	tokens := byteLevel()
	seen := map[string]bool{}
	for b, tok := range tokens {
		if r := []rune(tok); len(r) != 1 || seen[tok] {
			t.Fatalf("byte %d is %q: not one rune of its own", b, tok)
		}
		seen[tok] = true
	}
	for b, want := range map[int]string{0: "Ā", ' ': "Ġ", '\n': "Ċ", '!': "!", '~': "~", 0x7F: "ġ", 0xAD: "Ń", 0xFF: "ÿ"} {
		if tokens[b] != want {
			t.Errorf("byte %#x is %q, want %q", b, tokens[b], want)
		}
	}
	if len(tokens) != Vocab {
		t.Errorf("%d byte tokens for a vocabulary of %d", len(tokens), Vocab)
	}
}
