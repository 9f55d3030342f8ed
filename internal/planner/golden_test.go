package planner

import (
	"bufio"
	"bytes"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"flag"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/google/go-cmp/cmp"

	"github.com/shardsrv/shardsrv/api"
	"github.com/shardsrv/shardsrv/internal/checkpoint"
	"github.com/shardsrv/shardsrv/internal/safetensors"
	"github.com/shardsrv/shardsrv/internal/tensor"
)

var rewrite = flag.Bool("rewrite", false, "rewrite the expected plans of testdata/plans/*.txt")

// TestGoldenPlans runs the cases of testdata/plans in the style of Pebble's datadriven tests. A
// file is a list of directives, each a command line, its input, a line "----" and its expected
// output, which ends at the first empty line:
//
//	checkpoint
//	[{"name": "w", "dtype": "BF16", "shape": [4, 8]}, ...]
//	----
//
//	plan segment-bytes=64 max-gap=0
//	{"checkpoint": "ck", "tensors": [...]}
//	----
//	<the plan, rendered by renderPlan>
//
// checkpoint lays its tensors out back to back in one file, from byte 128; plan plans a request
// against the last checkpoint with the default options, changed by its arguments (segment-bytes,
// segment-read-bytes, max-gap, max-read, align). Run with -rewrite to regenerate the outputs.
func TestGoldenPlans(t *testing.T) {
	files, err := filepath.Glob(filepath.Join("testdata", "plans", "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no plans under testdata/plans: %v", err)
	}
	for _, file := range files {
		t.Run(strings.TrimSuffix(filepath.Base(file), ".txt"), func(t *testing.T) {
			cases := readCases(t, file)
			var ck *checkpoint.Checkpoint
			var out bytes.Buffer
			for i := range cases {
				c := &cases[i]
				got := ""
				switch c.cmd {
				case "checkpoint":
					ck = goldenCheckpoint(t, c)
				case "plan":
					if ck == nil {
						t.Fatalf("%s: plan before any checkpoint", c.pos)
					}
					got = goldenPlan(t, c, ck)
				default:
					t.Fatalf("%s: unknown command %q", c.pos, c.cmd)
				}
				if *rewrite {
					c.want = got
				} else if diff := cmp.Diff(c.want, got); diff != "" {
					t.Errorf("%s: %s: plan differs (-want +got):\n%s", c.pos, c.line, diff)
				}
				c.write(&out, i == len(cases)-1)
			}
			if *rewrite {
				if err := os.WriteFile(file, out.Bytes(), 0o644); err != nil {
					t.Fatal(err)
				}
			}
		})
	}
}

// goldenCase is one directive of a golden file.
type goldenCase struct {
	pos      string // file:line of the command, for failures
	comments string // the lines before the command that start with #
	line     string // the command and its arguments
	cmd      string
	args     []string
	input    string
	want     string
}

func (c *goldenCase) write(w *bytes.Buffer, last bool) {
	w.WriteString(c.comments)
	fmt.Fprintf(w, "%s\n%s\n----\n", c.line, c.input)
	if c.want != "" {
		w.WriteString(c.want + "\n")
	}
	if !last {
		w.WriteString("\n")
	}
}

func readCases(t *testing.T, file string) []goldenCase {
	t.Helper()
	data, err := os.ReadFile(file)
	if err != nil {
		t.Fatal(err)
	}
	var cases []goldenCase
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(nil, 1<<20)
	n := 0
	next := func() (string, bool) {
		if !sc.Scan() {
			return "", false
		}
		n++
		return sc.Text(), true
	}
	var comments strings.Builder
	for {
		line, ok := next()
		if !ok {
			break
		}
		switch {
		case strings.TrimSpace(line) == "":
			continue
		case strings.HasPrefix(line, "#"):
			comments.WriteString(line + "\n")
			continue
		}
		fields := strings.Fields(line)
		c := goldenCase{pos: fmt.Sprintf("%s:%d", file, n), comments: comments.String(), line: line, cmd: fields[0],
			args: fields[1:]}
		comments.Reset()
		var input []string
		for {
			l, ok := next()
			if !ok {
				t.Fatalf("%s: no ---- after the input", c.pos)
			}
			if l == "----" {
				break
			}
			input = append(input, l)
		}
		c.input = strings.Join(input, "\n")
		var want []string
		for {
			l, ok := next()
			if !ok || l == "" {
				break
			}
			want = append(want, l)
		}
		c.want = strings.Join(want, "\n")
		cases = append(cases, c)
	}
	return cases
}

// goldenCheckpoint lays out the tensors of a checkpoint directive in one file, from byte 128.
func goldenCheckpoint(t *testing.T, c *goldenCase) *checkpoint.Checkpoint {
	t.Helper()
	var tensors []struct {
		Name  string  `json:"name"`
		DType string  `json:"dtype"`
		Shape []int64 `json:"shape"`
	}
	if err := json.Unmarshal([]byte(c.input), &tensors); err != nil {
		t.Fatalf("%s: %v", c.pos, err)
	}
	ck := &checkpoint.Checkpoint{Name: "ck", Tensors: map[string]*checkpoint.Tensor{}}
	off := int64(128)
	for _, st := range tensors {
		d, ok := tensor.ParseDType(st.DType)
		if !ok {
			t.Fatalf("%s: dtype %q", c.pos, st.DType)
		}
		n, _ := tensor.CheckedProduct(st.Shape...)
		size := n * int64(d.Size())
		if d == tensor.F4 {
			size = (n + 1) / 2
		}
		ck.Tensors[st.Name] = &checkpoint.Tensor{Key: "model.safetensors", Version: "v1", Tensor: safetensors.Tensor{
			Name: st.Name, DTypeName: st.DType, DType: d, Shape: st.Shape, Begin: off, End: off + size}}
		off += size
	}
	return ck
}

