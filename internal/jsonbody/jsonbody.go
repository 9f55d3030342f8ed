// Package jsonbody reads and decodes strict JSON request bodies: the media type and content coding
// a body may come in, its size and time limits, and a decoding that refuses what encoding/json lets
// pass (unknown fields, duplicate keys, trailing data), with a JSON pointer to the first fault. Its
// errors are *Error, which the server maps to problems. It is the one place to switch to
// encoding/json/v2 (which refuses duplicate keys and reports pointers itself) once that leaves the
// experiment.
package jsonbody

import (
	"bytes"
	"compress/flate"
	"compress/gzip"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"mime"
	"net"
	"net/http"
	"os"
	"reflect"
	"strconv"
	"strings"
	"time"
	"unicode"
)

// Kind is what is wrong with a body.
type Kind int

const (
	// Malformed is a body that is not JSON, or not the shape of the value it decodes into.
	Malformed Kind = iota
	// MediaType is a Content-Type that is not JSON in UTF-8.
	MediaType
	// Encoding is a Content-Encoding other than gzip.
	Encoding
	// TooLarge is a body, or a gzip body once decoded, over the size limit.
	TooLarge
	// Timeout is a body that did not arrive before the connection's read deadline.
	Timeout
)

// Error is a body Read or Decode refuses.
type Error struct {
	Kind   Kind
	Detail string
	// Pointer, when set, is a JSON pointer to the fault, and Field says what it is.
	Pointer, Field string
}

func (e *Error) Error() string { return e.Detail }

func malformed(detail, pointer, field string) error {
	return &Error{Kind: Malformed, Detail: detail, Pointer: pointer, Field: field}
}

// Decode decodes body into v strictly: an unknown field, a key twice in one object (regardless of
// case, as encoding/json matches keys to fields), a value of the wrong type, a number no float64
// holds, trailing data or an empty body is an *Error of kind Malformed.
func Decode(body []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	err := dec.Decode(v)
	if err == nil && dec.More() {
		err = errors.New("the body holds more than one JSON value")
	}
	if err == nil {
		if _, terr := dec.Token(); terr != io.EOF {
			err = errors.New("the body holds data after the JSON object")
		}
	}
	var typeErr *json.UnmarshalTypeError
	var syntax *json.SyntaxError
	switch {
	case err == nil:
		sc := jsonScan{b: body}
		sc.value()
		if sc.dup != "" {
			return malformed(sc.dup+": the key appears twice in its object (keys match regardless of case)",
				sc.dup, "duplicate key")
		}
		return nil
	case errors.As(err, &syntax):
		return malformed(fmt.Sprintf("malformed JSON at byte %d: %v", syntax.Offset, err), "", "")
	case errors.Is(err, io.EOF):
		return malformed("the body is empty; send a JSON request", "", "")
	}
	if ptr, detail, ok := schemaError(body, reflect.TypeOf(v)); ok {
		return malformed(ptr+": "+detail, ptr, detail)
	}
	if errors.As(err, &typeErr) {
		if strings.HasPrefix(typeErr.Value, "number") { // a number no float64 holds, such as 1e999
			sc := jsonScan{b: body, findHuge: true}
			if sc.value(); sc.huge != "" {
				return malformed(sc.huge+": the number is beyond the range of a float64", sc.huge, "number out of range")
			}
		}
		return malformed("a value has the wrong JSON type",
			"/"+strings.ReplaceAll(typeErr.Field, ".", "/"), "wrong JSON type")
	}
	return malformed(err.Error(), "", "")
}

