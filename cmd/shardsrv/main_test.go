package main

import (
	"bytes"
	"context"
	"io"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"

	"github.com/shardsrv/shardsrv/internal/azstore"
	"github.com/shardsrv/shardsrv/internal/cache"
	"github.com/shardsrv/shardsrv/internal/gcsstore"
	"github.com/shardsrv/shardsrv/internal/planner"
	"github.com/shardsrv/shardsrv/internal/s3reader"
)

func TestFlagsFallBackToEnvironment(t *testing.T) {
	t.Setenv("SHARDSRV_STORE", "/data")
	t.Setenv("SHARDSRV_MAX_GAP", "1048576")
	t.Setenv("SHARDSRV_ADDR", ":9")
	c, err := parseServe([]string{"--addr", ":7"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	if c.store != "/data" || c.planner.MaxGap != 1<<20 || c.addr != ":7" {
		t.Errorf(
			"store %q gap %d addr %q: env fills what the command line leaves, the command line wins",
			c.store,
			c.planner.MaxGap,
			c.addr,
		)
	}
}

func TestConfigErrorsSayWhatToFix(t *testing.T) {
	for _, c := range []struct {
		args []string
		env  string
		want string
	}{
		{nil, "", "--store is required"},
		{[]string{"--store", "x", "--window", "-1"}, "", "must not be negative"},
		{[]string{"--store", "x", "--log-level", "loud"}, "", "--log-level"},
		{[]string{"--store", "s3://b", "--s3-read-timeout", "-1s"}, "", "--s3-read-timeout"},
		{[]string{"--store", "gs://b", "--gcs-max-in-flight", "-1"}, "", "--gcs-max-in-flight"},
		{[]string{"--store", "az://a/c", "--azure-retry-budget", "-1s"}, "", "--azure-retry-budget"},
		{[]string{"--store", "x", "--peers", "http://a:1", "--advertise", "http://a:1", "--peer-token-file", "f",
			"--peer-timeout", "-1s"}, "", "--peer-timeout"},
		{[]string{"--store", "x"}, "nope", "SHARDSRV_MAX_READ"},
	} {
		if c.env != "" {
			t.Setenv("SHARDSRV_MAX_READ", c.env)
		}
		_, err := parseServe(c.args, io.Discard)
		if err == nil || !strings.Contains(err.Error(), c.want) {
			t.Errorf("%v: %v, want an error mentioning %q", c.args, err, c.want)
		}
	}
	if _, err := openStore(context.Background(), &config{store: "ftp://host/dir"}); err == nil {
		t.Error("an unsupported store URL must be refused")
	}
}

// Zero is the default for the object stores' tunables, the peer time-out and serve's own
// durations too, as for every other setting (docs/configuration.md).
func TestZeroTakesTheDefault(t *testing.T) {
	for _, args := range [][]string{
		{"--store", "s3://b", "--s3-max-in-flight", "0", "--s3-read-timeout", "0s", "--s3-retry-budget", "0s"},
		{"--store", "gs://b", "--gcs-max-in-flight", "0", "--gcs-read-timeout", "0s", "--gcs-retry-budget", "0s"},
		{"--store", "az://a/c", "--azure-max-in-flight", "0", "--azure-read-timeout", "0s",
			"--azure-retry-budget", "0s"},
		{"--store", "x", "--peers", "http://a:1", "--advertise", "http://a:1", "--peer-token-file", "f",
			"--peer-timeout", "0s", "--peers-dns-refresh", "0s", "--cache-bytes", "64Mi"},
		{"--store", "x", "--idle-timeout", "0s", "--shutdown-grace", "0s"},
	} {
		if _, err := parseServe(args, io.Discard); err != nil {
			t.Errorf("%v: %v", args, err)
		}
	}
}

func TestEveryObjectStoreParsesItsURLAndGetsObjectStorageDefaults(t *testing.T) {
	for _, url := range []string{"s3://bucket/models/v1", "gs://bucket/models/v1", "az://acct/container/models/v1"} {
		c, err := parseServe([]string{"--store", url}, io.Discard)
		if err != nil {
			t.Fatalf("%s: %v", url, err)
		}
		var parsed string
		switch o := c.objectStores[objectStoreOf(url)].(type) {
		case *s3reader.Config:
			parsed = o.Bucket + "/" + o.Prefix
		case *gcsstore.Config:
			parsed = o.Bucket + "/" + o.Prefix
		case *azstore.Config:
			parsed = o.Account + "/" + o.Container + "/" + o.Prefix
		}
		_, rest, _ := strings.Cut(url, "://")
		if parsed != rest || c.cache.Bytes != cache.ObjectStoreConfig().Bytes ||
			c.planner.MaxGap != planner.ObjectStoreOptions().MaxGap {
			t.Errorf("%s: parsed %q, cache %d, max gap %d: want the URL's parts and the object-store defaults",
				url, parsed, c.cache.Bytes, c.planner.MaxGap)
		}
	}
}

func TestS3StoreGetsObjectStorageDefaults(t *testing.T) {
	c, err := parseServe([]string{"--store", "s3://bucket/models/v1", "--max-gap", "4096"}, io.Discard)
	if err != nil {
		t.Fatal(err)
	}
	s3 := c.objectStores[objectStoreOf("s3://")].(*s3reader.Config)
	if s3.Bucket != "bucket" || s3.Prefix != "models/v1" || c.planner.MaxGap != 4096 ||
		c.planner.MaxRead != planner.ObjectStoreOptions().MaxRead ||
		c.planner.MaxOverread != 16 ||
		c.cache.Bytes != 512<<20 {
		t.Errorf("%+v %+v: s3 defaults apply where no flag is given", s3, c.planner)
	}
}

func TestAzureStoreReadsInItsOwnSize(t *testing.T) {
	for _, tc := range []struct {
		args             []string
		segment, maxRead int64
	}{
		{[]string{"--store", "az://account/container"}, azstore.ReadBytes, azstore.ReadBytes},
		{[]string{"--store", "az://account/container", "--max-read", "4MiB"}, azstore.ReadBytes, 4 << 20},
		{[]string{"--store", "gs://bucket"}, planner.ObjectStoreOptions().SegmentBytes,
			planner.ObjectStoreOptions().MaxRead},
	} {
		c, err := parseServe(tc.args, io.Discard)
		if err != nil {
			t.Fatal(err)
		}
		if c.planner.SegmentBytes != tc.segment || c.planner.MaxRead != tc.maxRead ||
			c.planner.MaxGap != planner.ObjectStoreOptions().MaxGap {
			t.Errorf("%q: segments %d, reads %d, gap %d: want %d, %d and the object stores' gap", tc.args,
				c.planner.SegmentBytes, c.planner.MaxRead, c.planner.MaxGap, tc.segment, tc.maxRead)
		}
	}
}

// `shardsrv example --out DIR` writes nothing outside DIR, and every file its curls send is there.
func TestExampleCurlsSendFilesInsideItsDirectory(t *testing.T) {
	parent := t.TempDir()
	dir := filepath.Join(parent, "store")
	var out bytes.Buffer
	if err := writeExample([]string{"--out", dir}, &out, io.Discard); err != nil {
		t.Fatal(err)
	}
	if entries, _ := os.ReadDir(parent); len(entries) != 1 {
		t.Errorf("wrote beside %s: %v", dir, entries)
	}
	sent := regexp.MustCompile(`-d @(\S+)`).FindAllStringSubmatch(out.String(), -1)
	if len(sent) == 0 || !strings.Contains(out.String(), "shardsrv serve --store "+dir) {
		t.Fatalf("no request files or no serve command in:\n%s", out.String())
	}
	for _, m := range sent {
		if _, err := os.Stat(m[1]); err != nil || !strings.HasPrefix(m[1], dir+string(filepath.Separator)) {
			t.Errorf("a curl sends %s: %v, want a file inside %s", m[1], err, dir)
		}
	}
}
