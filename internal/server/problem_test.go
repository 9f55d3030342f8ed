package server

import (
	"cmp"
	"encoding/json"
	"fmt"
	"go/ast"
	"go/parser"
	"go/token"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"testing"

	"github.com/getkin/kin-openapi/openapi3"
)

// TestProblemSlugsAreInTheTable reads the package's source: every newProblem call names a slug
// of problemTypes by a literal (or through bodyProblems or layoutProblems), and every slug of the table is sent
// somewhere.
func TestProblemSlugsAreInTheTable(t *testing.T) {
	files, err := filepath.Glob("*.go")
	if err != nil {
		t.Fatal(err)
	}
	used := map[string]bool{}
	fset := token.NewFileSet()
	for _, name := range files {
		if strings.HasSuffix(name, "_test.go") {
			continue
		}
		f, err := parser.ParseFile(fset, name, nil, 0)
		if err != nil {
			t.Fatal(err)
		}
		ast.Inspect(f, func(n ast.Node) bool {
			call, ok := n.(*ast.CallExpr)
			if !ok {
				return true
			}
			if id, ok := call.Fun.(*ast.Ident); !ok || id.Name != "newProblem" {
				return true
			}
			if idx, ok := call.Args[0].(*ast.IndexExpr); ok {
				if id, ok := idx.X.(*ast.Ident); ok && (id.Name == "bodyProblems" || id.Name == "layoutProblems") {
					return true // their values are checked below
				}
			}
			lit, ok := call.Args[0].(*ast.BasicLit)
			if !ok || lit.Kind != token.STRING {
				t.Errorf("%s: newProblem's slug is not a literal", fset.Position(call.Pos()))
				return true
			}
			slug, _ := strconv.Unquote(lit.Value)
			if _, ok := problemTypes[slug]; !ok {
				t.Errorf("%s: problem type %q is not in problemTypes", fset.Position(call.Pos()), slug)
			}
			used[slug] = true
			return true
		})
	}
	for _, slug := range slices.Concat(slices.Collect(maps.Values(bodyProblems)), slices.Collect(maps.Values(layoutProblems))) {
		if _, ok := problemTypes[slug]; !ok {
			t.Errorf("problem type %q of a typed error is not in problemTypes", slug)
		}
		used[slug] = true
	}
	for slug := range problemTypes {
		if !used[slug] {
			t.Errorf("problemTypes lists %q, which nothing sends", slug)
		}
	}
}

// problemTypesTable renders problemTypes as docs/contract.md lists them, by status and slug.
func problemTypesTable() string {
	slugs := slices.SortedFunc(maps.Keys(problemTypes), func(a, b string) int {
		return cmp.Or(cmp.Compare(problemTypes[a].Status, problemTypes[b].Status), cmp.Compare(a, b))
	})
	var b strings.Builder
	b.WriteString("| type | status | title | retryable | Retry-After |\n| --- | --- | --- | --- | --- |\n")
	for _, slug := range slugs {
		k := problemTypes[slug]
		after := ""
		if k.RetryAfter > 0 {
			after = strconv.Itoa(k.RetryAfter)
		}
		fmt.Fprintf(&b, "| `%s` | %d | %s | %t | %s |\n", slug, k.Status, k.Title, k.Retryable, after)
	}
	return b.String()
}

// TestProblemTypesDocumented holds the table in docs/contract.md and x-problem-types in
// openapi.yaml to problemTypes, so the contract cannot drift from what the server sends.
func TestProblemTypesDocumented(t *testing.T) {
	doc, err := os.ReadFile("../../docs/contract.md")
	if err != nil {
		t.Fatal(err)
	}
	const begin, end = "<!-- problem types: begin -->\n", "<!-- problem types: end -->"
	_, rest, ok1 := strings.Cut(string(doc), begin)
	listed, _, ok2 := strings.Cut(rest, end)
	if want := problemTypesTable(); !ok1 || !ok2 || listed != want {
		t.Errorf("docs/contract.md's table of problem types (between %q and %q) is not problemTypes; want\n%s",
			strings.TrimSpace(begin), end, want)
	}

	spec, err := openapi3.NewLoader().LoadFromFile("../../openapi.yaml")
	if err != nil {
		t.Fatal(err)
	}
	ext := spec.Components.Schemas["Problem"].Value.Properties["type"].Value.Extensions["x-problem-types"]
	raw, err := json.Marshal(ext)
	if err != nil {
		t.Fatal(err)
	}
	var got map[string]struct {
		Status     int    `json:"status"`
		Title      string `json:"title"`
		Retryable  bool   `json:"retryable"`
		RetryAfter int    `json:"retry_after"`
	}
	if err := json.Unmarshal(raw, &got); err != nil {
		t.Fatalf("openapi.yaml's x-problem-types: %v", err)
	}
	for slug, k := range problemTypes {
		g, ok := got[slug]
		if !ok || g.Status != k.Status || g.Title != k.Title || g.Retryable != k.Retryable ||
			g.RetryAfter != k.RetryAfter {
			t.Errorf("openapi.yaml's x-problem-types has %q as %+v, not %+v", slug, g, k)
		}
	}
	for slug := range got {
		if _, ok := problemTypes[slug]; !ok {
			t.Errorf("openapi.yaml's x-problem-types lists %q, which is not in problemTypes", slug)
		}
	}
}
