package engine

import (
	"fmt"
	"math"

	"github.com/shardsrv/shardsrv/internal/tensor"
)

// The bounds every integer of a layout is held to where it enters the engine: the request's sizes
// and ranks (Parallel.check), every integer config.json field (config.int, config.ints) and every
// dimension of a checkpoint tensor a layout splits (model.shape). Each is far above what a real
// deployment or checkpoint has, and together they make every product the layout code forms fit
// int64 with room to spare: a rank (< 2^16) times a dimension (≤ 2^40) is under 2^56, and three
// config integers multiplied (heads × head_dim × groups) stay under 2^60. So no product below can
// wrap, and every divisor has been checked to be at least 1 before it is used. New fields and
// architectures read their integers through these same three doors.
const (
	// MaxRanks bounds tensor_parallel_size × prefill_context_parallel_size × data_parallel_size —
	// the ranks of one engine instance and of its flattened expert-parallel group. The largest vLLM deployments span hundreds of
	// GPUs; 65,536 leaves two orders of magnitude.
	MaxRanks = 1 << 16
	// MaxConfigInt bounds every integer read from config.json (layers, heads, head_dim, hidden and
	// intermediate sizes, expert counts, FP8 block sizes). The largest real values are
	// vocabularies of ~2^18 and intermediate sizes of ~2^16; 2^20 is sixteen times the former.
	MaxConfigInt = 1 << 20
	// MaxTensorDim bounds each dimension of a tensor a layout splits: 2^40 elements in one
	// dimension is a tebi-element row, past any tensor a checkpoint holds. Zero-length
	// dimensions are refused too: no weight a layout splits is empty, and they would be divisors.
	MaxTensorDim = 1 << 40
)

// check bounds the request's sizes and ranks. The product TP × PCP × DP is computed checked (every
// factor is bounded first, but the check does not lean on that).
func (p Parallel) check() error {
	switch {
	case p.TP < 1 || p.TP > MaxRanks:
		return &Error{"/layout/tensor_parallel_size", fmt.Sprintf("must be in [1, %d], got %d", MaxRanks, p.TP)}
	case p.TPRank < 0 || p.TPRank >= p.TP:
		return &Error{"/layout/tp_rank", fmt.Sprintf("rank %d is not in [0, %d)", p.TPRank, p.TP)}
	case p.PCP < 1 || p.PCP > MaxRanks:
		return &Error{"/layout/prefill_context_parallel_size", fmt.Sprintf("must be in [1, %d], got %d", MaxRanks, p.PCP)}
	case p.PCPRank < 0 || p.PCPRank >= p.PCP:
		return &Error{"/layout/pcp_rank", fmt.Sprintf("rank %d is not in [0, %d)", p.PCPRank, p.PCP)}
	case p.DP < 1 || p.DP > MaxRanks:
		return &Error{"/layout/data_parallel_size", fmt.Sprintf("must be in [1, %d], got %d", MaxRanks, p.DP)}
	case p.DPRank < 0 || p.DPRank >= p.DP:
		return &Error{"/layout/dp_rank", fmt.Sprintf("rank %d is not in [0, %d)", p.DPRank, p.DP)}
	case p.EP < 1 || p.EP > MaxRanks:
		return &Error{"/layout/expert_parallel_size", fmt.Sprintf("must be in [1, %d], got %d", MaxRanks, p.EP)}
	}
	world, ok := tensor.CheckedMul(p.TP, p.PCP)
	if ok {
		world, ok = tensor.CheckedMul(world, p.DP)
	}
	if !ok || world > MaxRanks {
		return &Error{"/layout/data_parallel_size", fmt.Sprintf(
			"tensor_parallel_size %d × prefill_context_parallel_size %d × data_parallel_size %d is over the %d ranks "+
				"one engine instance may have", p.TP, p.PCP, p.DP, MaxRanks)}
	}
	if p.RedundantExperts < 0 || p.RedundantExperts > MaxConfigInt {
		return &Error{"/layout/num_redundant_experts", fmt.Sprintf(
			"must be in [0, %d], got %d", MaxConfigInt, p.RedundantExperts)}
	}
	if p.Placement != "" && p.Placement != "linear" && p.Placement != "round_robin" {
		return &Error{"/layout/expert_placement_strategy", "must be \"linear\" or \"round_robin\""}
	}
	return nil
}

// configInt converts a config.json number to an integer in [0, MaxConfigInt], or says why not.
func configInt(key string, v any) (int64, error) {
	f, ok := v.(float64)
	if !ok || f != math.Trunc(f) || f < 0 || f > MaxConfigInt {
		return 0, configError(key, "is %v, not an integer in [0, %d]", v, MaxConfigInt)
	}
	return int64(f), nil
}

// configError is a config.json field the engine cannot take. It names the key as a JSON pointer
// into config.json; no request field is at fault, so the problem points at /layout.
func configError(key, format string, args ...any) *Error {
	return checkpointError("config.json /%s %s", key, fmt.Sprintf(format, args...))
}

// checkDims bounds the dimensions of a tensor a layout splits to [1, MaxTensorDim].
func checkDims(name string, shape []int64) error {
	for _, d := range shape {
		if d < 1 || d > MaxTensorDim {
			return checkpointError("%q has shape %v; a layout splits dimensions in [1, 2^40]", name, shape)
		}
	}
	return nil
}

// config.json is parsed within limits, so the memory it takes is bounded by its length: at most
// MaxConfigValues values (objects, arrays, strings, numbers, literals: the largest real configs
// have a few thousand), nested at most MaxConfigDepth deep (real ones nest four or five).
const (
	MaxConfigDepth  = 32
	MaxConfigValues = 1 << 16
	// configValueBytes is the most one decoded value takes beyond its string bytes: an interface,
	// a map entry or slice slot with its share of growth, a boxed float64.
	configValueBytes = 128
)

// ConfigMemory is the most memory Build holds for a config.json of n bytes, for the caller to
// reserve: the bytes, the strings decoded from them (no longer than they are), and the Go values
// of at most MaxConfigValues values.
func ConfigMemory(n int64) int64 { return 2*n + MaxConfigValues*configValueBytes }

// checkConfigShape refuses a config.json nested deeper than MaxConfigDepth or holding more than
// MaxConfigValues values, before it is decoded. It counts without parsing: every value but the
// first follows a comma or opens a container, so commas plus openings bound the values.
func checkConfigShape(b []byte) error {
	depth, values, inString := 0, 1, false
	for i := 0; i < len(b); i++ {
		c := b[i]
		if inString {
			switch c {
			case '\\':
				i++
			case '"':
				inString = false
			}
			continue
		}
		switch c {
		case '"':
			inString = true
		case '{', '[':
			if depth++; depth > MaxConfigDepth {
				return checkpointError("config.json nests deeper than %d levels", MaxConfigDepth)
			}
			values++
		case '}', ']':
			depth--
		case ',':
			values++
		}
		if values > MaxConfigValues {
			return checkpointError("config.json holds more than %d values", MaxConfigValues)
		}
	}
	return nil
}
