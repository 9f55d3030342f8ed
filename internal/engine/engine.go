// Package engine builds the tensors table an inference engine's rank holds, from a checkpoint's
// config.json and tensor headers. The table is an ordinary shard request (api.TensorRequest), so
// everything downstream — planner, executor, formats — serves it like one a client wrote.
//
// Each destination tensor is one parameter of the rank, named as the engine names it, with the
// rank's own parameter shape as its shape and one box covering it: what vLLM's ShardedStateLoader
// saves for the rank, byte for byte. The rules come from the engine's source; each architecture
// file cites the rule beside the code. What differs between the engine's release lines is data
// beside the rules (versions.go); docs/engines.md says what each line covers and what it does not.
//
// Adding an architecture is one file: a function over a *model and a register call.
package engine

import (
	"encoding/json"
	"fmt"
	"slices"
	"sort"
	"strings"
	"unicode/utf8"

	"github.com/shardsrv/shardsrv/api"
)

// Parallel is the rank a layout is built for: its place in the tensor-, prefill-context- and
// data-parallel groups, and how a MoE layer's experts go over ranks: spread whole (expert
// parallelism) or split like other weights, with EPLB's redundant experts and the placement.
type Parallel struct {
	TP, TPRank int64
	// PCP is prefill-context parallelism: its ranks hold the same attention and dense weights and
	// join the MoE group. Zero means 1.
	PCP, PCPRank   int64
	DP, DPRank     int64
	ExpertParallel bool
	// EPLB is the expert-parallel load balancer, RedundantExperts its num_redundant_experts: extra
	// physical experts, slot E+j holding logical expert j.
	EPLB             bool
	RedundantExperts int64
	// Placement is expert_placement_strategy: "linear" (empty means it) or "round_robin".
	Placement string
	// DPAttention is SGLang's --enable-dp-attention: with DP > 1 the attention of the models that
	// support it splits over TP / DP ranks, the data-parallel groups sharing one TP group.
	DPAttention bool
	// EP is SGLang's --ep-size: the MoE layers' expert-parallel size within the TP group. Zero
	// means 1.
	EP int64
}

// An option is a layout field beyond tensor_parallel_size and tp_rank; set reports whether a
// request gives it other than its default. Each engine takes the options its engine has (takes),
// and a request that sets another is refused rather than silently ignored.
type option struct {
	field string
	set   func(Parallel) bool
}

var (
	dataParallel         = option{"data_parallel_size", func(p Parallel) bool { return p.DP > 1 }}
	dataParallelRank     = option{"dp_rank", func(p Parallel) bool { return p.DPRank > 0 }}
	enableExpertParallel = option{"enable_expert_parallel", func(p Parallel) bool { return p.ExpertParallel }}
	prefillContext       = option{"prefill_context_parallel_size", func(p Parallel) bool { return p.PCP > 1 }}
	prefillContextRank   = option{"pcp_rank", func(p Parallel) bool { return p.PCPRank > 0 }}
	enableEPLB           = option{"enable_eplb", func(p Parallel) bool { return p.EPLB }}
	redundantExperts     = option{"num_redundant_experts", func(p Parallel) bool { return p.RedundantExperts > 0 }}
	expertPlacement      = option{"expert_placement_strategy", func(p Parallel) bool { return p.Placement == "round_robin" }}
	enableDPAttention    = option{"enable_dp_attention", func(p Parallel) bool { return p.DPAttention }}
	expertParallelSize   = option{"expert_parallel_size", func(p Parallel) bool { return p.EP > 1 }}
	allOptions           = []option{dataParallel, dataParallelRank, enableExpertParallel, prefillContext,
		prefillContextRank, enableEPLB, redundantExperts, expertPlacement, enableDPAttention, expertParallelSize}
	engineOptions = map[string][]option{}
)

// takes declares the options an engine's layouts read.
func takes(engine string, opts ...option) {
	engineOptions[engine] = append(engineOptions[engine], opts...)
}

