package main

// The documents that state serve's defaults — README.md's flag tables and prose, docs/cluster.md,
// the chart's README and the comments of its values.yaml — are held here to the flags themselves,
// so a default changed in code fails a test until the docs say it too.
//
// How the docs write a default, and so what this file reads:
//   - a flag table row: | `--flag` | DEFAULT | meaning |, DEFAULT being "V" (every store), "V (W for
//     object stores)", or empty for a flag without a default;
//   - README prose: "`--flag` (V" with V a size or a duration with its unit (plain numbers in prose
//     are often statuses, "(413)", and are not read);
//   - the chart README: a row whose default is "unset: shardsrv's (V1, V2, …)" for its keys in
//     order, a list "…; W1, W2 for `file://`" after a semicolon, a trailing "for object stores" on
//     a list that holds only there (the chart's default store is s3://);
//   - values.yaml: "#   key: V" in the comments of the section the key is in.
//
// Which flag a chart value sets is not read from the template but seen in what it renders.

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/bytesize"
	"sigs.k8s.io/yaml"
)

// serveDefaults are serve's flags with local-directory and with object-store defaults.
func serveDefaults() (local, object *flag.FlagSet) {
	_, local = newServeFlags("", io.Discard)
	_, object = newServeFlags(anyObjectStore, io.Discard)
	return local, object
}

// sameValue reports whether the documented text doc states the flag's default, read as the
// flag's kind: a size, a duration, a number, on/off, or text.
func sameValue(f *flag.Flag, doc string) (bool, error) {
	doc = strings.Trim(strings.TrimSpace(doc), "`")
	switch v := f.Value.(type) {
	case bytesize.Value:
		n, err := bytesize.Parse(doc)
		return err == nil && n == *v.P, err
	case flag.Getter:
		switch def := v.Get().(type) {
		case time.Duration:
			d, err := time.ParseDuration(strings.NewReplacer(" min", "m", " ", "").Replace(doc))
			return err == nil && d == def, err
		case int, int64, uint, uint64:
			n, err := bytesize.Parse(doc) // counts too are written with units: 1 Mi
			return err == nil && fmt.Sprint(n) == fmt.Sprint(def), err
		case bool:
			on := map[string]bool{"on": true, "off": false}
			b, ok := on[doc]
			if !ok {
				return false, fmt.Errorf("%q is neither on nor off", doc)
			}
			return b == def, nil
		}
	}
	return doc == f.DefValue, nil
}

func readDoc(t *testing.T, path string) string {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("..", "..", path))
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

var (
	flagRow       = regexp.MustCompile("(?m)^\\| `--([a-z0-9-]+)[^`]*` \\| ([^|]*) \\|")
	forObject     = regexp.MustCompile(`^(.*) \((.*) for object stores\)$`)
	proseDefault  = regexp.MustCompile("`--([a-z0-9-]+)`\\s+\\(([0-9][0-9. ]*[A-Za-z]+)[;:,)]")
	objectSummary = regexp.MustCompile("the defaults become `([^`]+)`")
)

