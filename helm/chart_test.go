// Package chart_test checks the Helm chart: it lints, renders with the default and with every
// option on, and every manifest it renders decodes strictly into the Kubernetes API types.
package chart_test

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	appsv1 "k8s.io/api/apps/v1"
	autoscalingv2 "k8s.io/api/autoscaling/v2"
	corev1 "k8s.io/api/core/v1"
	policyv1 "k8s.io/api/policy/v1"
	"sigs.k8s.io/yaml"
)

const chart = "shardsrv"

// helmBinary finds helm: the module's .tools/bin, then PATH; the test skips without it unless
// SHARDSRV_REQUIRE_HELM is set, as 'make test' does.
func helmBinary(t *testing.T) string {
	t.Helper()
	bin := filepath.Join("..", ".tools", "bin", "helm")
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

func helm(t *testing.T, args ...string) string {
	t.Helper()
	var out, errb bytes.Buffer
	cmd := exec.Command(helmBinary(t), args...)
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		t.Fatalf("helm %v: %v\n%s%s", args, err, out.String(), errb.String())
	}
	return out.String()
}

// rendered is what helm template produced, decoded strictly by kind.
type rendered struct {
	deployment     *appsv1.Deployment
	service        *corev1.Service
	peers          *corev1.Service // the headless Service the replicas find each other through
	secret         *corev1.Secret
	serviceAccount *corev1.ServiceAccount
	hpa            *autoscalingv2.HorizontalPodAutoscaler
	pdb            *policyv1.PodDisruptionBudget
	serviceMonitor *monitoringv1.ServiceMonitor
	certificate    map[string]any // cert-manager's, decoded loosely: its types are not a dependency
}

func strict(t *testing.T, doc []byte, into any) {
	t.Helper()
	js, err := yaml.YAMLToJSON(doc)
	if err != nil {
		t.Fatal(err)
	}
	dec := json.NewDecoder(bytes.NewReader(js))
	dec.DisallowUnknownFields()
	if err := dec.Decode(into); err != nil {
		t.Fatalf("%T: %v\n%s", into, err, doc)
	}
}

func render(t *testing.T, args ...string) rendered {
	out := helm(t, append([]string{"template", "rel", chart, "--namespace", "ml"}, args...)...)
	var r rendered
	for _, doc := range strings.Split(out, "\n---") {
		var head struct{ Kind string }
		if err := yaml.Unmarshal([]byte(doc), &head); err != nil {
			t.Fatal(err)
		}
		switch head.Kind {
		case "":
		case "Deployment":
			r.deployment = &appsv1.Deployment{}
			strict(t, []byte(doc), r.deployment)
		case "Service":
			svc := &corev1.Service{}
			strict(t, []byte(doc), svc)
			if strings.HasSuffix(svc.Name, "-peers") {
				r.peers = svc
			} else {
				r.service = svc
			}
		case "Secret":
			r.secret = &corev1.Secret{}
			strict(t, []byte(doc), r.secret)
		case "ServiceAccount":
			r.serviceAccount = &corev1.ServiceAccount{}
			strict(t, []byte(doc), r.serviceAccount)
		case "HorizontalPodAutoscaler":
			r.hpa = &autoscalingv2.HorizontalPodAutoscaler{}
			strict(t, []byte(doc), r.hpa)
		case "PodDisruptionBudget":
			r.pdb = &policyv1.PodDisruptionBudget{}
			strict(t, []byte(doc), r.pdb)
		case "ServiceMonitor":
			r.serviceMonitor = &monitoringv1.ServiceMonitor{}
			strict(t, []byte(doc), r.serviceMonitor)
		case "Certificate":
			if err := yaml.Unmarshal([]byte(doc), &r.certificate); err != nil {
				t.Fatal(err)
			}
		default:
			t.Errorf("unexpected kind %s", head.Kind)
		}
	}
	if r.deployment == nil || r.service == nil {
		t.Fatal("no Deployment or Service rendered")
	}
	return r
}

func env(c corev1.Container, name string) *corev1.EnvVar {
	for i := range c.Env {
		if c.Env[i].Name == name {
			return &c.Env[i]
		}
	}
	return nil
}

func volume(pod corev1.PodSpec, name string) *corev1.Volume {
	for i := range pod.Volumes {
		if pod.Volumes[i].Name == name {
			return &pod.Volumes[i]
		}
	}
	return nil
}

