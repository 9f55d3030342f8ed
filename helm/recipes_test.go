package chart_test

import (
	"bytes"
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"runtime"
	"slices"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

// The documented deployment, run: the chart's Deployment serves from a local store exactly as its
// container would start in the image, and every init container of the chart README's pod examples
// runs its command line against that server, with the image's entrypoint. Only what a test cannot
// have is swapped: the server's address and the volumes' mount paths (temporary directories), and
// the README's checkpoint is the example checkpoint under the README's name.
func TestReadmeRecipesRunAgainstTheBinary(t *testing.T) {
	helmBinary(t)
	bin := buildBinary(t)
	entrypoint, cmd := imageCommand(t)
	appVersion := chartAppVersion(t)

	pods := readmePods(t)
	if len(pods) < 2 {
		t.Fatalf("the chart README has %d pod examples, want the sharded_state and the plugin one", len(pods))
	}
	checkpoint := ""
	for _, pod := range pods {
		for _, c := range pod.InitContainers {
			checkpoint = flagValue(c.Args, "--checkpoint")
		}
	}
	store := t.TempDir()
	if out, err := exec.Command(bin, "example", "--out", store).CombinedOutput(); err != nil {
		t.Fatalf("example: %v\n%s", err, out)
	}
	if err := os.Rename(filepath.Join(store, "qwen2-moe-tiny"), filepath.Join(store, checkpoint)); err != nil {
		t.Fatal(err)
	}

	port := freePort(t)
	r := render(t, "--set", "store.url=file://"+store, "--set", fmt.Sprintf("service.port=%d", port))
	serveC := r.deployment.Spec.Template.Spec.Containers[0]
	if serveC.Image != "shardsrv:"+appVersion {
		t.Errorf("the chart runs image %s, want the appVersion's tag", serveC.Image)
	}
	server := exec.Command(bin, containerArgv(t, serveC, entrypoint, cmd)[1:]...)
	server.Env = []string{}
	for _, e := range serveC.Env {
		if e.ValueFrom == nil {
			server.Env = append(server.Env, e.Name+"="+e.Value)
		}
	}
	var serverLog bytes.Buffer
	server.Stdout, server.Stderr = &serverLog, &serverLog
	if err := server.Start(); err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { server.Process.Kill(); server.Wait() })
	url := fmt.Sprintf("http://localhost:%d", port)
	waitReady(t, url+"/readyz", &serverLog)

	for i, pod := range pods {
		mounts := map[string]string{} // volume name → the directory standing in for it
		for _, v := range pod.Volumes {
			mounts[v.Name] = t.TempDir()
		}
		for _, c := range pod.InitContainers {
			repo, tag, _ := strings.Cut(c.Image, ":")
			if repo != "shardsrv" {
				continue
			}
			if tag != appVersion {
				t.Errorf("pod %d: %s runs image tag %q, the chart's appVersion is %q", i, c.Name, tag, appVersion)
			}
			argv := containerArgv(t, c, entrypoint, cmd)
			for j, a := range argv {
				if a == "http://shardsrv:8080" {
					argv[j] = url
				}
				for _, m := range c.VolumeMounts {
					if a == m.MountPath {
						argv[j] = mounts[m.Name]
					}
				}
			}
			out, err := exec.Command(bin, argv[1:]...).CombinedOutput()
			if err != nil {
				t.Fatalf("pod %d: %s: %v: %v\n%s", i, c.Name, argv, err, out)
			}
		}
		checkEngineDirectory(t, i, pod, mounts)
	}
}

