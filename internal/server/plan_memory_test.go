package server_test

import (
	"bufio"
	"bytes"
	"context"
	"encoding/binary"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

// The memory the subprocess gets, and what VmHWM may exceed it by.
const (
	memBudget  = 256 << 20 // --memory-bytes
	memMaxPlan = 64 << 20  // --max-plan-bytes: at most four plans are built at once
	memMaxBody = 16 << 20  // --max-body-bytes
	// memOverhead is what the process may hold beyond --memory-bytes: the server sets Go's soft
	// memory limit to the budget + 256 MiB (GOMEMLIMIT: room for the runtime, garbage not yet
	// collected, and what is not charged to the budget — bodies being read, decoded requests,
	// plan reports being encoded), plus 64 MiB for what the Go limit does not count (the
	// binary's text and data, thread stacks of the OS, C allocations).
	memOverhead = 256<<20 + 64<<20
)

// sparseCheckpoint writes dir/big/model.safetensors: "w" BF16 [16384, 8192] (256 MiB, a hole on
// disk: its bytes are zeros) and "n" BF16 [1], a 2-byte source to broadcast.
func sparseCheckpoint(t *testing.T, dir string) {
	t.Helper()
	const wBytes = 16384 * 8192 * 2
	header := fmt.Sprintf(
		`{"w":{"dtype":"BF16","shape":[16384,8192],"data_offsets":[0,%d]},"n":{"dtype":"BF16","shape":[1],`+
			`"data_offsets":[%d,%d]}}`,
		wBytes,
		wBytes,
		wBytes+2,
	)
	for len(header)%8 != 0 {
		header += " "
	}
	path := filepath.Join(dir, "big", "model.safetensors")
	os.MkdirAll(filepath.Dir(path), 0o755)
	file := binary.LittleEndian.AppendUint64(nil, uint64(len(header)))
	if err := os.WriteFile(path, append(file, header...), 0o644); err != nil {
		t.Fatal(err)
	}
	if err := os.Truncate(path, int64(8+len(header)+wBytes+2)); err != nil {
		t.Fatal(err)
	}
}

// startShardsrv builds cmd/shardsrv and serves dir with args; it returns the base URL and the
// child's pid.
func startShardsrv(t *testing.T, dir string, args ...string) (string, int) {
	t.Helper()
	goTool := filepath.Join(runtime.GOROOT(), "bin", "go")
	if _, err := os.Stat(goTool); err != nil {
		if goTool, err = exec.LookPath("go"); err != nil {
			t.Skip("no go tool to build shardsrv with")
		}
	}
	bin := filepath.Join(t.TempDir(), "shardsrv")
	build := exec.Command(goTool, "build", "-o", bin, "github.com/shardsrv/shardsrv/cmd/shardsrv")
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	cmd := exec.Command(
		bin,
		append(
			[]string{"serve", "--store", dir, "--addr", "127.0.0.1:0", "--drain-delay", "0s", "--shutdown-grace", "2s"},
			args...)...)
	cmd.Env = append(os.Environ(), "GOMEMLIMIT=") // the server sets its own from --memory-bytes
	stderr, _ := cmd.StderrPipe()
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() {
		cmd.Process.Signal(syscall.SIGTERM)
		done := make(chan struct{})
		go func() { cmd.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(5 * time.Second):
			cmd.Process.Kill()
			<-done
		}
	})
	addr, exited := make(chan string, 1), make(chan struct{})
	var logTail []string
	var mu sync.Mutex
	go func() { // the "serving" line gives the address; the rest of the log is drained
		defer close(exited)
		sc := bufio.NewScanner(stderr)
		sc.Buffer(nil, 1<<20)
		for sc.Scan() {
			var line struct{ Msg, Addr string }
			if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "serving" {
				addr <- line.Addr
			}
			mu.Lock()
			logTail = append(logTail[max(len(logTail)-20, 0):], sc.Text())
			mu.Unlock()
		}
	}()
	select {
	case a := <-addr:
		return "http://" + a, cmd.Process.Pid
	case <-exited:
	case <-time.After(time.Minute):
	}
	mu.Lock()
	defer mu.Unlock()
	t.Fatalf("shardsrv did not start serving:\n%s", strings.Join(logTail, "\n"))
	return "", 0
}

// procStatus reads a field of /proc/PID/status in bytes (VmHWM, VmRSS).
func procStatus(t *testing.T, pid int, field string) int64 {
	t.Helper()
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/status", pid))
	if err != nil {
		t.Fatal(err)
	}
	for line := range strings.SplitSeq(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, field+":"); ok {
			kb, err := strconv.ParseInt(strings.TrimSpace(strings.TrimSuffix(strings.TrimSpace(rest), "kB")), 10, 64)
			if err != nil {
				t.Fatalf("%s: %q", field, line)
			}
			return kb << 10
		}
	}
	t.Fatalf("no %s in /proc/%d/status", field, pid)
	return 0
}