func TestLint(t *testing.T) {
	helm(t, "lint", chart)
	helm(t, "lint", chart, "-f", "shardsrv/ci/all-options-values.yaml")
}

func TestDefaults(t *testing.T) {
	r := render(t)
	pod := r.deployment.Spec.Template.Spec
	c := pod.Containers[0]
	if sc := c.SecurityContext; sc == nil || !*sc.ReadOnlyRootFilesystem || *sc.AllowPrivilegeEscalation ||
		!slices.Contains(sc.Capabilities.Drop, "ALL") {
		t.Errorf("container security context %+v", c.SecurityContext)
	}
	if !*pod.SecurityContext.RunAsNonRoot || *pod.SecurityContext.RunAsUser == 0 {
		t.Error("the pod must run as non-root")
	}
	if c.LivenessProbe.HTTPGet.Path != "/healthz" || c.ReadinessProbe.HTTPGet.Path != "/readyz" ||
		c.ReadinessProbe.TimeoutSeconds <= 5 || env(c, "SHARDSRV_READY_STORE_GRACE").Value != "30s" {
		t.Error("probes: /readyz's store check takes up to 5 s, and the store grace is passed on")
	}
	if env(c, "SHARDSRV_STORE").Value != "s3://models" || env(c, "SHARDSRV_SHUTDOWN_GRACE").Value != "25s" ||
		env(c, "SHARDSRV_DRAIN_DELAY").Value != "5s" ||
		*pod.TerminationGracePeriodSeconds <= 5+25 {
		t.Errorf("store, drain delay and grace: %+v", c.Env)
	}
	for _, name := range []string{"SHARDSRV_BODY_TIMEOUT", "SHARDSRV_CACHE_BYTES", "SHARDSRV_S3_MAX_IN_FLIGHT"} {
		if env(c, name) != nil {
			t.Errorf("%s is set by default: tunables left unset take shardsrv's own defaults", name)
		}
	}
	if c.Resources.Limits.Memory().IsZero() || len(pod.TopologySpreadConstraints) == 0 ||
		pod.TopologySpreadConstraints[0].LabelSelector == nil {
		t.Error("resources and topology spread")
	}
	if r.hpa != nil || r.pdb != nil || r.serviceMonitor != nil || r.peers != nil || r.secret != nil ||
		env(c, "SHARDSRV_PEERS_DNS") != nil || env(c, "AWS_SECRET_ACCESS_KEY") != nil ||
		env(c, "SHARDSRV_AUTH_TOKENS_FILE") != nil {
		t.Error("optional parts are off by default")
	}
}

func TestAllOptions(t *testing.T) {
	r := render(t, "-f", "shardsrv/ci/all-options-values.yaml")
	pod := r.deployment.Spec.Template.Spec
	c := pod.Containers[0]
	if r.hpa == nil || r.hpa.Spec.MaxReplicas != 20 || r.deployment.Spec.Replicas != nil {
		t.Error("HPA replaces replicas")
	}
	if r.pdb == nil || r.pdb.Spec.MinAvailable.IntValue() != 2 || r.serviceMonitor == nil ||
		r.serviceMonitor.Spec.Endpoints[0].Path != "/metrics" {
		t.Error("PDB and ServiceMonitor")
	}
	if r.serviceAccount.Annotations["eks.amazonaws.com/role-arn"] == "" || pod.ServiceAccountName != "shardsrv-reader" {
		t.Error("IRSA annotations on the service account")
	}
	if e := env(c, "AWS_SECRET_ACCESS_KEY"); e == nil || e.ValueFrom.SecretKeyRef.Name != "shardsrv-s3" ||
		e.ValueFrom.SecretKeyRef.Key != "secret-key" {
		t.Error("static S3 credentials come from the Secret")
	}
	if e := env(c, "SHARDSRV_AUTH_TOKENS_FILE"); e == nil || e.Value != "/etc/shardsrv/auth/tokens.txt" ||
		volume(pod, "auth") == nil || volume(pod, "auth").Secret.SecretName != "shardsrv-tokens" {
		t.Error("auth tokens are mounted from the Secret")
	}
	if e := env(c, "SHARDSRV_TRUST_KEY"); e == nil || e.Value != "/etc/shardsrv/trust/acme.pub.pem" ||
		env(c, "SHARDSRV_VERIFY").Value != "required" || volume(pod, "trust") == nil ||
		volume(pod, "trust").ConfigMap.Name != "model-publishers" {
		t.Error("verification is required with the trusted key mounted from the ConfigMap")
	}
	if env(c, "SHARDSRV_S3_ENDPOINT").Value != "http://minio.storage.svc:9000" ||
		env(c, "SHARDSRV_CACHE_BYTES").Value != "2147483648" ||
		env(c, "OTEL_EXPORTER_OTLP_ENDPOINT") == nil {
		t.Error("store, cache and OTel settings")
	}
	if r.service.Spec.Ports[0].Port != 9090 || c.Ports[0].ContainerPort != 9090 {
		t.Error("ports")
	}
}