func goldenPlan(t *testing.T, c *goldenCase, ck *checkpoint.Checkpoint) string {
	t.Helper()
	opts := DefaultOptions()
	for _, arg := range c.args {
		key, value, _ := strings.Cut(arg, "=")
		n, err := strconv.ParseInt(value, 10, 64)
		if err != nil {
			t.Fatalf("%s: argument %q: %v", c.pos, arg, err)
		}
		field := map[string]*int64{"segment-bytes": &opts.SegmentBytes, "segment-read-bytes": &opts.SegmentReadBytes,
			"max-gap": &opts.MaxGap, "max-read": &opts.MaxRead, "align": &opts.Align}[key]
		if field == nil {
			t.Fatalf("%s: unknown argument %q", c.pos, key)
		}
		*field = n
	}
	var req api.ShardRequest
	dec := json.NewDecoder(strings.NewReader(c.input))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&req); err != nil {
		t.Fatalf("%s: %v", c.pos, err)
	}
	p, err := New(&req, ck, opts)
	if err != nil {
		return "error: " + err.Error()
	}
	return renderPlan(p)
}

// renderPlan writes a plan as stable text: the summary, the header, then each item with its
// pieces and each segment with its reads and kernels. File offsets are absolute.
func renderPlan(p *Plan) string {
	var b strings.Builder
	fmt.Fprintf(&b, "plan %s: body %d bytes, needed %d, read %d in %d requests\n", p.Format, p.BodyBytes,
		p.NeededBytes, p.ReadBytes, p.ReadRequests)
	if len(p.Header) > 0 {
		renderHeader(&b, p.Header)
	}
	for _, it := range p.Items {
		fmt.Fprintf(&b, "item %s (tensor %d box %d) %s offsets %v lengths %v at %d, %d bytes\n",
			it.StoredName, it.Tensor, it.Box, it.DType, it.Offsets, it.Lengths, it.Output, it.Bytes)
		for _, pc := range it.Pieces {
			direct := ""
			if pc.Direct {
				direct = " direct"
			}
			fmt.Fprintf(&b, "  piece block %d of %s offsets %v lengths %v%s\n",
				pc.Block, pc.Source, pc.Offsets, pc.Lengths, direct)
		}
		for _, r := range it.Rectangle {
			fmt.Fprintf(&b, "  shared read %s@%s [%d, %d) needed %d\n",
				r.Key, r.Version, r.Offset, r.Offset+r.Length, r.Needed)
		}
		for _, seg := range it.Segments {
			fmt.Fprintf(&b, "  segment at %d, %d bytes\n", seg.Output, seg.Bytes)
			if seg.Fill != nil {
				fmt.Fprintf(&b, "    fill %s\n", hex.EncodeToString(seg.Fill))
			}
			for _, r := range seg.Direct {
				fmt.Fprintf(&b, "    direct %s@%s [%d, %d) -> %d\n",
					r.Key, r.Version, r.Offset, r.Offset+r.Length, r.Dst)
			}
			for _, r := range seg.Spans {
				fmt.Fprintf(&b, "    read %s@%s [%d, %d) needed %d\n",
					r.Key, r.Version, r.Offset, r.Offset+r.Length, r.Needed)
			}
			for _, k := range seg.Kernels {
				fmt.Fprintf(&b, "    %v\n", k)
			}
		}
	}
	return strings.TrimRight(b.String(), "\n")
}

// renderHeader writes a safetensors header line by line: its length, the entries in data order,
// then the metadata by key, with the boxes of shardsrv.boxes one a line.
func renderHeader(b *strings.Builder, header []byte) {
	n := binary.LittleEndian.Uint64(header)
	fmt.Fprintf(b, "header %d bytes, JSON %d\n", len(header), n)
	dec := json.NewDecoder(bytes.NewReader(header[8 : 8+n]))
	dec.Token() // {
	var meta map[string]string
	for dec.More() {
		key, _ := dec.Token()
		var value json.RawMessage
		_ = dec.Decode(&value)
		if key == "__metadata__" {
			_ = json.Unmarshal(value, &meta)
			continue
		}
		fmt.Fprintf(b, "  entry %s %s\n", key, value)
	}
	keys := slices.Sorted(maps.Keys(meta))
	for _, k := range keys {
		if k != "shardsrv.boxes" {
			fmt.Fprintf(b, "  metadata %s = %s\n", k, meta[k])
			continue
		}
		var boxes map[string]json.RawMessage
		_ = json.Unmarshal([]byte(meta[k]), &boxes)
		for _, name := range slices.Sorted(maps.Keys(boxes)) {
			fmt.Fprintf(b, "  metadata %s[%s] = %s\n", k, name, boxes[name])
		}
	}
}
