package redisstore

import (
	"context"
	"errors"
	"strings"
	"testing"

	"github.com/stratakv/strata/storage"
)

// Errors a user meets name the flags that give the addresses, not Go fields.
func TestConfigErrorsNameTheFlags(t *testing.T) {
	_, err := New(context.Background(), DefaultConfig())
	if !errors.Is(err, storage.ErrConfig) {
		t.Fatalf("no addresses: %v, want ErrConfig", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "--redis") || !strings.Contains(msg, "--remote") || strings.Contains(msg, "Config.") {
		t.Errorf("%q does not name the flags", msg)
	}
	// Nothing listens on port 1: the store cannot reach the address.
	_, err = New(context.Background(), DefaultConfig("127.0.0.1:1"))
	if !errors.Is(err, storage.ErrUnavailable) {
		t.Fatalf("unreachable address: %v, want ErrUnavailable", err)
	}
	if msg := err.Error(); !strings.Contains(msg, "--redis") || !strings.Contains(msg, "--remote") || strings.Contains(msg, "Config.") {
		t.Errorf("%q does not name the flags", msg)
	}
}
