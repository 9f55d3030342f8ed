package objstore

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"sort"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/internal/store"
)

func TestParseURL(t *testing.T) {
	for _, c := range []struct {
		raw, form, names, prefix string
	}{
		{"s3://b", "s3://BUCKET[/PREFIX]", "b", ""},
		{"s3://b/p/q/", "s3://BUCKET[/PREFIX]", "b", "p/q"},
		{"s3://b//p", "s3://BUCKET[/PREFIX]", "b", "p"},
		{"az://acct/c", "az://ACCOUNT/CONTAINER[/PREFIX]", "acct c", ""},
		{"az://acct/c/p/q/", "az://ACCOUNT/CONTAINER[/PREFIX]", "acct c", "p/q"},
	} {
		names, prefix, err := ParseURL(c.raw, c.form)
		if err != nil || strings.Join(names, " ") != c.names || prefix != c.prefix {
			t.Errorf("ParseURL(%q) = %q %q %v", c.raw, names, prefix, err)
		}
	}
	for _, c := range []struct{ raw, form string }{
		{"s3://", "s3://BUCKET[/PREFIX]"}, {"b/p", "s3://BUCKET[/PREFIX]"}, {"s3:///p", "s3://BUCKET[/PREFIX]"},
		{"gs://b/p", "s3://BUCKET[/PREFIX]"}, {"az://acct", "az://ACCOUNT/CONTAINER[/PREFIX]"},
		{"az://acct/", "az://ACCOUNT/CONTAINER[/PREFIX]"}, {"az:///c/p", "az://ACCOUNT/CONTAINER[/PREFIX]"},
	} {
		if _, _, err := ParseURL(c.raw, c.form); err == nil || !strings.Contains(err.Error(), c.form) {
			t.Errorf("ParseURL(%q): %v, want an error naming %s", c.raw, err, c.form)
		}
	}
}

func TestNameHasNoSecrets(t *testing.T) {
	for endpoint, want := range map[string]string{
		"":                                     "S3 store s3://b/p",
		"http://user:secret@host:9000/x?sig=s": "S3 store s3://b/p at http://host:9000/x",
		"localhost:4443":                       "S3 store s3://b/p at localhost:4443",
		"user:secret@localhost:4443":           "S3 store s3://b/p at localhost:4443",
	} {
		s := New(pages{}, Config{Kind: "S3", Bucket: "s3://b", Prefix: "p", Endpoint: endpoint})
		if s.String() != want {
			t.Errorf("endpoint %q: named %q, want %q", endpoint, s.String(), want)
		}
	}
}

// pages is a bucket in memory that lists two names a page, in no order, and whose reads find
// nothing: the listing loop and the missing-bucket rules are the layer's, whatever the SDK.
type pages struct {
	names    []string
	noBucket bool
}

func (b pages) Head(context.Context, string) (store.Info, error) { return store.Info{}, b.missing() }
func (b pages) Open(context.Context, string, string, int64, int64) (io.ReadCloser, int64, error) {
	return nil, 0, b.missing()
}

func (b pages) missing() error {
	if b.noBucket {
		return fmt.Errorf("%w: the bucket is gone", store.ErrNoBucket)
	}
	return store.ErrNotFound
}

func (b pages) List(_ context.Context, prefix, token string) ([]string, string, error) {
	var under []string
	for _, n := range b.names {
		if strings.HasPrefix(n, prefix) {
			under = append(under, n)
		}
	}
	sort.Sort(sort.Reverse(sort.StringSlice(under)))
	var from int
	fmt.Sscan(token, &from)
	to := min(from+2, len(under))
	if to == len(under) {
		return under[from:to], "", nil
	}
	return under[from:to], fmt.Sprint(to), nil
}

func (b pages) Check(context.Context) error {
	if b.noBucket {
		return errors.New("the SDK's words for a missing bucket")
	}
	return nil
}

func (pages) Transient(error) bool { return false }

func (b pages) Classify(err error) error {
	if b.noBucket {
		return fmt.Errorf("%w: %v", store.ErrNoBucket, err)
	}
	return err
}

func TestListPagesUnderThePrefix(t *testing.T) {
	b := pages{names: []string{"p/m/a", "p/m/b", "p/m/sub/c", "p/n/d", "p/m/bad name", "p/m/../e", "q/m/x", "pm/y"}}
	s := New(b, Config{Kind: "test", Bucket: "t://b", Prefix: "p"})
	for prefix, want := range map[string][]string{
		"":  {"m/a", "m/b", "m/sub/c", "n/d"},
		"m": {"m/a", "m/b", "m/sub/c"},
		"x": nil,
	} {
		if keys, err := s.List(context.Background(), prefix); err != nil || !slices.Equal(keys, want) {
			t.Errorf("List(%q) = %v, %v; want %v", prefix, keys, err, want)
		}
	}
	if _, err := s.List(context.Background(), "../p"); !errors.Is(err, store.ErrInvalidKey) {
		t.Errorf("List(../p): %v, want ErrInvalidKey", err)
	}
}

// A missing bucket: Stat says not found, as on every store; a read that finds nothing asks the
// bucket and names it missing; Check names it, classified.
func TestMissingBucket(t *testing.T) {
	ctx := context.Background()
	gone := New(pages{noBucket: true}, Config{Kind: "test", Bucket: "t://b"})
	if _, err := gone.Stat(ctx, "m/a"); !errors.Is(err, store.ErrNotFound) {
		t.Errorf("Stat: %v, want ErrNotFound", err)
	}
	if err := gone.ReadAt(ctx, "m/a", "", make([]byte, 1), 0); !errors.Is(err, store.ErrNoBucket) ||
		!strings.HasPrefix(err.Error(), "test store t://b: ") {
		t.Errorf("ReadAt: %v, want ErrNoBucket naming the store", err)
	}
	if err := gone.Check(ctx); !errors.Is(err, store.ErrNoBucket) {
		t.Errorf("Check: %v, want ErrNoBucket", err)
	}
	there := New(pages{}, Config{Kind: "test", Bucket: "t://b"})
	err := there.ReadAt(ctx, "m/a", "", make([]byte, 1), 0)
	if !errors.Is(err, store.ErrNotFound) || errors.Is(err, store.ErrNoBucket) ||
		!strings.Contains(err.Error(), `"m/a"`) {
		t.Errorf("ReadAt of a missing object: %v, want ErrNotFound naming the key", err)
	}
}

// Tunables left at zero take the defaults; New refuses negatives, as the backends' Validate does.
func TestNewTakesZeroTunablesAndRefusesNegatives(t *testing.T) {
	if got := New(pages{}, Config{Kind: "S3"}).reader.cfg.Tunables; got != (Tunables{}).WithDefaults() {
		t.Errorf("zero tunables became %+v", got)
	}
	defer func() {
		if err, _ := recover().(error); err == nil || !strings.Contains(err.Error(), "--s3-max-in-flight") {
			t.Errorf("New with a negative tunable: recovered %v, want the flags named", err)
		}
	}()
	New(pages{}, Config{Kind: "S3", Tunables: Tunables{MaxInFlight: -1}})
}
