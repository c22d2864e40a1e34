package storagebench

import (
	"os"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/stratakv/strata/storage/redisstore"
)

// TestMain routes go-redis's own log lines (a dial refused by an address the
// tests leave dead on purpose) into slog at Debug level, as strata's main does.
func TestMain(m *testing.M) {
	redis.SetLogger(redisstore.ClientLogger{})
	os.Exit(m.Run())
}
