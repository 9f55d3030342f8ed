package server_test

import (
	"bytes"
	"encoding/binary"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
)

// fill is exact over the whole I64 and U64 range: the JSON literal is encoded, never a float64
// (which holds integers exactly only up to 2^53).
func TestFillIsExactForEveryInteger(t *testing.T) {
	e := opsServer(t, nil)
	for _, c := range []struct {
		dtype, literal string
		want           uint64 // the element's bits
		status         int
	}{
		{"I64", "9223372036854775807", 1<<63 - 1, 200},
		{"I64", "-9223372036854775808", 1 << 63, 200},
		{"I64", "9007199254740993", 1<<53 + 1, 200},
		{"I64", "-9007199254740993", -(1<<53 + 1) & (1<<64 - 1), 200},
		{"U64", "18446744073709551615", 1<<64 - 1, 200},
		{"U64", "18446744073709551614", 1<<64 - 2, 200},
		{"U64", "9007199254740993", 1<<53 + 1, 200},
		{"I64", "9.007199254740993e15", 1<<53 + 1, 200},
		{"I64", "92233720368547758.07e2", 1<<63 - 1, 200},
		{"I32", "1e3", 1000, 200},
		{"I32", "-2147483648", 1 << 31, 200},
		{"U8", "255.0", 255, 200},
		{"BOOL", "1", 1, 200},
		{"I64", "-0", 0, 200},
		{"I64", "9223372036854775808", 0, 422},
		{"I64", "-9223372036854775809", 0, 422},
		{"U64", "18446744073709551616", 0, 422},
		{"U64", "-1", 0, 422},
		{"I32", "2147483648", 0, 422},
		{"I8", "1.5", 0, 422},
		{"I64", "1e999999999", 0, 422}, // a JSON number, but no value of I64
		{"I64", "1e-999999999", 0, 422},
		{"BOOL", "2", 0, 422},
	} {
		body := fmt.Sprintf(
			`{"checkpoint":"m","tensors":[{"name":"x","dtype":%q,"shape":[3],"boxes":[{"offsets":[0],"lengths":[3]}],`+
				`"fill":%s}]}`,
			c.dtype,
			c.literal,
		)
		req, _ := http.NewRequest("POST", e.url+"/v1/shards", strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		res, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		got, _ := io.ReadAll(res.Body)
		res.Body.Close()
		if res.StatusCode != c.status {
			t.Errorf("%s fill %s: %d %s, want %d", c.dtype, c.literal, res.StatusCode, got, c.status)
			continue
		}
		if c.status != 200 {
			if !strings.Contains(string(got), "/tensors/0/fill") {
				t.Errorf("%s fill %s: %s; want a pointer to the fill", c.dtype, c.literal, got)
			}
			continue
		}
		size := map[string]int{"I64": 8, "U64": 8, "I32": 4, "U8": 1, "BOOL": 1}[c.dtype]
		elem := binary.LittleEndian.AppendUint64(nil, c.want)[:size]
		if want := bytes.Repeat(elem, 3); !bytes.Equal(got, want) {
			t.Errorf("%s fill %s: % x, want % x", c.dtype, c.literal, got, want)
		}
	}
}