func TestReadmeStatesServeDefaults(t *testing.T) {
	local, object := serveDefaults()
	rows := 0
	for _, path := range []string{"README.md", "docs/cluster.md"} {
		for _, m := range flagRow.FindAllStringSubmatch(readDoc(t, path), -1) {
			rows++
			name, def := m[1], strings.TrimSpace(m[2])
			lf, of := local.Lookup(name), object.Lookup(name)
			if lf == nil {
				t.Errorf("%s: --%s is in a table but serve has no such flag", path, name)
				continue
			}
			localDoc, objectDoc := def, def
			if o := forObject.FindStringSubmatch(def); o != nil {
				localDoc, objectDoc = o[1], o[2]
			} else if lf.DefValue != of.DefValue {
				objectDoc = "" // the object-store summary below states it
			}
			check := func(f *flag.Flag, doc, stores string) {
				if doc == "" && stores == "object stores" {
					return
				}
				if doc == "" && f.DefValue != "" {
					t.Errorf("%s: --%s has no default in its table, but defaults to %s for %s", path, name, f.DefValue, stores)
					return
				}
				if doc == "" {
					return
				}
				if ok, err := sameValue(f, doc); !ok {
					t.Errorf("%s: --%s defaults to %s for %s, its table says %q (%v)", path, name, f.DefValue, stores, doc, err)
				}
			}
			check(lf, localDoc, "directories")
			check(of, objectDoc, "object stores")
		}
	}
	if rows < 15 {
		t.Fatalf("read %d flag rows: the tables' form changed, and this test with it", rows)
	}

	readme := readDoc(t, "README.md")
	summary := objectSummary.FindStringSubmatch(readme)
	if summary == nil {
		t.Fatal("README.md no longer lists the object-store defaults as `--flag V ...`")
	}
	if got, want := sortedFields(summary[1]), sortedFields(objectStoreDefaults()); got != want {
		t.Errorf("README.md: the object-store defaults are %q, it says %q", want, got)
	}

	for _, path := range []string{"README.md", "docs/cluster.md", "docs/engines.md", "docs/performance.md"} {
		for _, m := range proseDefault.FindAllStringSubmatch(readDoc(t, path), -1) {
			f := local.Lookup(m[1])
			if f == nil {
				t.Errorf("%s: --%s is not one of serve's flags", path, m[1])
				continue
			}
			if ok, err := sameValue(f, m[2]); !ok {
				t.Errorf("%s: --%s defaults to %s, the text says %q (%v)", path, m[1], f.DefValue, m[2], err)
			}
		}
	}
}

func sortedFields(s string) string {
	var pairs []string
	f := strings.Fields(s)
	for i := 0; i+1 < len(f); i += 2 {
		pairs = append(pairs, f[i]+" "+f[i+1])
	}
	slices.Sort(pairs)
	return strings.Join(pairs, " ")
}

var (
	unsetRow     = regexp.MustCompile("(?m)^\\| (`[^|]*`) \\| unset: shardsrv's \\(([^|]*)\\) \\|")
	backticked   = regexp.MustCompile("`([^`]+)`")
	commentValue = regexp.MustCompile(`\b([a-z][A-Za-z]*): ([0-9][0-9.]*[A-Za-z]*)`)
)

// chartDefaults reads the chart README's "unset: shardsrv's (…)" rows: each value key with what
// the README says it defaults to on a directory and on an object store ("" where it says nothing).
func chartDefaults(t *testing.T) map[string][2]string {
	docs := map[string][2]string{}
	for _, m := range unsetRow.FindAllStringSubmatch(readDoc(t, "helm/shardsrv/README.md"), -1) {
		var keys []string
		prefix := ""
		for _, k := range backticked.FindAllStringSubmatch(m[1], -1) {
			if i := strings.LastIndex(k[1], "."); i >= 0 {
				prefix = k[1][:i+1]
				keys = append(keys, k[1])
			} else {
				keys = append(keys, prefix+k[1])
			}
		}
		doc := make([][2]string, len(keys))
		for _, list := range strings.Split(m[2], ";") {
			list = strings.TrimSpace(list)
			local, obj := true, true
			if l, ok := strings.CutSuffix(list, " for object stores"); ok {
				list, local = l, false
			} else if l, ok := strings.CutSuffix(list, " for `file://`"); ok {
				list, obj = l, false
			}
			values := strings.Split(list, ", ")
			if len(values) != len(keys) {
				t.Errorf("chart README: %v take %d values, the row lists %q", keys, len(keys), list)
				continue
			}
			for i, v := range values {
				if local {
					doc[i][0] = v
				}
				if obj {
					doc[i][1] = v
				}
			}
		}
		for i, k := range keys {
			docs[k] = doc[i]
		}
	}
	if len(docs) < 10 {
		t.Fatalf("read %d chart values from the README's 'unset: shardsrv's' rows: their form changed", len(docs))
	}
	return docs
}

