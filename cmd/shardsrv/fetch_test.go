package main

import (
	"bytes"
	"errors"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/example"
)

// runMainEnv, when set, makes the test binary run the command its lines name instead of the tests:
// a test that sends the command a signal runs it as a process of its own.
const runMainEnv = "SHARDSRV_TEST_RUN_MAIN"

func TestMain(m *testing.M) {
	if args := os.Getenv(runMainEnv); args != "" {
		os.Args = append([]string{"shardsrv"}, strings.Split(args, "\n")...)
		main()
		os.Exit(0)
	}
	os.Exit(m.Run())
}

// stallingWriter holds a response once a KiB of it is out, until its request ends.
type stallingWriter struct {
	http.ResponseWriter
	r       *http.Request
	written int
}

func (w *stallingWriter) Write(p []byte) (int, error) {
	n, err := w.ResponseWriter.Write(p)
	if w.written += n; w.written >= 1<<10 {
		http.NewResponseController(w.ResponseWriter).Flush()
		<-w.r.Context().Done()
	}
	return n, err
}

func (w *stallingWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// A fetch killed by SIGTERM mid-rank leaves no temporary file and no config.json (the directory is
// not complete); a rerun removes a killed fetch's temporary file and fetches only the missing rank.
func TestInterruptedFetchLeavesNoTempAndResumes(t *testing.T) {
	var shards, stallAt atomic.Int64
	stallAt.Store(2) // the second rank
	url, _ := liveWrapped(t, func(h http.Handler) http.Handler {
		return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
			if r.URL.Path == "/v1/shards" && shards.Add(1) == stallAt.Load() {
				w = &stallingWriter{ResponseWriter: w, r: r}
			}
			h.ServeHTTP(w, r)
		})
	})
	dir := filepath.Join(t.TempDir(), "out")
	args := []string{"fetch", "--server", url, "--checkpoint", example.Name, "--layout", "vllm", "--tp", "2",
		"--rank", "all", "--parallel", "1", "--out", dir}
	cmd := exec.Command(os.Args[0])
	cmd.Env = append(os.Environ(), runMainEnv+"="+strings.Join(args, "\n"))
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	temp := "." + "model-rank-1-part-0.safetensors" + tempMark
	for deadline := time.Now().Add(time.Minute); ; time.Sleep(20 * time.Millisecond) {
		if time.Now().After(deadline) {
			cmd.Process.Kill()
			t.Fatalf("rank 1 never started: %v\n%s", fileNames(t, dir), stderr.String())
		}
		names, _ := os.ReadDir(dir)
		if slices.ContainsFunc(names, func(e os.DirEntry) bool {
			fi, err := e.Info()
			return strings.HasPrefix(e.Name(), temp) && err == nil && fi.Size() > 0
		}) {
			break
		}
	}
	cmd.Process.Signal(syscall.SIGTERM)
	err := cmd.Wait()
	var exit *exec.ExitError
	if !errors.As(err, &exit) || exit.ExitCode() != 1 || !strings.Contains(stderr.String(), "interrupted") {
		t.Errorf("a fetch interrupted by SIGTERM: %v, stderr:\n%s", err, stderr.String())
	}
	want := []string{recordName("model-rank-0-part-0.safetensors"), "model-rank-0-part-0.safetensors"}
	if names := fileNames(t, dir); !slices.Equal(names, want) {
		t.Errorf("after SIGTERM mid-rank 1 the directory holds %v, want only rank 0 and its record %v", names, want)
	}

	// A fetch killed outright (SIGKILL) leaves its temporary file: the rerun removes it.
	stale := filepath.Join(dir, temp+"KILLED")
	if err := os.WriteFile(stale, []byte("partial"), 0o644); err != nil {
		t.Fatal(err)
	}
	stallAt.Store(0)
	before := shards.Load()
	var errs bytes.Buffer
	if err := fetch(args[1:], &bytes.Buffer{}, &errs); err != nil {
		t.Fatalf("rerun: %v\n%s", err, errs.String())
	}
	if n := shards.Load() - before; n != 1 || !strings.Contains(errs.String(), "skipped") {
		t.Errorf("the rerun fetched %d ranks, want only the missing one:\n%s", n, errs.String())
	}
	want = []string{recordName("model-rank-0-part-0.safetensors"), recordName("model-rank-1-part-0.safetensors"),
		"config.json", "generation_config.json", "model-rank-0-part-0.safetensors", "model-rank-1-part-0.safetensors",
		"tokenizer.json", "tokenizer_config.json"}
	if names := fileNames(t, dir); !slices.Equal(names, want) {
		t.Errorf("after the rerun the directory holds %v, want %v", names, want)
	}

	// A rank file changed since it was recorded is fetched again.
	if err := os.WriteFile(filepath.Join(dir, "model-rank-1-part-0.safetensors"), []byte("x"), 0o644); err != nil {
		t.Fatal(err)
	}
	before = shards.Load()
	if err := fetch(args[1:], &bytes.Buffer{}, &errs); err != nil {
		t.Fatal(err)
	}
	if n := shards.Load() - before; n != 1 {
		t.Errorf("a rank file that is not what its record says: %d fetches, want 1", n)
	}
}

func TestRankLists(t *testing.T) {
	for _, c := range []struct {
		rank string
		want []int64
	}{{"3", []int64{3}}, {"0,3,5", []int64{0, 3, 5}}, {"all", []int64{0, 1, 2, 3, 4, 5, 6, 7}}} {
		lf := layoutFlags{tp: 8, rank: c.rank}
		if got, err := lf.ranks(true); err != nil || !slices.Equal(got, c.want) {
			t.Errorf("--rank %s: %v %v, want %v", c.rank, got, err, c.want)
		}
	}
	for _, bad := range []string{"1,1", "0,x", ""} {
		lf := layoutFlags{tp: 8, rank: bad}
		if _, err := lf.ranks(true); err == nil {
			t.Errorf("--rank %q was accepted", bad)
		}
	}
	if _, err := (&layoutFlags{tp: 8, rank: "0,1"}).ranks(false); err == nil {
		t.Error("a command taking one rank accepted a list")
	}
}
