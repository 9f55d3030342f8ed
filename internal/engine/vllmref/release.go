package vllmref

// Releases are the vLLM release lines the reference models, oldest first.
var Releases = []string{"0.10", "0.29"}

// release is what one line changes against the rules of v0.10.2 the builder's layers follow.
type release struct {
	// attentionScales: every Attention module registers its q/k/v/prob scales as persistent
	// buffers. vllm/attention/layer.py, _init_kv_cache_quant -> set_default_quant_scales(layer,
	// register_buffer=True) (vLLM PR #31395, merged 2025-12-27; read from the index's copy of
	// vLLM main, not from a tagged release). v0.10.2 creates them as plain attributes.
	attentionScales bool

	// lcmVocabPadding: VocabParallelEmbedding.__init__ sets self.padding_size =
	// math.lcm(padding_size, self.tp_size) (vllm/model_executor/layers/vocab_parallel_embedding.py,
	// read from the index's copy of vLLM main; the release that introduced it is not pinned here).
	lcmVocabPadding bool

	// denseOnly: the line's MoE layers (FusedMoE as a factory over MoERunner / RoutedExperts, the
	// router and shared experts the runner registers again) are not modelled: the copies of
	// vLLM's sources the reference was written from disagree on that module tree.
	denseOnly bool
}

var releases = map[string]release{
	"0.10": {},
	"0.29": {attentionScales: true, lcmVocabPadding: true, denseOnly: true},
}

// Unmodelled is the error RankAt returns for an input the reference does not model on a line (as
// opposed to one vLLM refuses): a test should skip it, not expect the server to refuse it.
type Unmodelled string

func (u Unmodelled) Error() string { return string(u) }