// checkOptions refuses an option the engine does not have.
func checkOptions(engine string, p Parallel) error {
	taken := engineOptions[engine]
	for _, o := range allOptions {
		if !o.set(p) || slices.ContainsFunc(taken, func(t option) bool { return t.field == o.field }) {
			continue
		}
		fields := make([]string, len(taken))
		for i, t := range taken {
			fields[i] = t.field
		}
		return &Error{"/layout/" + o.field, fmt.Sprintf("%s layouts do not take %s; they take %s",
			engine, o.field, strings.Join(append([]string{"tensor_parallel_size", "tp_rank"}, fields...), ", "))}
	}
	return nil
}

// Spec is a layout request.
type Spec struct {
	Engine string
	// Version is the engine's release line; empty means the newest the server lays out.
	Version string
	Parallel
	// DType is the dtype the engine runs in; empty means the checkpoint's torch_dtype.
	DType api.DType
}

// TensorInfo is what a layout needs of a checkpoint tensor.
type TensorInfo struct {
	DType string
	Shape []int64
}

// Error is a layout that cannot be built. Pointer points into the request body (for example
// /layout/tensor_parallel_size) when the request is at fault, and is empty when the checkpoint is.
type Error struct {
	Pointer string
	Detail  string
}

func (e *Error) Error() string {
	if e.Pointer == "" {
		return e.Detail
	}
	return e.Pointer + ": " + e.Detail
}

// checkpointError is a layout the checkpoint itself cannot take (a missing tensor or config key,
// shapes that disagree): no request field is at fault.
func checkpointError(format string, args ...any) *Error {
	return &Error{Detail: fmt.Sprintf(format, args...)}
}

// architecture lays out one model class.
type architecture func(m *model) error

var engines = map[string]map[string]architecture{}

// declined are architectures an engine runs that are deliberately not laid out here, each with
// the reason, which a request for one is told.
var declined = map[string]map[string]string{}

func decline(engine, why string, archs ...string) {
	if declined[engine] == nil {
		declined[engine] = map[string]string{}
	}
	for _, a := range archs {
		declined[engine][a] = why
	}
}

func register(engine string, build architecture, archs ...string) {
	if engines[engine] == nil {
		engines[engine] = map[string]architecture{}
	}
	for _, a := range archs {
		engines[engine][a] = build
	}
}

// Engines lists the engines and, for each, the architectures it lays out (sorted).
func Engines() map[string][]string {
	out := map[string][]string{}
	for e, archs := range engines {
		for a := range archs {
			out[e] = append(out[e], a)
		}
		sort.Strings(out[e])
	}
	return out
}

// Table is a built layout: the tensors the rank holds, in the engine's parameter order, and the
// release line whose rules they follow (empty for an unversioned engine).
type Table struct {
	Version string
	Tensors []api.TensorRequest
}

// Build lays out the rank.
func Build(spec Spec, config []byte, tensors map[string]TensorInfo) (*Table, error) {
	archs, ok := engines[spec.Engine]
	if !ok {
		return nil, &Error{
			"/layout/engine",
			fmt.Sprintf("unknown engine %q; this server lays out %s", spec.Engine, names(engines)),
		}
	}
	if spec.PCP == 0 {
		spec.PCP = 1
	}
	if spec.EP == 0 {
		spec.EP = 1
	}
	if err := spec.Parallel.check(); err != nil {
		return nil, err
	}
	if err := checkOptions(spec.Engine, spec.Parallel); err != nil {
		return nil, err
	}
	cfg, err := parseConfig(config)
	if err != nil {
		return nil, err
	}
	arch := cfg.architecture()
	build, ok := archs[arch]
	if why, no := declined[spec.Engine][arch]; no {
		return nil, &Error{"/layout/engine", fmt.Sprintf("%s on %s is not laid out here: %s", arch, spec.Engine, why)}
	}
	if !ok {
		return nil, &Error{
			"/layout/engine",
			fmt.Sprintf("the checkpoint's architecture %q has no %s layout here; supported: %s",
				arch, spec.Engine, strings.Join(Engines()[spec.Engine], ", ")),
		}
	}
	rel, err := lookupRelease(spec.Engine, spec.Version, arch)
	if err != nil {
		return nil, err
	}
	if err := rel.checkParallel(spec.Engine, arch, spec.Parallel); err != nil {
		return nil, err
	}
	m := &model{cfg: cfg, tensors: tensors, par: spec.Parallel, rel: rel}
	m.attention, m.embedding = m.tp(), m.tp()
	if m.dtype, err = cfg.dtype(spec.DType); err != nil {
		return nil, err
	}
	if err := m.readQuantization(); err != nil {
		return nil, err
	}
	if err := build(m); err != nil {
		return nil, err
	}
	return &Table{Version: rel.version, Tensors: m.out}, nil
}