// Read reads a JSON body: Content-Type application/json (or a +json type, in UTF-8), no content
// coding or gzip, at most limit bytes after decoding. timeout is the read deadline the caller set on
// the connection, which Read lifts once the whole body is in and names in the error when it passes.
// A refused Content-Encoding also sets Accept-Encoding on w.
func Read(w http.ResponseWriter, r *http.Request, limit int64, timeout time.Duration) ([]byte, error) {
	if err := checkContentType(r.Header.Get("Content-Type")); err != nil {
		return nil, err
	}
	gzipped, err := contentCoding(r.Header.Values("Content-Encoding"))
	if err != nil {
		w.Header().Set("Accept-Encoding", "gzip")
		return nil, err
	}
	var rd io.Reader = http.MaxBytesReader(w, r.Body, limit)
	var body []byte
	if gzipped {
		var zr *gzip.Reader
		if zr, err = gzip.NewReader(rd); err == nil {
			// The limit holds for the decoded body too: a small gzip bomb is still 413.
			body, err = io.ReadAll(io.LimitReader(zr, limit+1))
			if err == nil && int64(len(body)) > limit {
				err = &http.MaxBytesError{Limit: limit}
			}
			if err == nil {
				_, err = io.Copy(io.Discard, rd) // the gzip trailer and anything after it
			}
		}
	} else {
		body, err = io.ReadAll(rd)
	}
	var tooBig *http.MaxBytesError
	var netErr net.Error
	switch {
	case err == nil:
		// The whole body is in: lift the read deadline, for the next request on the connection.
		http.NewResponseController(w).SetReadDeadline(time.Time{})
		return body, nil
	case errors.As(err, &tooBig):
		what := "body"
		if gzipped {
			what = "decoded body"
		}
		return nil, &Error{Kind: TooLarge, Detail: fmt.Sprintf("the %s is over %d bytes; split the request", what, tooBig.Limit)}
	case errors.Is(err, os.ErrDeadlineExceeded) || errors.As(err, &netErr) && netErr.Timeout():
		return nil, &Error{Kind: Timeout, Detail: fmt.Sprintf("the body was not received within %s; send it at once", timeout)}
	case gzipped && (errors.Is(err, gzip.ErrHeader) || errors.Is(err, gzip.ErrChecksum) ||
		errors.Is(err, io.ErrUnexpectedEOF) || isFlateError(err)):
		return nil, malformed("the gzip body is corrupt or truncated: "+err.Error(), "", "")
	}
	return nil, malformed("the body could not be read: "+err.Error(), "", "")
}

func isFlateError(err error) bool {
	var ce flate.CorruptInputError
	return errors.As(err, &ce)
}

// checkContentType accepts application/json and application/*+json, in UTF-8 (the only charset
// JSON has, RFC 8259), and a body that declares no type: these endpoints take nothing but JSON, and
// RFC 9110 lets a recipient examine an undeclared body. Any other declared type is 415 — curl -d
// without -H declares application/x-www-form-urlencoded, and the problem says what to send.
func checkContentType(ct string) error {
	unsupported := func(detail string) error { return &Error{Kind: MediaType, Detail: detail} }
	if ct == "" {
		return nil
	}
	mt, params, err := mime.ParseMediaType(ct)
	if err != nil {
		return unsupported(
			fmt.Sprintf("Content-Type %q does not parse; send 'Content-Type: application/json'", truncate(ct, 100)),
		)
	}
	if mt != "application/json" && !(strings.HasPrefix(mt, "application/") && strings.HasSuffix(mt, "+json")) {
		return unsupported(
			fmt.Sprintf(
				"Content-Type %q is not JSON; send 'Content-Type: application/json' (curl: -H 'Content-Type: application/json')",
				truncate(mt, 100),
			),
		)
	}
	if cs, ok := params["charset"]; ok && !strings.EqualFold(cs, "utf-8") {
		return unsupported(fmt.Sprintf("charset %q: JSON bodies are UTF-8", truncate(cs, 100)))
	}
	return nil
}

// contentCoding reads Content-Encoding: none (or identity) or gzip; anything else is 415.
func contentCoding(values []string) (gzipped bool, err error) {
	var codings []string
	for _, v := range values {
		for c := range strings.SplitSeq(v, ",") {
			if c = strings.ToLower(strings.TrimSpace(c)); c != "" && c != "identity" {
				codings = append(codings, c)
			}
		}
	}
	switch {
	case len(codings) == 0:
		return false, nil
	case len(codings) == 1 && (codings[0] == "gzip" || codings[0] == "x-gzip"):
		return true, nil
	}
	return false, &Error{Kind: Encoding, Detail: fmt.Sprintf(
		"Content-Encoding %q: this server decodes gzip, or takes the body as it is",
		truncate(strings.Join(codings, ", "), 100))}
}

func truncate(s string, n int) string {
	if len(s) <= n {
		return s
	}
	return s[:n] + "..."
}

// jsonScan walks a JSON text that encoding/json has accepted, once, without building values: it
// finds the first object that holds a key twice (comparing keys as encoding/json matches them to
// fields, regardless of case, so {"fill":1,"FILL":2} is a duplicate too). Its cost is linear in the
// body: objects with many keys are checked through a map.
type jsonScan struct {
	b    []byte
	i    int
	path []pathSeg
	dup  string // the JSON pointer of the first duplicate key
	// findHuge looks for the first number beyond float64's range instead, and puts its pointer in huge.
	findHuge bool
	huge     string
}

