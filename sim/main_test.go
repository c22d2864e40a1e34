package sim

import (
	"testing"

	"go.uber.org/goleak"
)

// TestMain fails the package when a bench leaves a goroutine behind: the cache's
// workers, an embedded node service, a Redis client.
func TestMain(m *testing.M) { goleak.VerifyTestMain(m) }
