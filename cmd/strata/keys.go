package main

import (
	"bufio"
	"context"
	"fmt"
	"io"

	"github.com/stratakv/strata/pagekey"
)

func runKeys(_ context.Context, args []string, stdin io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("keys", stdout)
	pageSize := fs.Int("page-size", 64, "tokens per page (must match the engine's page size)")
	bigram := fs.Bool("bigram", false, "EAGLE bigram keys: position i is the pair (t[i], t[i+1])")
	extraKey := fs.String("extra-key", "", "namespace: SGLang extra key (LoRA adapter, multimodal hash); set even when empty")
	cacheSalt := fs.String("cache-salt", "", "namespace: per-tenant cache salt; set even when empty")
	algo := fs.String("algo", "sha256", "hash chain: sha256 (SGLang-compatible) or xxh3")
	fs.Usage = func() {
		fmt.Fprintln(fs.Output(), "usage: strata keys [flags] < tokens")
		fmt.Fprintln(fs.Output(), "Reads token ids (a JSON array or whitespace-separated integers) from stdin and prints one page key per line.")
		printFlags(fs)
	}
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	a, err := pagekey.ParseAlgorithm(*algo)
	if err != nil {
		return usagef("--algo: %w", err)
	}
	h, err := pagekey.New(pagekey.Config{PageSize: *pageSize, Bigram: *bigram, Algorithm: a})
	if err != nil {
		return usagef("--page-size: %w", err)
	}
	var ns pagekey.Namespace
	if flagSet(fs, "extra-key") {
		ns = ns.WithExtraKey(*extraKey)
	}
	if flagSet(fs, "cache-salt") {
		ns = ns.WithCacheSalt(*cacheSalt)
	}
	tokens, err := pagekey.ParseTokens(stdin)
	if err != nil {
		return usagef("stdin: %w", err)
	}
	keys := h.Keys(h.Seed(ns), tokens)
	if len(keys) == 0 {
		// Nothing on stdout is right (no whole page, no key), but silence reads as
		// a failure: say why.
		need := *pageSize
		if *bigram {
			need++ // bigram keys pair each token with the next
		}
		fmt.Fprintf(stderr, "strata keys: %d tokens make no whole page of %d tokens (%d tokens needed): no keys\n", len(tokens), *pageSize, need)
		return nil
	}
	w := bufio.NewWriter(stdout)
	line := make([]byte, 0, 2*pagekey.MaxDigestSize+1)
	for _, k := range keys {
		line = append(k.AppendHex(line[:0]), '\n')
		if _, err := w.Write(line); err != nil {
			return err
		}
	}
	return w.Flush()
}