// checkEngineDirectory checks that the engine container's --model is a volume an init container
// wrote, holding what its --load-format reads: config.json, and the rank files for sharded_state
// or no weights at all for the plugin.
func checkEngineDirectory(t *testing.T, i int, pod corev1.PodSpec, mounts map[string]string) {
	t.Helper()
	for _, c := range pod.Containers {
		model := flagValue(c.Args, "--model")
		dir := ""
		for _, m := range c.VolumeMounts {
			if m.MountPath == model {
				dir = mounts[m.Name]
			}
		}
		if dir == "" {
			t.Errorf("pod %d: %s loads --model %s, which no volume holds", i, c.Name, model)
			continue
		}
		var names []string
		entries, _ := os.ReadDir(dir)
		for _, e := range entries {
			names = append(names, e.Name())
		}
		if !slices.Contains(names, "config.json") {
			t.Errorf("pod %d: %s has no config.json: %v", i, model, names)
		}
		var weights []string
		for _, n := range names {
			if strings.HasSuffix(n, ".safetensors") {
				weights = append(weights, n)
			}
		}
		var want []string
		if flagValue(c.Args, "--load-format") == "sharded_state" {
			var tp int
			fmt.Sscan(flagValue(c.Args, "--tensor-parallel-size"), &tp)
			for r := range tp {
				want = append(want, fmt.Sprintf("model-rank-%d-part-0.safetensors", r))
			}
		}
		if !slices.Equal(weights, want) {
			t.Errorf("pod %d: %s holds weights %v, %s wants %v", i, model, weights, c.Name, want)
		}
	}
}

func flagValue(args []string, name string) string {
	if i := slices.Index(args, name); i >= 0 && i+1 < len(args) {
		return args[i+1]
	}
	return ""
}

// containerArgv is what a container runs in the image, as Kubernetes builds it: command replaces
// the entrypoint (and the image's CMD), args replace the CMD.
func containerArgv(t *testing.T, c corev1.Container, entrypoint, cmd []string) []string {
	t.Helper()
	argv := slices.Concat(entrypoint, cmd)
	switch {
	case len(c.Command) > 0:
		argv = slices.Concat(c.Command, c.Args)
	case len(c.Args) > 0:
		argv = slices.Concat(entrypoint, c.Args)
	}
	if len(argv) == 0 || argv[0] != "/shardsrv" {
		t.Fatalf("%s runs %v, not the image's /shardsrv", c.Name, argv)
	}
	return argv
}

// imageCommand reads the Dockerfile's last ENTRYPOINT and CMD (the final stage's), exec form.
func imageCommand(t *testing.T) (entrypoint, cmd []string) {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join("..", "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	for _, line := range strings.Split(string(raw), "\n") {
		for prefix, into := range map[string]*[]string{"ENTRYPOINT ": &entrypoint, "CMD ": &cmd} {
			if rest, ok := strings.CutPrefix(line, prefix); ok {
				if err := json.Unmarshal([]byte(rest), into); err != nil {
					t.Fatalf("Dockerfile %q: not the exec form: %v", line, err)
				}
			}
		}
	}
	return entrypoint, cmd
}

func chartAppVersion(t *testing.T) string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chart, "Chart.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var c struct {
		AppVersion string `json:"appVersion"`
	}
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatal(err)
	}
	return c.AppVersion
}

// readmePods decodes, strictly, each YAML example of the chart README that is a pod spec.
func readmePods(t *testing.T) []corev1.PodSpec {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(chart, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	var pods []corev1.PodSpec
	for _, m := range regexp.MustCompile("(?s)```yaml\n(.*?)```").FindAllStringSubmatch(string(raw), -1) {
		var doc struct {
			Spec corev1.PodSpec `json:"spec"`
		}
		strict(t, []byte(m[1]), &doc)
		if len(doc.Spec.Containers) > 0 {
			pods = append(pods, doc.Spec)
		}
	}
	return pods
}

func buildBinary(t *testing.T) string {
	t.Helper()
	goBin, err := exec.LookPath("go")
	if err != nil {
		goBin = filepath.Join(runtime.GOROOT(), "bin", "go")
	}
	bin := filepath.Join(t.TempDir(), "shardsrv")
	build := exec.Command(goBin, "build", "-o", bin, "./cmd/shardsrv")
	build.Dir = ".."
	if out, err := build.CombinedOutput(); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return bin
}

func freePort(t *testing.T) int {
	t.Helper()
	l, err := net.Listen("tcp", "localhost:0")
	if err != nil {
		t.Fatal(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

func waitReady(t *testing.T, url string, log *bytes.Buffer) {
	t.Helper()
	deadline := time.Now().Add(time.Minute)
	for time.Now().Before(deadline) {
		if res, err := http.Get(url); err == nil {
			res.Body.Close()
			if res.StatusCode == http.StatusOK {
				return
			}
		}
		time.Sleep(100 * time.Millisecond)
	}
	t.Fatalf("the server never became ready at %s:\n%s", url, log)
}
