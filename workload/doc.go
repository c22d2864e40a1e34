// Package workload generates the request traces that `strata bench` replays against a
// KV cache: deterministic lists of prompts, each with the tokens the simulated engine
// decodes after it and a Poisson arrival time.
//
// Three workloads cover the ways serving traffic reuses KV pages:
//
//   - multiturn: chat sessions whose every round resends the whole conversation, so
//     a round hits only if the session's pages survived the other sessions' rounds
//     in between (modelled on SGLang's bench_multiturn); some rounds regenerate the
//     last answer, edit an earlier message at an arbitrary token, or branch (an
//     agent's second request, sent with the round's own), so prompts also leave the
//     cached conversation in the middle of a page;
//   - shared-prefix: groups of prompts behind one long system prompt each, the case
//     prefix caching was built for;
//   - long-context: many questions about a few long documents, where a miss costs a
//     whole document's prefill.
//
// A trace depends only on the generator's configuration and the seed: tokens, order
// and arrival times come from separate PCG streams of math/rand/v2, so changing the
// request rate moves the arrivals and nothing else. The streams are salted with the
// workload's name: two workloads run with one seed against a persistent store share
// no pages. Independent random sequences
// (two sessions, two system prompts, two questions about one document) always differ
// at their first token, so prompts share exactly the prefixes the workload describes
// and never an accidental extra token.
package workload
