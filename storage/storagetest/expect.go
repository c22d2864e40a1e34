package storagetest

import (
	"context"
	"errors"
	"testing"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/storage"
)

var bg = context.Background()

// expectAll fails t unless every entry of errs is nil.
func expectAll(t *testing.T, what string, errs []error, n int) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("%s: %d results for %d keys", what, len(errs), n)
	}
	for i, err := range errs {
		if err != nil {
			t.Fatalf("%s: key %d: %v", what, i, err)
		}
	}
}

// expectEach fails t unless errs has n entries that each match.
func expectEach(t *testing.T, what string, errs []error, n int, match func(error) bool, want string) {
	t.Helper()
	if len(errs) != n {
		t.Fatalf("%s: %d results for %d keys", what, len(errs), n)
	}
	for i, err := range errs {
		if !match(err) {
			t.Fatalf("%s: key %d: got %v, want %s", what, i, err, want)
		}
	}
}

func is(target error) func(error) bool { return func(err error) bool { return errors.Is(err, target) } }

func expectExists(t *testing.T, b storage.Backend, poolName string, keys []pagekey.Key, want int) {
	t.Helper()
	n, err := b.Exists(bg, poolName, keys)
	if err != nil || n != want {
		t.Fatalf("Exists(%s, %d keys) = %d, %v; want %d, nil", poolName, len(keys), n, err, want)
	}
}
