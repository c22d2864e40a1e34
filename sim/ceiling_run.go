package sim

import (
	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/pool"
	"github.com/stratakv/strata/radix"
)

// ceilingRun is the infinite-capacity cache: every page ever computed stays
// cached, so its hit ratio bounds what any cache can reach on the trace. It keeps
// keys only, no KV bytes, and loads nothing.
//
// A request's hit is taken when it arrives, against every page of every request
// that arrived before it (prompt and output), as if each were computed the moment
// it arrived: no cache that serves requests in arrival order can hit more, however
// its schedule delays admission (a strata run that waits for L1 room admits later,
// when more is cached, which once let it beat a ceiling taken at admission). Pages
// are counted as strata counts them: whole pages of the prompt, keyed by bigrams
// when strata's are.
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

// ceilingHit is a request's hit, taken at arrival.
type ceilingHit struct {
	tokens int
	err    error
}

func (c *ceilingRun) arrive(a *active) {
	h := &ceilingHit{}
	if c.bigram {
		h.tokens = c.bigrams.Peek(pagekey.Key{}, bigramKey(a.req.Prompt)) * c.ps
		key := bigramKey(a.tokens)
		_, h.err = c.bigrams.Insert(pagekey.Key{}, key[:len(key)/c.ps*c.ps], c.pages(len(key)/c.ps), nil)
	} else {
		h.tokens = c.tokens.Peek(pagekey.Key{}, a.req.Prompt) * c.ps
		_, h.err = c.tokens.Insert(pagekey.Key{}, a.tokens[:len(a.tokens)/c.ps*c.ps], c.pages(len(a.tokens)/c.ps), nil)
	}
	a.state = h
}

func (c *ceilingRun) admit(a *active) (bool, error) {
	h := a.state.(*ceilingHit)
	a.hitL1 = h.tokens
	return false, h.err
}

func (c *ceilingRun) prefill(*active) {}

func (c *ceilingRun) settle() error { return nil }

func (c *ceilingRun) finish(*active) error { return nil }

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
