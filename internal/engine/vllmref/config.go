package vllmref

import (
	"encoding/json"
	"fmt"
)

// refusal is an error Rank returns: vLLM would refuse the configuration (an assertion, a
// ValueError, a torch narrow out of range), or the input is not a checkpoint the reference models.
type refusal string

func (r refusal) Error() string { return string(r) }

// hfConfig reads config.json the way the Hugging Face config object vLLM builds from it answers
// getattr: a key can be absent, present and null, or present with a value.
type hfConfig map[string]json.RawMessage

func parseConfig(b []byte) hfConfig {
	var c hfConfig
	if err := json.Unmarshal(b, &c); err != nil {
		panic(refusal("config.json: " + err.Error()))
	}
	return c
}

func (c hfConfig) has(key string) bool { return c[key] != nil }

func (c hfConfig) isNull(key string) bool { return string(c[key]) == "null" }

// int is a required integer field.
func (c hfConfig) int(key string) int64 {
	if !c.has(key) || c.isNull(key) {
		panic(refusal("config.json lacks " + key))
	}
	var v int64
	if err := json.Unmarshal(c[key], &v); err != nil {
		panic(refusal(fmt.Sprintf("config.json: %s: %v", key, err)))
	}
	return v
}

// intOr is an integer field with the default its HF config class gives it.
func (c hfConfig) intOr(key string, def int64) int64 {
	if !c.has(key) || c.isNull(key) {
		return def
	}
	return c.int(key)
}

// nullableInt is a field whose null means something (DeepSeek's q_lora_rank: null selects q_proj).
// An absent key is refused rather than guessed: the HF classes disagree on its default.
func (c hfConfig) nullableInt(key string) (int64, bool) {
	if !c.has(key) {
		panic(refusal("config.json lacks " + key + " (give it, or null)"))
	}
	if c.isNull(key) {
		return 0, false
	}
	return c.int(key), true
}

func (c hfConfig) boolOr(key string, def bool) bool {
	if !c.has(key) || c.isNull(key) {
		return def
	}
	var v bool
	if err := json.Unmarshal(c[key], &v); err != nil {
		panic(refusal(fmt.Sprintf("config.json: %s: %v", key, err)))
	}
	return v
}

func (c hfConfig) stringOr(key, def string) string {
	if !c.has(key) || c.isNull(key) {
		return def
	}
	var v string
	if err := json.Unmarshal(c[key], &v); err != nil {
		panic(refusal(fmt.Sprintf("config.json: %s: %v", key, err)))
	}
	return v
}

func (c hfConfig) intsOr(key string) []int64 {
	if !c.has(key) || c.isNull(key) {
		return nil
	}
	var v []int64
	if err := json.Unmarshal(c[key], &v); err != nil {
		panic(refusal(fmt.Sprintf("config.json: %s: %v", key, err)))
	}
	return v
}

func (c hfConfig) architecture() string {
	var archs []string
	if err := json.Unmarshal(c["architectures"], &archs); err != nil || len(archs) == 0 {
		panic(refusal("config.json has no architectures"))
	}
	return archs[0]
}

// modelDType is the dtype of every unquantized parameter. vLLM's ModelConfig with dtype="auto"
// takes the config's torch_dtype (vllm/config: _get_and_verify_dtype) and builds the model under
// set_default_torch_dtype, so every torch.empty without a dtype is in it. Newer configs spell the
// key "dtype". float32 checkpoints are served in 16 bits by vLLM's "auto", which depends on the
// platform; the reference does not model that and refuses.
func (c hfConfig) modelDType() string {
	dt := c.stringOr("torch_dtype", c.stringOr("dtype", ""))
	switch dt {
	case "bfloat16":
		return "BF16"
	case "float16":
		return "F16"
	}
	panic(refusal(fmt.Sprintf("config.json torch_dtype %q: the reference models bfloat16 and float16 only", dt)))
}

// fp8Block reads quantization_config. Only the DeepSeek-V3 style block FP8 is modelled:
// quant_method "fp8", weight_block_size [block_n, block_k], activation_scheme "dynamic"
// (Fp8Config.from_config; Fp8LinearMethod.create_weights asserts dynamic for block quant).
func (c hfConfig) fp8Block() (bn, bk int64, ok bool) {
	if !c.has("quantization_config") || c.isNull("quantization_config") {
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
		panic(refusal("config.json: quantization_config: " + err.Error()))
	}
	if q.QuantMethod != "fp8" || len(q.WeightBlockSize) != 2 {
		panic(
			refusal(
				fmt.Sprintf(
					"quantization_config %s: the reference models block-wise fp8 only",
					c["quantization_config"],
				),
			),
		)
	}
	if q.ActivationScheme != "dynamic" {
		panic(refusal("block fp8 needs activation_scheme dynamic (Fp8LinearMethod.create_weights asserts it)"))
	}
	if len(q.IgnoredLayers)+len(q.ModulesToNotConvert) > 0 {
		panic(refusal("quantization_config ignored_layers: not modelled by the reference"))
	}
	if q.WeightBlockSize[0] <= 0 || q.WeightBlockSize[1] <= 0 {
		panic(refusal("weight_block_size must be positive"))
	}
	return q.WeightBlockSize[0], q.WeightBlockSize[1], true
}