// chartFlags renders the chart with every key set to a value of its own and answers the flag each
// one sets, as seen in the SHARDSRV_ variables of the rendered container.
func chartFlags(t *testing.T, keys []string) map[string]string {
	args := []string{"template", "rel", filepath.Join("..", "..", "helm", "shardsrv"), "--set", "cluster.enabled=true"}
	sentinel := map[string]string{}
	for i, k := range keys {
		v := strconv.Itoa(1001 + i) // a count or a size in bytes
		if strings.HasSuffix(k, "Timeout") || strings.HasSuffix(k, "Budget") || strings.HasSuffix(k, "Refresh") {
			v += "s"
			args = append(args, "--set-string", k+"="+v)
		} else {
			args = append(args, "--set", k+"="+v)
		}
		sentinel[v] = k
	}
	var out, errb bytes.Buffer
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %v: %v\n%s", args, err, errb.String())
	}
	flags := map[string]string{}
	env := regexp.MustCompile(`- name: SHARDSRV_([A-Z0-9_]+)\s+value: "?([^"\n]*)"?`)
	for _, m := range env.FindAllStringSubmatch(out.String(), -1) {
		if k, ok := sentinel[m[2]]; ok {
			flags[k] = strings.ToLower(strings.ReplaceAll(m[1], "_", "-"))
		}
	}
	return flags
}

// helmBinary finds helm: the module's .tools/bin, then PATH; the test skips without it unless
// SHARDSRV_REQUIRE_HELM is set, as 'make test' does.
func helmBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join("..", "..", ".tools", "bin", "helm")
	if _, err := os.Stat(bin); err != nil {
		if bin, err = exec.LookPath("helm"); err != nil {
			if os.Getenv("SHARDSRV_REQUIRE_HELM") != "" {
				t.Fatal("helm not found (run 'make tools')")
			}
			t.Skip("helm not found; 'make test' installs it")
		}
	}
	return bin
}

func TestChartStatesServeDefaults(t *testing.T) {
	local, object := serveDefaults()
	docs := chartDefaults(t)
	var keys []string
	for k := range docs {
		keys = append(keys, k)
	}
	slices.Sort(keys)
	flags := chartFlags(t, keys)
	for _, k := range keys {
		name, ok := flags[k]
		if !ok {
			t.Errorf("chart README: %s takes shardsrv's default, but setting it sets no SHARDSRV_ variable", k)
			continue
		}
		for i, fs := range []*flag.FlagSet{local, object} {
			doc, f := docs[k][i], fs.Lookup(name)
			if doc == "" {
				continue
			}
			if ok, err := sameValue(f, doc); !ok {
				t.Errorf("chart README: %s (--%s) defaults to %s on %s, the README says %q (%v)",
					k, name, f.DefValue, []string{"a directory", "an object store"}[i], doc, err)
			}
		}
	}

	// values.yaml's comments show the defaults of the keys left unset, for the chart's default
	// store (an object store).
	var values struct{ Store struct{ URL string } }
	raw := readDoc(t, "helm/shardsrv/values.yaml")
	if err := yaml.Unmarshal([]byte(raw), &values); err != nil || !isObjectStore(values.Store.URL) {
		t.Fatalf("values.yaml: store.url %q (%v): the comments are read as object-store defaults", values.Store.URL, err)
	}
	seen := 0
	section, pending := "", []string{}
	for _, line := range strings.Split(raw, "\n") {
		switch {
		case strings.HasPrefix(line, "#"):
			pending = append(pending, line)
			continue
		case line != "" && line[0] != ' ':
			section, _, _ = strings.Cut(line, ":")
		}
		var comments []string
		if strings.HasPrefix(strings.TrimSpace(line), "#") {
			comments = []string{line}
		} else {
			comments, pending = pending, nil
		}
		for _, c := range comments {
			for _, m := range commentValue.FindAllStringSubmatch(c, -1) {
				key := section + "." + m[1]
				name, ok := flags[key]
				if !ok {
					continue
				}
				seen++
				if ok, err := sameValue(object.Lookup(name), m[2]); !ok {
					t.Errorf("values.yaml: %s (--%s) defaults to %s, its comment says %q (%v)",
						key, name, object.Lookup(name).DefValue, m[2], err)
				}
			}
		}
	}
	if seen < 10 {
		t.Errorf("read %d defaults from values.yaml's comments: their form changed", seen)
	}
}
