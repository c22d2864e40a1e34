package storage

import (
	"errors"
	"testing"
)

func TestAdmit(t *testing.T) {
	var began, ended int
	refused := errors.New("refused")
	begin := func(pool, op string) (*string, func(), error) {
		if pool == "" {
			return nil, nil, ErrNotRegistered
		}
		began++
		s := pool + " " + op
		return &s, func() { ended++ }, nil
	}
	ok := func(*string) error { return nil }
	bad := func(*string) error { return refused }

	if p, done, err := Admit(begin, "", "get", ok); !errors.Is(err, ErrNotRegistered) || p != nil || done != nil {
		t.Fatalf("unregistered pool: %v, %v, %v", p, done != nil, err)
	}
	if p, done, err := Admit(begin, "kv", "get", bad); err != refused || p != nil || done != nil || ended != began {
		t.Fatalf("failed check: %v, %v, %v; %d begun, %d ended", p, done != nil, err, began, ended)
	}
	p, done, err := Admit(begin, "kv", "put", ok)
	if err != nil || p == nil || *p != "kv put" || ended != began-1 {
		t.Fatalf("admitted call: %v, %v; %d begun, %d ended", p, err, began, ended)
	}
	done()
	if ended != began {
		t.Fatalf("%d begun, %d ended", began, ended)
	}
}