func names[V any](m map[string]V) string {
	var out []string
	for k := range m {
		out = append(out, fmt.Sprintf("%q", k))
	}
	sort.Strings(out)
	return strings.Join(out, ", ")
}

// config is a Hugging Face config.json.
type config map[string]any

func parseConfig(b []byte) (config, error) {
	// encoding/json would turn invalid UTF-8 into U+FFFD: a config.json Hugging Face's own loader
	// (json.load of the text) refuses would be read as something else.
	if !utf8.Valid(b) {
		return nil, checkpointError("config.json is not UTF-8")
	}
	if err := checkConfigShape(b); err != nil {
		return nil, err
	}
	var c config
	if err := json.Unmarshal(b, &c); err != nil {
		return nil, checkpointError("config.json is not a JSON object: %v", err)
	}
	return c, nil
}

func (c config) architecture() string {
	if a, ok := c["architectures"].([]any); ok && len(a) > 0 {
		if s, ok := a[0].(string); ok {
			return s
		}
	}
	return ""
}

// has reports whether key is set and not null.
func (c config) has(key string) bool { return c[key] != nil }

// int reads an integer field; missing or null fields take def, or are an error when def < 0.
func (c config) int(key string, def int64) (int64, error) {
	v, ok := c[key]
	if !ok || v == nil {
		if def < 0 {
			return 0, configError(key, "is missing")
		}
		return def, nil
	}
	return configInt(key, v)
}

func (c config) bool(key string) bool {
	b, _ := c[key].(bool)
	return b
}

func (c config) str(key string) string {
	s, _ := c[key].(string)
	return s
}

func (c config) ints(key string) ([]int64, error) { return intList(key, c[key]) }

// intList reads a list of integers at ptr (a JSON pointer into config.json, without the leading
// slash); anything but a list is none.
func intList(ptr string, v any) ([]int64, error) {
	raw, _ := v.([]any)
	out := make([]int64, len(raw))
	for i, v := range raw {
		var err error
		if out[i], err = configInt(fmt.Sprintf("%s/%d", ptr, i), v); err != nil {
			return nil, err
		}
	}
	return out, nil
}

var torchDTypes = map[string]api.DType{
	"bfloat16": api.BF16,
	"float16":  api.F16,
	"half":     api.F16,
	"float32":  api.F32,
	"float":    api.F32,
}

// dtype is the dtype the engine holds unquantized weights in: the request's, else the config's
// torch_dtype (newer configs call it dtype).
func (c config) dtype(requested api.DType) (api.DType, error) {
	if requested != "" {
		switch requested {
		case api.BF16, api.F16, api.F32:
			return requested, nil
		}
		return "", &Error{"/layout/dtype", fmt.Sprintf("an engine runs in BF16, F16 or F32, not %s", requested)}
	}
	name := c.str("torch_dtype")
	if name == "" {
		name = c.str("dtype")
	}
	if d, ok := torchDTypes[name]; ok {
		return d, nil
	}
	return "", &Error{
		"/layout/dtype",
		fmt.Sprintf("config.json's torch_dtype is %q; name the dtype the engine runs in", name),
	}
}
