package sim

import (
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
)

// ceilingRun is the infinite-capacity cache: every page ever computed stays
// cached, so its hit ratio bounds what any cache can reach on the trace. It keeps
// keys only, no KV bytes, and loads nothing.
type ceilingRun struct {
	ps       int
	bigram   bool
	tokens   *radix.Tree[uint32]
	bigrams  *radix.Tree[uint64]
	nextPage pool.PageID
}

func newCeilingRun(cfg Config, maxPages int) (*ceilingRun, error) {
	c := &ceilingRun{ps: cfg.PageSize, bigram: cfg.Bigram}
	var err error
	rc := radix.Config{PageSize: cfg.PageSize, MaxPages: maxPages}
	if cfg.Bigram {
		c.bigrams, err = radix.New[uint64](rc)
	} else {
		c.tokens, err = radix.New[uint32](rc)
	}
	return c, err
}

func (c *ceilingRun) admit(a *active) (bool, error) {
	if c.bigram {
		a.hitL1 = c.bigrams.Peek(pagekey.Key{}, bigramKey(a.req.Prompt)) * c.ps
	} else {
		a.hitL1 = c.tokens.Peek(pagekey.Key{}, a.req.Prompt) * c.ps
	}
	return false, nil
}

func (c *ceilingRun) prefill(*active) {}

func (c *ceilingRun) arrive(*active) {}

func (c *ceilingRun) settle() error { return nil }

func (c *ceilingRun) finish(a *active) error {
	var err error
	if c.bigram {
		key := bigramKey(a.tokens)
		_, err = c.bigrams.Insert(pagekey.Key{}, key[:len(key)/c.ps*c.ps], c.pages(len(key)/c.ps), nil)
	} else {
		_, err = c.tokens.Insert(pagekey.Key{}, a.tokens[:len(a.tokens)/c.ps*c.ps], c.pages(len(a.tokens)/c.ps), nil)
	}
	return err
}

// pages hands out fresh page ids; the ceiling has no pool behind them.
func (c *ceilingRun) pages(n int) []pool.PageID {
	out := make([]pool.PageID, n)
	for i := range out {
		out[i] = c.nextPage
		c.nextPage++
	}
	return out
}

func (c *ceilingRun) report(*RunReport) {}

func (c *ceilingRun) close() error {
	if c.bigram {
		return c.bigrams.Close()
	}
	return c.tokens.Close()
}

// bigramKey packs EAGLE bigrams (t[i], t[i+1]) as hicache does.
func bigramKey(tokens []uint32) []uint64 {
	if len(tokens) < 2 {
		return nil
	}
	out := make([]uint64, len(tokens)-1)
	for i := range out {
		out[i] = uint64(tokens[i])<<32 | uint64(tokens[i+1])
	}
	return out
}
