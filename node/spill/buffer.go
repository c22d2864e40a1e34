package spill

// bufState is where a write buffer is in its cycle.
type bufState uint8

const (
	bufFree    bufState = iota
	bufFilling          // the current buffer: puts copy records into it
	bufSealed           // queued for the writer, or being written
)

// stageBuf is a write buffer: a run of its segment from start, n bytes long.
type stageBuf struct {
	mem     []byte
	state   bufState
	seg     *segment
	start   int64
	n       int64
	copying int        // puts copying into it now: the writer waits for them
	readers int        // gets copying out of it now: it is reused after them
	keys    [][16]byte // object records in it, unindexed if its write fails
	waiters []*flushWait
}