func TestRefusesAShortTerminationGrace(t *testing.T) {
	bin := helmBinary(t)
	out, err := exec.Command(bin, "template", "rel", chart, "--set", "terminationGracePeriodSeconds=10").
		CombinedOutput()
	if err == nil || !strings.Contains(string(out), "terminationGracePeriodSeconds must be longer") {
		t.Errorf("a grace period shorter than the shutdown grace must be refused: %s", out)
	}
	// The pod's grace covers the drain delay and the shutdown grace together: 5 + 25 is not < 30.
	out, err = exec.Command(bin, "template", "rel", chart, "--set", "terminationGracePeriodSeconds=30").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "drainDelaySeconds + shutdownGraceSeconds") {
		t.Errorf("a grace period that does not cover drain delay + shutdown grace must be refused: %s", out)
	}
	out, err = exec.Command(bin, "template", "rel", chart, "--set", "verify.mode=required").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "verify.trustKey") {
		t.Errorf("verification required without a trusted key must be refused: %s", out)
	}
	out, err = exec.Command(bin, "template", "rel", chart, "--set", "store.url=ftp://x").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "store") {
		t.Errorf("values.schema.json must refuse a store URL shardsrv cannot open: %s", out)
	}
}

func TestGCSAndAzureStores(t *testing.T) {
	r := render(t, "--set", "store.url=gs://models/llama", "--set", "store.gcsEndpoint=http://fake-gcs:4443")
	c := r.deployment.Spec.Template.Spec.Containers[0]
	if env(c, "SHARDSRV_STORE").Value != "gs://models/llama" ||
		env(c, "SHARDSRV_GCS_ENDPOINT").Value != "http://fake-gcs:4443" {
		t.Errorf("a GCS store and its endpoint: %+v", c.Env)
	}
	r = render(t, "--set", "store.url=az://acct/models/llama", "--set", "azureCredentials.existingSecret=az",
		"--set", "azureCredentials.env=AZURE_STORAGE_KEY", "--set", "azureCredentials.key=account-key")
	c = r.deployment.Spec.Template.Spec.Containers[0]
	if e := env(c, "AZURE_STORAGE_KEY"); env(c, "SHARDSRV_STORE").Value != "az://acct/models/llama" || e == nil ||
		e.ValueFrom.SecretKeyRef.Name != "az" || e.ValueFrom.SecretKeyRef.Key != "account-key" {
		t.Errorf("an Azure store with its account key from a Secret: %+v", c.Env)
	}
	if env(c, "AZURE_STORAGE_CONNECTION_STRING") != nil {
		t.Error("only the credential the values name is set")
	}
}

