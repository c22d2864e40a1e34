package redisstore

import (
	"testing"

	"github.com/redis/go-redis/v9"
	"go.uber.org/goleak"
)

// TestMain routes go-redis's own log lines (a dial refused by a server a test
// killed on purpose, logged once per attempt) into slog at Debug level, as
// strata's main does; the store reports shard faults in its errors and its
// Logger. It fails the package when a test leaves a goroutine behind.
func TestMain(m *testing.M) {
	redis.SetLogger(ClientLogger{})
	goleak.VerifyTestMain(m)
}
