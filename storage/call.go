package storage

// Admit is the preamble of a backend's call on a registered pool (Exists, Get,
// Put), in one place so that every backend refuses a call the same way and in
// the same order. begin is the backend's admission of a call op on pool: it
// checks that the backend is open and the pool registered with live memory, and
// returns the pool's state and the function that ends the call (Close waits for
// calls in flight). check then tests the call's arguments against the pool
// (CheckKeys, CheckBatch, a read-only pool's puts) and returns the error the
// call ends with, worded by the backend. An error of either comes back as it is;
// a failed check has already ended the call, so that Close never waits for one
// that did not run. On success the caller calls done when the call ends.
func Admit[P any](begin func(pool, op string) (P, func(), error), pool, op string, check func(P) error) (P, func(), error) {
	p, done, err := begin(pool, op)
	if err != nil {
		var zero P
		return zero, nil, err
	}
	if err := check(p); err != nil {
		done()
		var zero P
		return zero, nil, err
	}
	return p, done, nil
}
