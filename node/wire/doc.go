// Package wire is the protocol between engines and the per-node service
// (`strata serve`): framing, messages and the Unix socket connection that carries
// them, with memfd segments passed as file descriptors (SCM_RIGHTS).
//
// Every message travels as one frame: a 16-byte header (magic "ST", protocol
// Version, message Type, request id, body length; integers little-endian) and a
// body of at most MaxBody bytes in protobuf wire format. strata.proto in this
// directory is the schema, for clients in other languages; the Go encoders and
// decoders here are written by hand with protowire and follow it field for field.
// A reply carries the id of its request, so a client can pipeline requests.
//
// The conversation: a client sends Hello (→ HelloReply), registers each host pool
// segment once with RegisterSegment and its memfd (→ RegisterSegmentReply with the
// segment's id), then names bytes in its segments as (segment, offset, length)
// ranges in Put and Get (→ BatchReply, one Result per item), or, on a connection
// of Revision 2 (negotiated in Hello and HelloReply), as Runs: count ranges of
// one length at a fixed stride, one Run for a layer-first page's layers. Exists, Remove,
// Stats and Ping are what they say. A request that fails as a whole gets Error.
//
// Every decoder validates what it reads (key syntax, batch limits, ranges that
// cannot overflow, valid UTF-8, known enum values) and rejects anything else with
// an error wrapping ErrMalformed; outside input never panics. Conn.Send validates
// with the same rules before a byte is written, so a bad message is caught at its
// source.
package wire