// Replicas sharing one cache: a headless Service to find each other, the shared secret, and
// defaults that keep most of the cache up through a rollout.
func TestCluster(t *testing.T) {
	r := render(t, "--set", "cluster.enabled=true")
	pod := r.deployment.Spec.Template.Spec
	c := pod.Containers[0]
	if r.peers == nil || r.peers.Spec.ClusterIP != "None" || r.peers.Spec.PublishNotReadyAddresses {
		t.Fatal("a headless Service listing the ready replicas")
	}
	if e := env(c, "SHARDSRV_PEERS_DNS"); e == nil || e.Value != r.peers.Name+".ml.svc" {
		t.Errorf("--peers-dns names the headless Service: %+v", e)
	}
	if e := env(c, "SHARDSRV_ADVERTISE"); e == nil || e.Value != "http://$(POD_IP):8080" ||
		env(c, "POD_IP").ValueFrom.FieldRef.FieldPath != "status.podIP" {
		t.Errorf("--advertise is the pod's address: %+v", e)
	}
	if r.secret == nil || len(r.secret.Data["peer-token"]) < 32 || volume(pod, "peer") == nil ||
		volume(pod, "peer").Secret.SecretName != r.secret.Name ||
		env(c, "SHARDSRV_PEER_TOKEN_FILE").Value != "/etc/shardsrv/peer/peer-token" {
		t.Error("the peer secret is generated and mounted")
	}
	if r.pdb == nil || r.pdb.Spec.MaxUnavailable.IntValue() != 1 ||
		r.deployment.Spec.Strategy.RollingUpdate.MaxUnavailable.IntValue() != 0 ||
		pod.Affinity == nil || len(pod.Affinity.PodAntiAffinity.PreferredDuringSchedulingIgnoredDuringExecution) != 1 {
		t.Error("one replica down at a time, replicas on distinct nodes")
	}
	r = render(t, "-f", "shardsrv/ci/all-options-values.yaml")
	pod = r.deployment.Spec.Template.Spec
	c = pod.Containers[0]
	if r.secret != nil || volume(pod, "peer").Secret.SecretName != "shardsrv-peers" ||
		env(c, "SHARDSRV_PEER_TIMEOUT").Value != "3s" || env(c, "SHARDSRV_PEERS_DNS_REFRESH").Value != "5s" {
		t.Error("an existing peer Secret and the tunables")
	}
}

// shardsrv refuses to start replicas that share a cache without one: the chart refuses to render them.
func TestRefusesClusterWithoutCache(t *testing.T) {
	bin := helmBinary(t)
	for _, c := range []struct{ args, want string }{
		{"cluster.enabled=true,store.url=file:///data", "a file:// store needs cache.bytes"},
		{"cluster.enabled=true,cache.bytes=0", "cache.bytes must not be 0"},
	} {
		out, err := exec.Command(bin, "template", "rel", chart, "--set", c.args).CombinedOutput()
		if err == nil || !strings.Contains(string(out), c.want) {
			t.Errorf("%s: must be refused with %q: %s", c.args, c.want, out)
		}
	}
	r := render(t, "--set", "cluster.enabled=true,store.url=file:///data,cache.bytes=64Mi")
	if c := r.deployment.Spec.Template.Spec.Containers[0]; env(c, "SHARDSRV_CACHE_BYTES").Value != "64Mi" ||
		c.Args[0] != "serve" {
		t.Errorf("a file:// store with a cache shares it; the container runs serve: %v %+v", c.Args, c.Env)
	}
}

