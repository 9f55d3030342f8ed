// Package safetensors reads and writes the header of a safetensors file strictly: the reader
// follows the rules of the format and of the reference Rust reader (docs/references.md §3), names the
// file and the tensor in every error, and never allocates more than the header it was handed.
package safetensors

import (
	"bytes"
	"encoding/binary"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"sort"
	"strconv"
	"unicode/utf16"
	"unicode/utf8"

	"github.com/shardsrv/shardsrv/internal/tensor"
)

// MaxHeaderLen is the reference reader's cap on the JSON header (100 MB).
const MaxHeaderLen = 100_000_000

// PrefixLen is the size of the little-endian header length that starts every file.
const PrefixLen = 8

// otherBits lists the dtypes safetensors knows beyond the ones shardsrv reads (internal/tensor),
// with their size in bits: they still count for the layout checks, so a file holding them is
// described, not refused.
var otherBits = map[string]int64{"F6_E2M3": 6, "F6_E3M2": 6, "F8_E4M3FNUZ": 8, "F8_E5M2FNUZ": 8, "C64": 64}

// bitSize is a safetensors dtype's size in bits, and whether the format knows it.
func bitSize(name string) (int64, bool) {
	if d, ok := tensor.ParseDType(name); ok {
		if d == tensor.F4 {
			return 4, true // two a byte
		}
		return 8 * int64(d.Size()), true
	}
	n, ok := otherBits[name]
	return n, ok
}

// Tensor is one entry of a header. Begin and End are absolute offsets in the file.
type Tensor struct {
	Name      string
	DTypeName string
	DType     tensor.DType // zero when DTypeName is outside the wire contract
	Shape     []int64
	Begin     int64
	End       int64
}

// Header is a parsed, validated header.
type Header struct {
	Tensors  []Tensor // sorted by offset
	Metadata map[string]string
	// DataStart is the file offset of the byte buffer.
	DataStart int64
}

// Error is a malformed file: it names the file and, when one is at fault, the tensor.
type Error struct {
	File   string
	Tensor string
	Msg    string
}

func (e *Error) Error() string {
	if e.Tensor != "" {
		return fmt.Sprintf("%s: tensor %q: %s", e.File, e.Tensor, e.Msg)
	}
	return fmt.Sprintf("%s: %s", e.File, e.Msg)
}

// HeaderLen validates the 8-byte prefix of a file of fileSize bytes and returns the JSON length.
func HeaderLen(file string, prefix []byte, fileSize int64) (int64, error) {
	if len(prefix) < PrefixLen || fileSize < PrefixLen {
		return 0, &Error{File: file, Msg: "is not a safetensors file: it is shorter than the 8-byte header length"}
	}
	n := binary.LittleEndian.Uint64(prefix)
	if n > MaxHeaderLen {
		return 0, &Error{File: file, Msg: fmt.Sprintf("header length %d exceeds the 100 MB limit", n)}
	}
	if int64(n) > fileSize-PrefixLen {
		return 0, &Error{
			File: file,
			Msg: fmt.Sprintf(
				"is not a safetensors file: it is too short for its header (%d bytes announced, %d in the file)",
				n,
				fileSize-PrefixLen,
			),
		}
	}
	return int64(n), nil
}

