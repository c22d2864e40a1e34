package file

import (
	"errors"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stratakv/strata/storage"
)

// Errors a user meets name the flags that set the directory, not Go fields.
func TestConfigErrorsNameTheFlags(t *testing.T) {
	notDir := filepath.Join(t.TempDir(), "file")
	if err := os.WriteFile(notDir, nil, 0o600); err != nil {
		t.Fatal(err)
	}
	for _, dir := range []string{"", filepath.Join(notDir, "store")} {
		_, err := New(DefaultConfig(dir))
		if !errors.Is(err, storage.ErrConfig) {
			t.Fatalf("dir %q: %v, want ErrConfig", dir, err)
		}
		if msg := err.Error(); !strings.Contains(msg, "--l3-dir") || !strings.Contains(msg, "--spill-dir") || strings.Contains(msg, "Config.") || strings.Contains(msg, "Dir at") {
			t.Errorf("dir %q: %q does not name the flags", dir, msg)
		}
	}
}
