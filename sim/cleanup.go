package sim

import (
	"errors"
	"fmt"
	"io"
	"os"
	"sync"
	"time"
)

// cleaner removes the bench's temporary directories (the embedded node
// service's spill, a temporary file L3: gigabytes in thousands of files, which
// take seconds to unlink) in the background, so the report comes first.
type cleaner struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

// removeAll starts removing dir.
func (c *cleaner) removeAll(dir string) {
	c.wg.Add(1)
	go func() {
		defer c.wg.Done()
		if err := os.RemoveAll(dir); err != nil {
			c.mu.Lock()
			c.errs = append(c.errs, err)
			c.mu.Unlock()
		}
	}()
}

// remove removes dir now, or in the background with a cleaner.
func (c *cleaner) remove(dir string) error {
	if c == nil {
		return os.RemoveAll(dir)
	}
	c.removeAll(dir)
	return nil
}

// cleanupNoticeAfter is how long a removal runs before WaitCleanup says so.
const cleanupNoticeAfter = time.Second

// WaitCleanup waits for the removal of the bench's temporary directories that
// Config.BackgroundCleanup left running, and says so on w when it takes longer
// than a second. It returns the removals' errors.
func (r *Report) WaitCleanup(w io.Writer) error {
	c := r.cleanup
	if c == nil {
		return nil
	}
	done := make(chan struct{})
	go func() {
		c.wg.Wait()
		close(done)
	}()
	start := time.Now()
	select {
	case <-done:
	case <-time.After(cleanupNoticeAfter):
		_, _ = io.WriteString(w, "removing the bench's temporary directories (the node service's spill)...")
		<-done
		_, _ = fmt.Fprintf(w, " done in %s\n", time.Since(start).Round(100*time.Millisecond))
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if err := errors.Join(c.errs...); err != nil {
		return fmt.Errorf("remove the bench's temporary directories: %w", err)
	}
	return nil
}