// Parse validates the JSON header (the n bytes after the prefix) of a file of fileSize bytes.
func Parse(file string, header []byte, fileSize int64) (*Header, error) {
	fail := func(name, format string, args ...any) error {
		return &Error{File: file, Tensor: name, Msg: fmt.Sprintf(format, args...)}
	}
	h := &Header{DataStart: PrefixLen + int64(len(header))}
	// The reference reader takes the header as a Rust str, and serde_json refuses lone surrogates;
	// encoding/json would turn both into U+FFFD, so two names could become one.
	if at, msg := invalidText(header); at >= 0 {
		return nil, fail("", "header is not valid UTF-8 JSON: %s at byte %d", msg, at)
	}
	dec := json.NewDecoder(bytes.NewReader(header))
	dec.UseNumber()
	if tok, err := dec.Token(); err != nil || tok != json.Delim('{') {
		return nil, fail("", "header is not a JSON object")
	}
	seen := map[string]bool{}
	for dec.More() {
		tok, err := dec.Token()
		if err != nil {
			return nil, fail("", "header is not valid JSON: %v", err)
		}
		name := tok.(string)
		if seen[name] {
			return nil, fail(name, "is named twice in the header")
		}
		seen[name] = true
		if name == "__metadata__" {
			if err := dec.Decode(&h.Metadata); err != nil {
				return nil, fail("", "__metadata__ must map strings to strings: %v", err)
			}
			continue
		}
		t, err := parseEntry(dec, name)
		if err != nil {
			return nil, fail(name, "%v", err)
		}
		h.Tensors = append(h.Tensors, t)
	}
	if _, err := dec.Token(); err != nil {
		return nil, fail("", "header is not valid JSON: %v", err)
	}
	if rest, _ := io.ReadAll(dec.Buffered()); len(bytes.TrimSpace(rest)) != 0 {
		return nil, fail("", "header has bytes after its JSON object")
	}
	sort.SliceStable(h.Tensors, func(i, j int) bool { return h.Tensors[i].Begin < h.Tensors[j].Begin })
	var end int64
	for i := range h.Tensors {
		t := &h.Tensors[i]
		if t.Begin != end || t.End < t.Begin {
			return nil, fail(
				t.Name,
				"data_offsets [%d, %d] leave a hole or overlap another tensor (expected to start at %d)",
				t.Begin,
				t.End,
				end,
			)
		}
		nbits, ok := int64(1), true
		for _, d := range t.Shape {
			nbits, ok = tensor.CheckedMul(nbits, d)
			if !ok {
				return nil, fail(t.Name, "shape %v overflows", t.Shape)
			}
		}
		bits, _ := bitSize(t.DTypeName) // checked when the entry was read
		if nbits, ok = tensor.CheckedMul(nbits, bits); !ok {
			return nil, fail(t.Name, "shape %v overflows", t.Shape)
		}
		if nbits%8 != 0 {
			return nil, fail(t.Name, "shape %v of %s does not fill whole bytes", t.Shape, t.DTypeName)
		}
		if t.End-t.Begin != nbits/8 {
			return nil, fail(
				t.Name,
				"data_offsets [%d, %d] hold %d bytes, shape %v of %s needs %d",
				t.Begin,
				t.End,
				t.End-t.Begin,
				t.Shape,
				t.DTypeName,
				nbits/8,
			)
		}
		end = t.End
		t.Begin += h.DataStart
		t.End += h.DataStart
	}
	if h.DataStart+end != fileSize {
		return nil, fail(
			"",
			"the tensors cover %d bytes of data but the file holds %d after its header",
			end,
			fileSize-h.DataStart,
		)
	}
	return h, nil
}

func parseEntry(dec *json.Decoder, name string) (Tensor, error) {
	var raw map[string]json.RawMessage
	if err := dec.Decode(&raw); err != nil {
		return Tensor{}, fmt.Errorf("entry is not a JSON object: %v", err)
	}
	t := Tensor{Name: name}
	for key := range raw {
		if key != "dtype" && key != "shape" && key != "data_offsets" {
			return t, fmt.Errorf("unknown field %q", key)
		}
	}
	if err := json.Unmarshal(raw["dtype"], &t.DTypeName); err != nil || raw["dtype"] == nil {
		return t, errors.New("needs a string dtype")
	}
	if _, ok := bitSize(t.DTypeName); !ok {
		return t, fmt.Errorf("has dtype %q, which is not a safetensors dtype", t.DTypeName)
	}
	t.DType, _ = tensor.ParseDType(t.DTypeName)
	shape, err := intList(raw["shape"])
	if err != nil || raw["shape"] == nil {
		return t, errors.New("needs a shape: a list of non-negative integers")
	}
	t.Shape = shape
	offs, err := intList(raw["data_offsets"])
	if err != nil || len(offs) != 2 {
		return t, errors.New("needs data_offsets: two non-negative integers")
	}
	t.Begin, t.End = offs[0], offs[1]
	return t, nil
}

