package sim

import (
	"fmt"
	"sort"
	"strings"
	"time"

	"github.com/stratakv/strata/kvlayout"
)

// Model is a model preset: the KV geometry of a real model on one GPU, and the
// figures that turn token counts into modelled time.
type Model struct {
	// Name is what --model accepts.
	Name string `json:"name"`
	// Geometry is the target model's KV geometry.
	Geometry kvlayout.Geometry `json:"geometry"`
	// DraftGeometry is its EAGLE draft model's: one decoder layer with the target's
	// attention shape.
	DraftGeometry kvlayout.Geometry `json:"draftGeometry"`
	// PrefillPerToken is the modelled compute time of one prompt token on one
	// H100-class GPU serving a batch. The presets assume sustained prefill rates of
	// about 100k tokens/s for a 0.5B model, 15k for 8B, 4k for 32B and 20k for the
	// 2.4B-active MLA model; override it with --prefill-us-per-token.
	PrefillPerToken time.Duration `json:"prefillPerToken"`
	// DecodeStep is the modelled time of one decode step of the running batch: it
	// only decides how long a request holds its L1 pages.
	DecodeStep time.Duration `json:"decodeStep"`
}

func mha(layers, heads, dim int) kvlayout.Geometry {
	return kvlayout.Geometry{Layers: layers, KVHeads: heads, HeadDim: dim, DTypeBytes: 2}
}

func mla(layers, latent int) kvlayout.Geometry {
	return kvlayout.Geometry{Layers: layers, MLA: true, LatentDim: latent, DTypeBytes: 2}
}

// models are the presets. The default is small enough for a run to fit a minute
// on two cores; the others show what real deployments move.
var models = map[string]Model{
	"qwen2.5-0.5b":     {Name: "qwen2.5-0.5b", Geometry: mha(24, 2, 64), DraftGeometry: mha(1, 2, 64), PrefillPerToken: 10 * time.Microsecond, DecodeStep: 5 * time.Millisecond},
	"llama3-8b":        {Name: "llama3-8b", Geometry: mha(32, 8, 128), DraftGeometry: mha(1, 8, 128), PrefillPerToken: 66 * time.Microsecond, DecodeStep: 12 * time.Millisecond},
	"qwen3-32b":        {Name: "qwen3-32b", Geometry: mha(64, 8, 128), DraftGeometry: mha(1, 8, 128), PrefillPerToken: 250 * time.Microsecond, DecodeStep: 30 * time.Millisecond},
	"deepseek-v2-lite": {Name: "deepseek-v2-lite", Geometry: mla(27, 576), DraftGeometry: mla(1, 576), PrefillPerToken: 50 * time.Microsecond, DecodeStep: 15 * time.Millisecond},
}

// DefaultModel is the preset `strata bench` uses when none is named.
const DefaultModel = "qwen2.5-0.5b"

// ModelByName returns a preset.
func ModelByName(name string) (Model, error) {
	m, ok := models[strings.ToLower(name)]
	if !ok {
		return Model{}, fmt.Errorf("model %q: want one of %s: %w", name, strings.Join(ModelNames(), ", "), ErrConfig)
	}
	return m, nil
}

// ModelNames lists the presets.
func ModelNames() []string {
	out := make([]string, 0, len(models))
	for n := range models {
		out = append(out, n)
	}
	sort.Strings(out)
	return out
}
