package server_test

import (
	"bytes"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"runtime"
	"sort"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/shardsrv/shardsrv/internal/engine/vllmref"
	"github.com/shardsrv/shardsrv/internal/safetensors"
)

// metadataCheckpoint writes dir/NAME: the vllmref Mixtral's tensors and its config.json with a
// "_padding" key of the JSON value pad.
func metadataCheckpoint(t *testing.T, dir, name, pad string) {
	t.Helper()
	cfg, tensors := vllmref.Checkpoint("mixtral", 42)
	raw := append([]byte(`{"_padding":`+pad+`,`), cfg[1:]...)
	names := make([]string, 0, len(tensors))
	for n := range tensors {
		names = append(names, n)
	}
	sort.Strings(names)
	var data []safetensors.TensorData
	for _, n := range names {
		x := tensors[n]
		data = append(data, safetensors.TensorData{Name: n, DType: x.DType, Shape: x.Shape, Data: x.Data})
	}
	var buf bytes.Buffer
	if err := safetensors.Write(&buf, data, nil); err != nil {
		t.Fatal(err)
	}
	os.MkdirAll(filepath.Join(dir, name), 0o755)
	for file, b := range map[string][]byte{"config.json": raw, "model.safetensors": buf.Bytes()} {
		if err := os.WriteFile(filepath.Join(dir, name, file), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
}

// Eight concurrent layouts over checkpoints whose config.json is 60 MB — one long string, or 15
// million numbers — keep the process's peak RSS (VmHWM) under --memory-bytes plus the documented
// overhead: under the default --max-config-bytes each is a 422 naming the file before it is read;
// with --max-config-bytes raised past it, the string is read within a reservation of the budget
// (the ones that do not fit wait or get 503) and the numbers are refused by the parse limits.
func TestConcurrentLayoutsOverHugeConfigKeepVmHWMUnderBudget(t *testing.T) {
	if runtime.GOOS != "linux" {
		t.Skip("reads VmHWM from /proc")
	}
	const configBytes = 60_000_000
	dir := t.TempDir()
	metadataCheckpoint(t, dir, "long-string", `"`+strings.Repeat("a", configBytes)+`"`)
	metadataCheckpoint(t, dir, "many-numbers", "["+strings.Repeat("0,", configBytes/2)+"0]")
	for _, c := range []struct {
		name   string
		args   []string
		status map[string][]int // the statuses each checkpoint may answer
		detail map[string]string
	}{
		{
			"default limits", nil,
			map[string][]int{"long-string": {422}, "many-numbers": {422}},
			map[string]string{"long-string": "config.json is", "many-numbers": "config.json is"},
		},
		{
			"--max-config-bytes 64MiB", []string{"--max-config-bytes", "64MiB"},
			// In the volley, a config waits for its reservation and may find the budget spent
			// past --admit-wait (503, either checkpoint); alone afterwards, each gets its answer.
			map[string][]int{"long-string": {200, 503}, "many-numbers": {422, 503}},
			map[string]string{"many-numbers": "config.json holds more than"},
		},
	} {
		t.Run(c.name, func(t *testing.T) {
			args := append([]string{"--memory-bytes", strconv.Itoa(memBudget), "--admit-wait", "3s"}, c.args...)
			url, pid := startShardsrv(t, dir, args...)
			client := &http.Client{Timeout: 60 * time.Second}
			var wg sync.WaitGroup
			var mu sync.Mutex
			seen := map[string][]int{}
			for i := range 8 {
				ckpt := []string{"long-string", "many-numbers"}[i%2]
				if c.args != nil && i < 6 {
					ckpt = "long-string" // most of the volley at the reservations
				}
				wg.Go(func() {
					body := `{"checkpoint":"` + ckpt + `","layout":{"engine":"vllm","tensor_parallel_size":2}}`
					res, err := client.Post(url+"/v1/layouts", "application/json", strings.NewReader(body))
					if err != nil {
						t.Errorf("%s: %v", ckpt, err)
						return
					}
					got, _ := io.ReadAll(res.Body)
					res.Body.Close()
					mu.Lock()
					seen[ckpt] = append(seen[ckpt], res.StatusCode)
					mu.Unlock()
					ok := false
					for _, s := range c.status[ckpt] {
						ok = ok || s == res.StatusCode
					}
					if want := c.detail[ckpt]; !ok || res.StatusCode == 422 && !strings.Contains(string(got), want) {
						t.Errorf("%s: %d %.300s, want one of %v saying %q", ckpt, res.StatusCode, got, c.status[ckpt], want)
					}
				})
			}
			wg.Wait()
			// One at a time: what the volley may have answered 503 (retry: the budget was spent)
			// is then answered, a 503 only while the volley's last reservations are given back.
			for _, ckpt := range []string{"long-string", "many-numbers"} {
				want := map[bool]int{true: 200, false: 422}[ckpt == "long-string" && c.args != nil]
				for {
					body := `{"checkpoint":"` + ckpt + `","layout":{"engine":"vllm","tensor_parallel_size":2}}`
					res, err := client.Post(url+"/v1/layouts", "application/json", strings.NewReader(body))
					if err != nil {
						t.Fatalf("%s alone: %v", ckpt, err)
					}
					got, _ := io.ReadAll(res.Body)
					res.Body.Close()
					if res.StatusCode == http.StatusServiceUnavailable {
						continue
					}
					if res.StatusCode != want || want == 422 && !strings.Contains(string(got), c.detail[ckpt]) {
						t.Errorf("%s alone: %d %.300s, want %d saying %q", ckpt, res.StatusCode, got, want, c.detail[ckpt])
					}
					break
				}
			}
			hwm := procStatus(t, pid, "VmHWM")
			t.Logf("statuses %v; VmHWM %d MiB with --memory-bytes %d MiB; the bound is %d MiB",
				seen, hwm>>20, memBudget>>20, (memBudget+memOverhead)>>20)
			if hwm > memBudget+memOverhead {
				t.Errorf("VmHWM %d MiB is over --memory-bytes %d MiB + %d MiB", hwm>>20, memBudget>>20, memOverhead>>20)
			}
		})
	}
}