// manyColumnBlocks is a [2, n] tensor tiled by n one-column blocks over w, one box over all of it:
// a table as many blocks as fit in the body limit.
func manyColumnBlocks(n int) []byte {
	var b bytes.Buffer
	fmt.Fprintf(
		&b,
		`{"checkpoint":"big","tensors":[{"name":"cols","dtype":"BF16","shape":[2,%d],"boxes":[{"offsets":[0,0],`+
			`"lengths":[2,%d]}],"blocks":[`,
		n,
		n,
	)
	for i := range n {
		if i > 0 {
			b.WriteByte(',')
		}
		fmt.Fprintf(
			&b,
			`{"offsets":[0,%d],"lengths":[2,1],"source":"w","base":[0,%d],"coeff":[[1,0],[0,1]]}`,
			i,
			i%8192,
		)
	}
	b.WriteString(`]}]}`)
	return b.Bytes()
}

// Concurrent requests that each want a huge plan — tables of as many blocks as the body limit
// takes, a 2-byte source broadcast into a 1 TiB tensor, a full transpose of a 256 MiB tensor —
// keep the process's peak RSS (VmHWM) under --memory-bytes plus a fixed overhead: plans are
// charged to the budget while they are built, so the ones that do not fit wait or get 503.
func TestConcurrentHugePlansKeepVmHWMUnderBudget(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads VmHWM from /proc")
	}
	dir := t.TempDir()
	sparseCheckpoint(t, dir)
	url, pid := startShardsrv(
		t,
		dir,
		"--memory-bytes",
		strconv.Itoa(memBudget),
		"--max-plan-bytes",
		strconv.Itoa(memMaxPlan),
		"--max-body-bytes",
		strconv.Itoa(memMaxBody),
		"--admit-wait",
		"3s",
	)
	idle := procStatus(t, pid, "VmRSS")

	blocks := manyColumnBlocks(150_000)
	if len(blocks) > memMaxBody || len(blocks) < memMaxBody*3/4 {
		t.Fatalf("the many-block table is %d bytes, not near the %d-byte body limit", len(blocks), memMaxBody)
	}
	broadcast := []byte(
		`{"checkpoint":"big","tensors":[{"name":"b","dtype":"BF16","shape":[549755813888],"boxes":[{"offsets":[0],` +
			`"lengths":[549755813888]}],
		"blocks":[{"offsets":[0],"lengths":[549755813888],"source":"n","base":[0],"coeff":[[0]]}]}]}`,
	)
	transpose := []byte(
		`{"checkpoint":"big","tensors":[{"name":"wT","dtype":"BF16","shape":[8192,16384],"boxes":[{"offsets":[0,0],` +
			`"lengths":[8192,16384]}],
		"blocks":[{"offsets":[0,0],"lengths":[8192,16384],"source":"w","base":[0,0],"coeff":[[0,1],[1,0]]}]}]}`,
	)
	type shot struct {
		name, path string
		body       []byte
	}
	volley := []shot{
		{"blocks", "/v1/plan", blocks}, {"blocks", "/v1/plan", blocks}, {"blocks", "/v1/shards", blocks},
		{"broadcast", "/v1/plan", broadcast}, {"broadcast", "/v1/shards", broadcast},
		{
			"transpose",
			"/v1/plan",
			transpose,
		}, {"transpose", "/v1/shards", transpose}, {"transpose", "/v1/plan", transpose},
	}
	client := &http.Client{Timeout: 60 * time.Second}
	statuses := map[string][]string{}
	var mu sync.Mutex
	for round := range 1 {
		var wg sync.WaitGroup
		for _, s := range volley {
			wg.Go(func() {
				start := time.Now()
				ctx, cancel := context.WithCancel(context.Background())
				defer cancel()
				req, _ := http.NewRequestWithContext(ctx, "POST", url+s.path, bytes.NewReader(s.body))
				req.Header.Set("Content-Type", "application/json")
				res, err := client.Do(req)
				if err != nil {
					t.Errorf("round %d, %s to %s: %v", round, s.name, s.path, err)
					return
				}
				defer res.Body.Close()
				// A plan is read whole; a stream for 4 MiB (its window of buffers is full by then), then dropped.
				limit := int64(1 << 30)
				if s.path == "/v1/shards" {
					limit = 4 << 20
				}
				n, _ := io.Copy(io.Discard, io.LimitReader(res.Body, limit))
				if res.StatusCode >= 500 && res.StatusCode != 503 && res.StatusCode != 504 ||
					res.StatusCode == 200 && s.path == "/v1/shards" && n == 0 {
					t.Errorf("round %d, %s to %s: %d after %d bytes", round, s.name, s.path, res.StatusCode, n)
				}
				mu.Lock()
				statuses[s.name+" "+s.path] = append(
					statuses[s.name+" "+s.path],
					fmt.Sprintf("%d in %v", res.StatusCode, time.Since(start).Round(time.Millisecond)),
				)
				mu.Unlock()
			})
		}
		wg.Wait()
	}
	hwm := procStatus(t, pid, "VmHWM")
	t.Logf("statuses: %v", statuses)
	t.Logf("VmHWM %d MiB (idle VmRSS %d MiB) with --memory-bytes %d MiB; the bound is %d MiB",
		hwm>>20, idle>>20, memBudget>>20, (memBudget+memOverhead)>>20)
	if hwm > memBudget+memOverhead {
		t.Errorf("VmHWM %d MiB is over --memory-bytes %d MiB + %d MiB", hwm>>20, memBudget>>20, memOverhead>>20)
	}
}
