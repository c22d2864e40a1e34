//go:build !amd64

package pool

// copyRun copies src into dst.
func copyRun(dst, src []byte) { copy(dst, src) }

// copyRunPrefetch copies src into dst; next is a hint that only amd64 uses.
func copyRunPrefetch(dst, src, next []byte) { copy(dst, src) }

// copyStreaming has no streaming-store version off amd64.
func copyStreaming(dst, src []byte) { copy(dst, src) }

func finishRuns() {}