// HTTPS from a cert-manager Certificate: the key pair mounted and passed on, probes over HTTPS,
// peers reached over https:// trusting the Secret's ca.crt.
func TestTLS(t *testing.T) {
	r := render(t, "--set", "tls.enabled=true,tls.certManager.enabled=true,cluster.enabled=true",
		"--set", "tls.certManager.issuerRef.name=internal-ca,tls.certManager.issuerRef.kind=ClusterIssuer")
	pod := r.deployment.Spec.Template.Spec
	c := pod.Containers[0]
	spec, _ := r.certificate["spec"].(map[string]any)
	if spec == nil || spec["secretName"] != "rel-shardsrv-tls" || volume(pod, "tls") == nil ||
		volume(pod, "tls").Secret.SecretName != "rel-shardsrv-tls" {
		t.Fatalf("a Certificate whose Secret is mounted: %v", r.certificate)
	}
	if env(c, "SHARDSRV_TLS_CERT_FILE").Value != "/etc/shardsrv/tls/tls.crt" ||
		env(c, "SHARDSRV_TLS_KEY_FILE").Value != "/etc/shardsrv/tls/tls.key" ||
		env(c, "SHARDSRV_PEER_CA_FILE").Value != "/etc/shardsrv/tls/ca.crt" ||
		env(c, "SHARDSRV_ADVERTISE").Value != "https://$(POD_IP):8080" ||
		c.ReadinessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS || c.LivenessProbe.HTTPGet.Scheme != corev1.URISchemeHTTPS {
		t.Errorf("TLS files, peers over https and probes over HTTPS: %+v", c.Env)
	}
	// Peers are reached at pod addresses: the name their certificates are checked for is the
	// Service's, which the Certificate names, or tls.peerServerName, which the Certificate then
	// names too; an existing Secret's names are not the chart's to know, so only the value names one.
	names, _ := spec["dnsNames"].([]any)
	if e := env(c, "SHARDSRV_PEER_SERVER_NAME"); e == nil || e.Value != "rel-shardsrv.ml.svc" ||
		!slices.Contains(names, any(e.Value)) {
		t.Errorf("--peer-server-name is a name of the Certificate (%v): %+v", names, e)
	}
	r = render(t, "--set", "tls.enabled=true,tls.certManager.enabled=true,cluster.enabled=true",
		"--set", "tls.certManager.issuerRef.name=internal-ca,tls.peerServerName=peers.ml.example")
	spec, _ = r.certificate["spec"].(map[string]any)
	names, _ = spec["dnsNames"].([]any)
	if e := env(r.deployment.Spec.Template.Spec.Containers[0], "SHARDSRV_PEER_SERVER_NAME"); e == nil ||
		e.Value != "peers.ml.example" || !slices.Contains(names, any(e.Value)) || !slices.Contains(names, any("rel-shardsrv.ml.svc")) {
		t.Errorf("tls.peerServerName is --peer-server-name and a name of the Certificate (%v): %+v", names, e)
	}
	r = render(t, "--set", "tls.enabled=true,tls.existingSecret=mine,cluster.enabled=true")
	if c := r.deployment.Spec.Template.Spec.Containers[0]; env(c, "SHARDSRV_PEER_SERVER_NAME") != nil ||
		env(c, "SHARDSRV_PEER_CA_FILE") == nil {
		t.Errorf("with an existing Secret: its ca.crt and no name: %+v", c.Env)
	}
	r = render(t, "--set", "tls.enabled=true,tls.existingSecret=mine,cluster.enabled=true,tls.peerServerName=shardsrv.ml.svc")
	if c := r.deployment.Spec.Template.Spec.Containers[0]; env(c, "SHARDSRV_PEER_CA_FILE") == nil ||
		env(c, "SHARDSRV_PEER_SERVER_NAME") == nil || env(c, "SHARDSRV_PEER_SERVER_NAME").Value != "shardsrv.ml.svc" {
		t.Errorf("with an existing Secret and tls.peerServerName: its ca.crt and the name: %+v", c.Env)
	}
	out, err := exec.Command(helmBinary(t), "template", "rel", chart, "--set", "tls.enabled=true").CombinedOutput()
	if err == nil || !strings.Contains(string(out), "tls.existingSecret or tls.certManager.enabled") {
		t.Errorf("TLS without a key pair must be refused: %s", out)
	}
}

// The peer secret under GitOps: a tool that renders with helm template (no cluster to look the
// Secret up in) must see the same manifests on every sync, which an existing Secret gives — none
// is rendered and the pods mount it — while the generated one, which only an install or upgrade
// can keep (lookup), is new on every render: the case the chart's README sends to existingSecret.
func TestPeerSecretUnderGitOps(t *testing.T) {
	args := []string{"template", "rel", chart, "--namespace", "ml", "--set", "cluster.enabled=true"}
	existing := append(slices.Clone(args), "--set", "cluster.peerToken.existingSecret=peers")
	first, second := helm(t, existing...), helm(t, existing...)
	if first != second || strings.Contains(first, "kind: Secret") {
		t.Error("with cluster.peerToken.existingSecret two renders differ or render a Secret")
	}
	r := render(t, "--set", "cluster.enabled=true", "--set", "cluster.peerToken.existingSecret=peers")
	if v := volume(r.deployment.Spec.Template.Spec, "peer"); v == nil || v.Secret.SecretName != "peers" {
		t.Errorf("the existing Secret is mounted: %+v", v)
	}
	a, b := render(t, "--set", "cluster.enabled=true"), render(t, "--set", "cluster.enabled=true")
	if a.secret == nil || b.secret == nil || bytes.Equal(a.secret.Data["peer-token"], b.secret.Data["peer-token"]) {
		t.Error("without a cluster to look it up in, the generated secret is drawn anew on each render")
	}
}
