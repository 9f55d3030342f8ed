package vllmref

import (
	"encoding/json"
	"fmt"
)

// Refusal is an error RankAt returns (and a sibling reference such as sglangref panics with, from the
// torch operations below, which it shares): vLLM would refuse the configuration (an assertion, a
// ValueError, a torch narrow out of range), or the input is not a checkpoint the reference models.
type Refusal string

func (r Refusal) Error() string { return string(r) }

// HFConfig reads config.json the way the Hugging Face config object vLLM builds from it answers
// getattr: a key can be absent, present and null, or present with a value.
type HFConfig map[string]json.RawMessage

// ParseConfig reads config.json bytes, panicking with a Refusal when they are not JSON.
func ParseConfig(b []byte) HFConfig {
	var c HFConfig
	if err := json.Unmarshal(b, &c); err != nil {
		panic(Refusal("config.json: " + err.Error()))
	}
	return c
}

func (c HFConfig) Has(key string) bool { return c[key] != nil }

func (c HFConfig) IsNull(key string) bool { return string(c[key]) == "null" }

// Int is a required integer field.
func (c HFConfig) Int(key string) int64 {
	if !c.Has(key) || c.IsNull(key) {
		panic(Refusal("config.json lacks " + key))
	}
	var v int64
	if err := json.Unmarshal(c[key], &v); err != nil {
		panic(Refusal(fmt.Sprintf("config.json: %s: %v", key, err)))
	}
	return v
}

// IntOr is an integer field with the default its HF config class gives it.
func (c HFConfig) IntOr(key string, def int64) int64 {
	if !c.Has(key) || c.IsNull(key) {
		return def
	}
	return c.Int(key)
}

// NullableInt is a field whose null means something (DeepSeek's q_lora_rank: null selects q_proj).
// An absent key is refused rather than guessed: the HF classes disagree on its default.
func (c HFConfig) NullableInt(key string) (int64, bool) {
	if !c.Has(key) {
		panic(Refusal("config.json lacks " + key + " (give it, or null)"))
	}
	if c.IsNull(key) {
		return 0, false
	}
	return c.Int(key), true
}

func (c HFConfig) BoolOr(key string, def bool) bool {
	if !c.Has(key) || c.IsNull(key) {
		return def
	}
	var v bool
	if err := json.Unmarshal(c[key], &v); err != nil {
		panic(Refusal(fmt.Sprintf("config.json: %s: %v", key, err)))
	}
	return v
}

func (c HFConfig) StringOr(key, def string) string {
	if !c.Has(key) || c.IsNull(key) {
		return def
	}
	var v string
	if err := json.Unmarshal(c[key], &v); err != nil {
		panic(Refusal(fmt.Sprintf("config.json: %s: %v", key, err)))
	}
	return v
}

func (c HFConfig) IntsOr(key string) []int64 {
	if !c.Has(key) || c.IsNull(key) {
		return nil
	}
	var v []int64
	if err := json.Unmarshal(c[key], &v); err != nil {
		panic(Refusal(fmt.Sprintf("config.json: %s: %v", key, err)))
	}
	return v
}

func (c HFConfig) Architecture() string {
	var archs []string
	if err := json.Unmarshal(c["architectures"], &archs); err != nil || len(archs) == 0 {
		panic(Refusal("config.json has no architectures"))
	}
	return archs[0]
}

// ModelDType is the dtype of every unquantized parameter. vLLM's ModelConfig with dtype="auto"
// takes the config's torch_dtype (vllm/config: _get_and_verify_dtype) and builds the model under
// set_default_torch_dtype, so every torch.empty without a dtype is in it. Newer configs spell the
// key "dtype". float32 checkpoints are served in 16 bits by vLLM's "auto", which depends on the
// platform; the reference does not model that and refuses.
func (c HFConfig) ModelDType() string {
	dt := c.StringOr("torch_dtype", c.StringOr("dtype", ""))
	switch dt {
	case "bfloat16":
		return "BF16"
	case "float16":
		return "F16"
	}
	panic(Refusal(fmt.Sprintf("config.json torch_dtype %q: the reference models bfloat16 and float16 only", dt)))
}

// fp8Block reads quantization_config. Only the DeepSeek-V3 style block FP8 is modelled:
// quant_method "fp8", weight_block_size [block_n, block_k], activation_scheme "dynamic"
// (Fp8Config.from_config; Fp8LinearMethod.create_weights asserts dynamic for block quant).
func (c HFConfig) fp8Block() (bn, bk int64, ok bool) {
	if !c.Has("quantization_config") || c.IsNull("quantization_config") {
		return 0, 0, false
	}
	var q struct {
		QuantMethod         string   `json:"quant_method"`
		ActivationScheme    string   `json:"activation_scheme"`
		WeightBlockSize     []int64  `json:"weight_block_size"`
		IgnoredLayers       []string `json:"ignored_layers"`
		ModulesToNotConvert []string `json:"modules_to_not_convert"`
	}
	if err := json.Unmarshal(c["quantization_config"], &q); err != nil {
		panic(Refusal("config.json: quantization_config: " + err.Error()))
	}
	if q.QuantMethod != "fp8" || len(q.WeightBlockSize) != 2 {
		panic(
			Refusal(
				fmt.Sprintf(
					"quantization_config %s: the reference models block-wise fp8 only",
					c["quantization_config"],
				),
			),
		)
	}
	if q.ActivationScheme != "dynamic" {
		panic(Refusal("block fp8 needs activation_scheme dynamic (Fp8LinearMethod.create_weights asserts it)"))
	}
	if len(q.IgnoredLayers)+len(q.ModulesToNotConvert) > 0 {
		panic(Refusal("quantization_config ignored_layers: not modelled by the reference"))
	}
	if q.WeightBlockSize[0] <= 0 || q.WeightBlockSize[1] <= 0 {
		panic(Refusal("weight_block_size must be positive"))
	}
	return q.WeightBlockSize[0], q.WeightBlockSize[1], true
}