type pathSeg struct {
	key   []byte // for an object member: the key, unescaped
	index int    // for an array element
	isKey bool
}

func (s *jsonScan) ws() {
	for s.i < len(s.b) && (s.b[s.i] == ' ' || s.b[s.i] == '\t' || s.b[s.i] == '\n' || s.b[s.i] == '\r') {
		s.i++
	}
}

func (s *jsonScan) peek() byte {
	if s.i < len(s.b) {
		return s.b[s.i]
	}
	return 0
}

// value scans one value; it returns false to stop (a duplicate found, or the text ended).
func (s *jsonScan) value() bool {
	s.ws()
	switch s.peek() {
	case 0:
		return false
	case '{':
		return s.object()
	case '[':
		return s.array()
	case '"':
		s.str()
		return true
	}
	start := s.i
	for s.i < len(s.b) {
		c := s.b[s.i]
		if c == ',' || c == '}' || c == ']' || c == ' ' || c == '\t' || c == '\n' || c == '\r' {
			break
		}
		s.i++
	}
	if s.findHuge && start < s.i && (s.b[start] == '-' || s.b[start] >= '0' && s.b[start] <= '9') {
		if _, err := strconv.ParseFloat(string(s.b[start:s.i]), 64); err != nil {
			s.huge = s.pointer()
			return false
		}
	}
	return true
}

// str skips a string and returns its raw contents.
func (s *jsonScan) str() []byte {
	s.i++ // the opening quote
	start := s.i
	for s.i < len(s.b) {
		switch s.b[s.i] {
		case '"':
			s.i++
			return s.b[start : s.i-1]
		case '\\':
			s.i++
		}
		s.i++
	}
	return s.b[start:min(s.i, len(s.b))]
}

func (s *jsonScan) object() bool {
	s.i++ // {
	depth := len(s.path)
	s.path = append(s.path, pathSeg{isKey: true})
	var keys [16][]byte
	small := keys[:0]        // the keys so far, while there are few
	var many map[string]bool // their folded forms, once there are many
	for {
		s.ws()
		switch s.peek() {
		case '}':
			s.i++
			s.path = s.path[:depth]
			return true
		case ',':
			s.i++
			s.ws()
		case 0:
			return false
		}
		if s.peek() != '"' {
			return false
		}
		key := s.str()
		if bytes.IndexByte(key, '\\') >= 0 {
			var k string
			json.Unmarshal(s.b[s.i-len(key)-2:s.i], &k)
			key = []byte(k)
		}
		dup := false
		if many == nil {
			for _, k := range small {
				dup = dup || bytes.EqualFold(k, key)
			}
			if len(small) < len(keys) {
				small = append(small, key)
			} else {
				many = make(map[string]bool, 4*len(keys))
				for _, k := range small {
					many[foldKey(k)] = true
				}
				many[foldKey(key)] = true
			}
		} else {
			f := foldKey(key)
			dup = many[f]
			many[f] = true
		}
		s.path[depth] = pathSeg{key: key, isKey: true}
		if dup {
			s.dup = s.pointer()
			return false
		}
		s.ws()
		if s.peek() != ':' {
			return false
		}
		s.i++
		if !s.value() {
			return false
		}
	}
}

func (s *jsonScan) array() bool {
	s.i++ // [
	depth := len(s.path)
	s.path = append(s.path, pathSeg{})
	for n := 0; ; n++ {
		s.ws()
		switch s.peek() {
		case ']':
			s.i++
			s.path = s.path[:depth]
			return true
		case ',':
			s.i++
		case 0:
			return false
		}
		s.path[depth] = pathSeg{index: n}
		if !s.value() {
			return false
		}
	}
}

func (s *jsonScan) pointer() string {
	var b strings.Builder
	for _, seg := range s.path {
		b.WriteByte('/')
		if seg.isKey {
			b.WriteString(escape(string(seg.key)))
		} else {
			b.WriteString(strconv.Itoa(seg.index))
		}
	}
	return b.String()
}

// foldKey maps a key to one spelling of its case-insensitive class: each rune becomes the least
// rune of its simple case folding orbit, so foldKey(a) == foldKey(b) exactly when
// strings.EqualFold(a, b).
func foldKey(k []byte) string {
	var b strings.Builder
	for _, r := range string(k) {
		least := r
		for f := unicode.SimpleFold(r); f != r; f = unicode.SimpleFold(f) {
			least = min(least, f)
		}
		b.WriteRune(least)
	}
	return b.String()
}
