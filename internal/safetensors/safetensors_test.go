package safetensors

import (
	"bytes"
	"encoding/binary"
	"errors"
	"strings"
	"testing"
)

func file(header string, data int) []byte {
	out := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	out = append(out, header...)
	return append(out, make([]byte, data)...)
}

func parseFile(b []byte) (*Header, error) {
	n, err := HeaderLen("f.safetensors", b, int64(len(b)))
	if err != nil {
		return nil, err
	}
	return Parse("f.safetensors", b[PrefixLen:PrefixLen+n], int64(len(b)))
}

// The reference crate's own vectors (docs/references.md §3) and hyper_parallel's bad-input corpus.
func TestRejects(t *testing.T) {
	i32 := `{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}`
	cases := []struct {
		name string
		in   []byte
		want string
	}{
		{"too small", []byte{}, "shorter"},
		{"length without header", []byte("<\x00\x00\x00\x00\x00\x00\x00"), "too short"},
		{"too large", append([]byte("<\x00\x00\x00\x00\xff\xff\xff"), i32+strings.Repeat("\x00", 16)...), "100 MB"},
		{"not utf8/json", file("\xff", 0), "JSON"},
		{"not json", file("{", 0), "JSON"},
		{"x", file("{x}", 0), "JSON"},
		{"invalid info", file(`{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0, 4]}}`, 0), "needs 16"},
		{
			"overflow a",
			file(`{"test":{"dtype":"I32","shape":[2,18446744073709551614],"data_offsets":[0,16]}}`, 16),
			"shape",
		},
		{
			"overflow b",
			file(`{"test":{"dtype":"I32","shape":[2,9223372036854775807],"data_offsets":[0,16]}}`, 16),
			"overflows",
		},
		{"polyglot", append(file(i32, 16), "extra_bogus_data_for_polyglot_file"...), "cover 16"},
		{"truncated", file(i32, 14), "cover 16"},
		{"F4 misaligned", file(`{"w":{"dtype":"F4","shape":[1,3],"data_offsets":[0,2]}}`, 2), "whole bytes"},
		{"unknown dtype", file(`{"w":{"dtype":"Q7","shape":[2],"data_offsets":[0,1]}}`, 1), "Q7"},
		{"no shape", file(`{"w":{"dtype":"F32","data_offsets":[0,0]}}`, 0), "shape"},
		{"header past file", append(binary.LittleEndian.AppendUint64(nil, 1024), "{}"...), "too short"},
		{
			"duplicate",
			file(
				`{"a":{"dtype":"U8","shape":[1],"data_offsets":[0,1]},"a":{"dtype":"U8","shape":[1],"data_offsets":[1,2]}}`,
				2,
			),
			"twice",
		},
		{"metadata not strings", file(`{"__metadata__":{"a":1}}`, 0), "__metadata__"},
		{"unknown field", file(`{"w":{"dtype":"U8","shape":[1],"data_offsets":[0,1],"x":1}}`, 1), "unknown field"},
		{"negative", file(`{"w":{"dtype":"U8","shape":[-1],"data_offsets":[0,1]}}`, 1), "shape"},
		{"not an object", file(`[1]`, 0), "object"},
		{"trailing junk", file(`{} {}`, 0), "after"},
	}
	var attack strings.Builder
	attack.WriteString("{")
	for i := range 10 {
		if i > 0 {
			attack.WriteString(",")
		}
		attack.WriteString(`"weight_` + string(rune('0'+i)) + `":{"dtype":"F32","shape":[2,2],"data_offsets":[0,16]}`)
	}
	attack.WriteString("}")
	cases = append(cases, struct {
		name string
		in   []byte
		want string
	}{"json attack", file(attack.String(), 16), "overlap"})
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			_, err := parseFile(c.in)
			var e *Error
			if !errors.As(err, &e) || !strings.Contains(err.Error(), c.want) ||
				!strings.Contains(err.Error(), "f.safetensors") {
				t.Errorf("got %v, want an error naming the file and containing %q", err, c.want)
			}
		})
	}
}

func TestAccepts(t *testing.T) {
	cases := []struct {
		name  string
		in    []byte
		count int
	}{
		{"deserialization", file(`{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}`, 16), 1},
		{"scalar", file(`{"test":{"dtype":"I32","shape":[],"data_offsets":[0,4]}}`, 4), 1},
		{"zero sized", file(`{"test":{"dtype":"I32","shape":[2,0],"data_offsets":[0, 0]}}`, 0), 1},
		{"padded", []byte("\x06\x00\x00\x00\x00\x00\x00\x00{}\r \t\n"), 0},
		{"leading whitespace", []byte("\x06\x00\x00\x00\x00\x00\x00\x00\t\n{}\r "), 0},
		{
			"F4 and E8M0",
			file(
				`{"s":{"dtype":"F8_E8M0","shape":[2],"data_offsets":[1,3]},"w":{"dtype":"F4","shape":[1,2],"data_offsets":[0,1]}}`,
				3,
			),
			2,
		},
	}
	for _, c := range cases {
		h, err := parseFile(c.in)
		if err != nil || len(h.Tensors) != c.count {
			t.Errorf("%s: %v %+v", c.name, err, h)
		}
	}
}

