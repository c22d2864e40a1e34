package storage

// Object is one named object of a batch call of an object store (one that
// holds bytes by name rather than pool pages, like the Redis store's object
// API): its name, its format, and its body as runs of memory, the source of a
// put or the destination of a get, whose total length must be the object's.
// It lives here, beside Format, so that a store's callers can name the
// objects of its calls in an interface of their own without importing it.
type Object struct {
	Name   string
	Format Format
	Runs   [][]byte
}
