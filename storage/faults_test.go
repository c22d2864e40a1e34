package storage

import (
	"errors"
	"fmt"
	"testing"
)

func TestFaultCounts(t *testing.T) {
	var c FaultCounts
	if c.NonZero() != nil {
		t.Fatal("zero value has faults")
	}
	if kind := c.Add(fmt.Errorf("shard: %w", ErrUnavailable)); kind != "unavailable" {
		t.Fatalf("kind %q", kind)
	}
	c.AddAll([]error{nil, ErrNotFound, ErrTimeout, errors.New("disk on fire"), ErrTimeout})
	c.AddKind("no such kind")
	want := map[string]int64{"unavailable": 1, "timeout": 2, "io": 2}
	got := c.NonZero()
	if len(got) != len(want) {
		t.Fatalf("NonZero %v, want %v", got, want)
	}
	for k, n := range want {
		if got[k] != n {
			t.Fatalf("NonZero %v, want %v", got, want)
		}
	}
	all := c.All()
	if len(all) != len(FaultKinds()) || all["corrupt"] != 0 || all["timeout"] != 2 {
		t.Fatalf("All %v", all)
	}
}