// Golden bytes of the reference writer (docs/references.md §3).
func TestEncodeHeaderGolden(t *testing.T) {
	if got := EncodeHeader(nil, nil); !bytes.Equal(got, append([]byte{8, 0, 0, 0, 0, 0, 0, 0, '{', '}'}, "      "...)) {
		t.Errorf("empty: %q", got)
	}
	got := EncodeHeader(
		[]Entry{{Name: "attn.0", DType: "F32", Shape: []int64{1, 2, 3}, DataOffsets: [2]int64{0, 24}}},
		nil,
	)
	want := `{"attn.0":{"dtype":"F32","shape":[1,2,3],"data_offsets":[0,24]}}`
	if binary.LittleEndian.Uint64(got) != 64 || string(got[8:]) != want {
		t.Errorf("serialization: %q", got)
	}
	got = EncodeHeader(
		[]Entry{{Name: "test", DType: "I32", Shape: []int64{2, 2}, DataOffsets: [2]int64{0, 16}}},
		map[string]string{"framework": "pt"},
	)
	if binary.LittleEndian.Uint64(got) != 96 {
		t.Errorf("with metadata: N = %d, want 96", binary.LittleEndian.Uint64(got))
	}
}

func TestWriteRoundTrips(t *testing.T) {
	var buf bytes.Buffer
	err := Write(&buf, []TensorData{
		{Name: "b", DType: "F32", Shape: []int64{2}, Data: make([]byte, 8)},
		{Name: "a", DType: "BF16", Shape: []int64{}, Data: []byte{1, 2}},
	}, map[string]string{"format": "pt"})
	if err != nil {
		t.Fatal(err)
	}
	h, err := parseFile(buf.Bytes())
	if err != nil {
		t.Fatal(err)
	}
	if h.DataStart%8 != 0 || h.Tensors[1].Name != "a" || h.Tensors[1].Begin != h.DataStart+8 ||
		h.Metadata["format"] != "pt" {
		t.Errorf("%+v", h)
	}
}

func FuzzParse(f *testing.F) {
	f.Add(file(`{"test":{"dtype":"I32","shape":[2,2],"data_offsets":[0,16]}}`, 16))
	f.Add(file(`{"__metadata__":{"a":"b"},"x":{"dtype":"BF16","shape":[],"data_offsets":[0,2]}}`, 2))
	f.Add([]byte("\x06\x00\x00\x00\x00\x00\x00\x00\t\n{}\r "))
	f.Fuzz(func(t *testing.T, b []byte) {
		h, err := parseFile(b)
		if err != nil {
			return
		}
		// Whatever parses describes the file exactly: contiguous spans ending at the file's end.
		end := h.DataStart
		for _, tn := range h.Tensors {
			if tn.Begin != end || tn.End < tn.Begin {
				t.Fatalf("bad span %+v", tn)
			}
			end = tn.End
		}
		if end != int64(len(b)) {
			t.Fatalf("spans end at %d, file is %d", end, len(b))
		}
	})
}

// Names that are not UTF-8, or escape a lone surrogate, make the file malformed: decoded, both
// would become U+FFFD, so two tensors could take one name. Proper escapes are fine.
func TestRejectsNamesThatAreNotUTF8(t *testing.T) {
	entry := `:{"dtype":"U8","shape":[1],"data_offsets":[0,1]}`
	for _, c := range []struct {
		name string
		ok   bool
	}{
		{"\"w\xff\"", false},
		{"\"w\xc3\"", false},
		{`"w\ud800"`, false},
		{`"w\udc00"`, false},
		{`"w\ud800\u0041"`, false},
		{`"w\ud83d\ude00"`, true},
		{`"w\u00e9"`, true},
		{`"wé"`, true},
		{`"w\\ud800"`, true}, // an escaped backslash, then text
	} {
		h, err := parseFile(file("{"+c.name+entry+"}", 1))
		var e *Error
		if c.ok != (err == nil) ||
			(err != nil && (!errors.As(err, &e) || !strings.Contains(err.Error(), "UTF-8") || e.File != "f.safetensors")) {
			t.Errorf("name %s: %v, want ok=%v", c.name, err, c.ok)
		}
		if c.ok && (h == nil || len(h.Tensors) != 1 || strings.ContainsRune(h.Tensors[0].Name, '\uFFFD')) {
			t.Errorf("name %s: %+v", c.name, h)
		}
	}
}