// invalidText finds the first byte sequence that is not UTF-8, or a \u escape in a string that is
// an unpaired UTF-16 surrogate, and returns its offset (-1 when there is none). It does not
// otherwise check the JSON, and it runs in one pass.
func invalidText(b []byte) (int, string) {
	if utf8.Valid(b) {
		if !bytes.Contains(b, []byte(`\u`)) {
			return -1, ""
		}
	} else {
		for i := 0; i < len(b); {
			r, n := utf8.DecodeRune(b[i:])
			if r == utf8.RuneError && n <= 1 {
				return i, "an invalid UTF-8 sequence"
			}
			i += n
		}
	}
	inString := false
	for i := 0; i < len(b); i++ {
		switch c := b[i]; {
		case c == '"':
			inString = !inString
		case c == '\\' && inString && i+1 < len(b):
			if b[i+1] != 'u' {
				i++ // a two-character escape
				continue
			}
			r, ok := hex4(b, i+2)
			if !ok {
				i++
				continue // malformed: the JSON parser reports it
			}
			switch {
			case utf16.IsSurrogate(r) && r < 0xDC00: // high: a low one must follow
				low, ok := rune(0), false
				if i+7 < len(b) && b[i+6] == '\\' && b[i+7] == 'u' {
					low, ok = hex4(b, i+8)
				}
				if !ok || low < 0xDC00 || low > 0xDFFF {
					return i, "an unpaired UTF-16 surrogate escape"
				}
				i += 11
			case utf16.IsSurrogate(r):
				return i, "an unpaired UTF-16 surrogate escape"
			default:
				i += 5
			}
		}
	}
	return -1, ""
}

func hex4(b []byte, at int) (rune, bool) {
	if at+4 > len(b) {
		return 0, false
	}
	v, err := strconv.ParseUint(string(b[at:at+4]), 16, 16)
	return rune(v), err == nil
}

// intList reads a JSON list of non-negative integers that fit in an int64.
func intList(raw json.RawMessage) ([]int64, error) {
	var nums []json.Number
	if err := json.Unmarshal(raw, &nums); err != nil {
		return nil, err
	}
	out := make([]int64, len(nums))
	for i, n := range nums {
		v, err := strconv.ParseInt(string(n), 10, 64)
		if err != nil || v < 0 {
			return nil, fmt.Errorf("%s is not a non-negative integer", n)
		}
		out[i] = v
	}
	return out, nil
}

// Entry is one tensor of a file being written; offsets are relative to the byte buffer.
type Entry struct {
	Name        string   `json:"-"`
	DType       string   `json:"dtype"`
	Shape       []int64  `json:"shape"`
	DataOffsets [2]int64 `json:"data_offsets"`
}

// EncodeHeader returns the 8-byte length and the JSON header, padded with spaces so the byte buffer
// starts 8-aligned, with the entries in the order given (their data order) after __metadata__.
func EncodeHeader(entries []Entry, metadata map[string]string) []byte {
	var buf bytes.Buffer
	buf.Write(make([]byte, PrefixLen))
	buf.WriteByte('{')
	sep := ""
	if len(metadata) > 0 {
		m, _ := json.Marshal(metadata)
		buf.WriteString(`"__metadata__":`)
		buf.Write(m)
		sep = ","
	}
	for _, e := range entries {
		if e.Shape == nil {
			e.Shape = []int64{}
		}
		name, _ := json.Marshal(e.Name)
		body, _ := json.Marshal(e)
		buf.WriteString(sep)
		buf.Write(name)
		buf.WriteByte(':')
		buf.Write(body)
		sep = ","
	}
	buf.WriteByte('}')
	for buf.Len()%8 != 0 {
		buf.WriteByte(' ')
	}
	out := buf.Bytes()
	binary.LittleEndian.PutUint64(out, uint64(len(out)-PrefixLen))
	return out
}

// TensorData is a tensor to write: its bytes are already in dtype, row-major, little-endian.
type TensorData struct {
	Name  string
	DType string
	Shape []int64
	Data  []byte
}

// Write writes a whole safetensors file.
func Write(w io.Writer, tensors []TensorData, metadata map[string]string) error {
	entries := make([]Entry, len(tensors))
	var off int64
	for i, t := range tensors {
		entries[i] = Entry{
			Name:        t.Name,
			DType:       t.DType,
			Shape:       t.Shape,
			DataOffsets: [2]int64{off, off + int64(len(t.Data))},
		}
		off += int64(len(t.Data))
	}
	if _, err := w.Write(EncodeHeader(entries, metadata)); err != nil {
		return err
	}
	for _, t := range tensors {
		if _, err := w.Write(t.Data); err != nil {
			return err
		}
	}
	return nil
}
