package wire

import (
	"fmt"
	"unicode/utf8"
)

// Limits of the protocol. Decoders reject anything beyond them with ErrMalformed,
// and Conn.Send refuses to send it.
const (
	// Version is the protocol version this package speaks: the third byte of every
	// frame header and Hello.Version.
	Version = 1
	// Revision is the highest revision of the protocol this package speaks, as
	// Hello.Revision and HelloReply.Revision carry it. Revision 2 adds Runs to
	// Item; the framing (Version) is the same. A peer that sends no revision
	// speaks revision 1.
	Revision = 2
	// HeaderSize is the length of a frame header in bytes.
	HeaderSize = 16
	// MaxBody is the longest frame body. A batch of 128 pages with a few hundred
	// bytes of metadata each is far smaller; longer declared lengths are refused
	// before anything is allocated.
	MaxBody = 16 << 20
	// MaxItems is the most items (or keys) in one batch: 128 pages of up to 32
	// object parts each (pools × K/V).
	MaxItems = 4096
	// MaxRanges is the most ranges one item's bytes may be split into (a
	// layer-first pool has one per layer).
	MaxRanges = 256
	// MaxRuns is the most runs one item's bytes may be named by (revision 2).
	MaxRuns = 256
	// MaxRunCount is the most ranges one run stands for, and the most ranges
	// one item's runs expand to: a layer-first pool's part of thousands of
	// one-token pages is one run.
	MaxRunCount = 4096
	// MaxBatchRanges is the most ranges the items of one batch name, runs
	// expanded: the most that MaxItems items of MaxRanges ranges could name
	// before runs existed, so that a server's work per batch stays bounded as
	// it was.
	MaxBatchRanges = MaxItems * MaxRanges
	// MaxKey is the longest object key in bytes. Keys are 1 to MaxKey bytes of
	// printable ASCII (0x20 to 0x7e).
	MaxKey = 512
	// MaxName is the longest client, segment or server version name in bytes.
	MaxName = 256
	// MaxMessage is the longest status message (Result.Message, Error.Message) in
	// bytes; ClipMessage shortens one to fit. 4096 results with messages this long
	// still fit in MaxBody.
	MaxMessage = 2048
)

// Message is the body of a frame. Decode returns pointers to the concrete types
// (*Hello, *Put, ...); values and pointers of them both satisfy Message.
type Message interface {
	// Type is the message's frame type.
	Type() Type
	// Marshal appends the message's protobuf encoding to b.
	Marshal(b []byte) []byte
	// Validate checks the message against the protocol's limits, as a decoder
	// would; the error wraps ErrMalformed.
	Validate() error
}

// Hello opens a session. The server answers HelloReply, or Error when it does not
// speak the client's version.
type Hello struct {
	// Version is the protocol version the client speaks (Version).
	Version uint32
	// ClientName names the client in the server's logs and stats (up to MaxName bytes).
	ClientName string
	// PID is the client's process id, for logs; the server trusts SO_PEERCRED.
	PID int32
	// Revision is the highest protocol revision the client speaks (Revision);
	// 0, from a client before revisions, is 1.
	Revision uint32
}

// HelloReply accepts a session.
type HelloReply struct {
	// ClientID is the server's id for this connection.
	ClientID uint64
	// ServerVersion is the server's build version, for logs.
	ServerVersion string
	// MaxBatch is the most items the server takes in one Put or Get.
	MaxBatch uint32
	// ClockNS is the server's CLOCK_MONOTONIC, in nanoseconds, when it
	// answered: the clock a Put's or Get's DeadlineNS is in. A client converts
	// its own deadlines with it (see Put). Zero from a server that keeps no
	// client deadlines (before they existed).
	ClockNS uint64
	// InstanceID is random per start of the service: a client that reconnects
	// and sees another one is talking to a restarted service. 0 from a server
	// before restarts were told apart.
	InstanceID uint64
	// ContentID names the service's stored contents (its DRAM arena): random
	// whenever the service started empty, the same across restarts that kept
	// the contents (an arena file on tmpfs re-attached after a kill, a crash or
	// an upgrade). A client that reconnects and sees another ContentID knows
	// the objects it stored are gone (those the service's SSD spill kept
	// aside) and may store again what it still holds. 0 from an older server.
	ContentID uint64
	// Starting is true while the service is still warming its memory or
	// recovering the objects of its arena file: it serves already, from what
	// is ready; ReadyPercent says how much of its arena is.
	Starting     bool
	ReadyPercent uint32
	// Warm is true when this start of the service kept the contents of the
	// one before (the same ContentID as before the restart).
	Warm bool
	// Revision is this connection's protocol revision: the lower of the
	// client's Hello.Revision and the server's. 0, from a server before
	// revisions, is 1. A client names items by Runs only at revision 2 or
	// later.
	Revision uint32
}

// RevisionOf returns the revision a Hello or HelloReply's field rev stands
// for: rev, or 1 for an absent (zero) one.
func RevisionOf(rev uint32) uint32 { return max(rev, 1) }

// RegisterSegment hands the service a memfd segment; its frame carries exactly one
// file descriptor, the memfd. The server maps Size bytes of it.
type RegisterSegment struct {
	// Size is the segment's length in bytes (not zero).
	Size uint64
	// Name names the segment in logs (the host pool's name).
	Name string
	// Fence registers the memfd as the connection's fence page instead of a
	// host pool: FenceBytes of uint32 counters, one per FenceSlot, that the
	// server raises while it copies into the client's memory for a Get naming
	// that slot (see Put). Ranges never name it. One per connection.
	Fence bool
}

// RegisterSegmentReply gives the id by which ranges name the registered segment.
type RegisterSegmentReply struct {
	SegmentID uint32
}

// UnregisterSegment releases a segment; the server unmaps it once no request uses
// it and answers Ack.
type UnregisterSegment struct {
	SegmentID uint32
}

// Exists asks how many of Keys, from the start, exist in Format.
type Exists struct {
	// Keys are object keys (at most MaxItems).
	Keys []string
	// Format is the storage.Format the objects must have.
	Format uint64
}

// ExistsReply answers Exists.
type ExistsReply struct {
	// Present is how many keys from the start exist in the format.
	Present uint32
}

// Range is a span of bytes in one of the client's registered segments.
type Range struct {
	// Segment is the id from RegisterSegmentReply.
	Segment uint32
	// Offset is the first byte's offset in the segment.
	Offset uint64
	// Length is the span's length in bytes (not zero).
	Length uint64
}

// Run is Count ranges of one segment at a fixed Stride (revision 2): the
// ranges (Segment, Offset + i*Stride, Length) for i in 0..Count-1. A
// layer-first pool's page is one run of a range per layer.
type Run struct {
	Segment uint32
	// Offset is the first range's offset in the segment.
	Offset uint64
	// Length is each range's length in bytes (not zero).
	Length uint64
	// Stride is the distance from one range's offset to the next's; at least
	// Length when Count is over 1 (a run's ranges ascend and never overlap).
	Stride uint64
	// Count is how many ranges the run stands for, 1 to MaxRunCount.
	Count uint32
}

// Range returns the run's range i (0 to Count-1).
func (r Run) Range(i int) Range {
	return Range{Segment: r.Segment, Offset: r.Offset + uint64(i)*r.Stride, Length: r.Length}
}

// End returns the end of the run's last range: Offset + (Count-1)*Stride +
// Length (for a run that validated, this does not overflow).
func (r Run) End() uint64 { return r.Offset + uint64(r.Count-1)*r.Stride + r.Length }

// Item is one object of a Put or Get: its key, format, and where its bytes are in
// the client's memory: the object is the concatenation of Ranges, in order, or
// of the ranges of Runs, in order. An item has ranges or runs, never both.
type Item struct {
	Key    string
	Format uint64
	// Ranges (1 to MaxRanges) lie in segments this client registered.
	Ranges []Range
	// Runs (1 to MaxRuns, revision 2) stand for at most MaxRunCount ranges in
	// all, in segments this client registered.
	Runs []Run
}

// Size returns the object's length: the sum of the lengths of its ranges (or
// of its runs' ranges).
func (it Item) Size() uint64 {
	var n uint64
	for _, r := range it.Ranges {
		n += r.Length
	}
	for _, r := range it.Runs {
		n += uint64(r.Count) * r.Length
	}
	return n
}

// Spans returns how many ranges the item names, its runs expanded.
func (it Item) Spans() int {
	n := len(it.Ranges)
	for _, r := range it.Runs {
		n += int(r.Count)
	}
	return n
}

// Put writes each item's bytes as its object, write-once: an object that exists
// in the item's format is a success that moves no data. The reply is BatchReply.
//
// Deadlines. A client that gives up on a request must know that the server
// will not touch the memory the request named afterwards: the engine reuses
// those pages at once. DeadlineNS, in the server's clock (HelloReply.ClockNS),
// is when the client gives up: the server starts no copy out of the client's
// memory after it (a Put's item copied meanwhile is not stored, since its bytes
// may have changed under the copy), and no copy into it (a Get). A copy into the
// client's memory that runs when the deadline passes is counted in the
// connection's fence page, at FenceSlot (1-based; 0: none): the server raises
// the slot's counter before it looks at the clock and lowers it after the copy,
// so a client whose deadline passed returns once it reads 0 there (or once the
// server closed the connection, which it does only after every request of it
// ended). Items refused for the deadline are answered Busy.
type Put struct {
	Items      []Item
	DeadlineNS uint64
	FenceSlot  uint32
}

// Get reads each item's object into its ranges. The reply is BatchReply; the
// ranges of an item whose Result is not OK hold undefined bytes. DeadlineNS and
// FenceSlot are as for Put.
type Get struct {
	Items      []Item
	DeadlineNS uint64
	FenceSlot  uint32
}

// FenceBytes is the size of a fence page: FenceSlots counters of 4 bytes.
const (
	FenceBytes = 4096
	FenceSlots = FenceBytes / 4
)

// Result is the outcome of one item of a Put or Get.
type Result struct {
	Status Status
	// Message says more about a failure (up to MaxMessage bytes; see ClipMessage).
	Message string
}

// Err returns nil for OK and otherwise an error with the message that wraps
// Status.Error().
func (r Result) Err() error { return statusErr(r.Status, r.Message) }

// BatchReply has one Result per item of the request, in order.
type BatchReply struct {
	Results []Result
}

// Remove deletes the objects of Keys, in every format.
type Remove struct {
	Keys []string
}

// RemoveReply says how many of the keys named an object that was removed.
type RemoveReply struct {
	Removed uint32
}

// Stats asks for the server's stats document.
type Stats struct{}

// StatsReply carries the server's stats document, a JSON object.
type StatsReply struct {
	JSON []byte
}

// Ping asks for a Pong with the same nonce.
type Ping struct {
	Nonce uint64
}

// Pong answers Ping.
type Pong struct {
	Nonce uint64
}

// Ack is an empty success reply.
type Ack struct{}

// Error fails a whole request: a malformed or unexpected message, an unknown
// segment, a server that is shutting down.
type Error struct {
	// Code is the failure's status (not OK).
	Code Status
	// Message says what happened and what to do (up to MaxMessage bytes).
	Message string
}

// Err returns the failure as an error that wraps Code.Error().
func (e Error) Err() error { return statusErr(e.Code, e.Message) }

func statusErr(s Status, msg string) error {
	err := s.Error()
	if err == nil || msg == "" {
		return err
	}
	return fmt.Errorf("%s: %w", msg, err)
}

// ClipMessage shortens s to at most MaxMessage bytes, on a UTF-8 boundary, and
// replaces invalid UTF-8, so that it can be sent as a status message.
func ClipMessage(s string) string {
	if !utf8.ValidString(s) {
		s = string([]rune(s)) // invalid bytes become U+FFFD
	}
	if len(s) <= MaxMessage {
		return s
	}
	const ellipsis = "…"
	cut := MaxMessage - len(ellipsis)
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return s[:cut] + ellipsis
}

func (Hello) Type() Type                { return TypeHello }
func (HelloReply) Type() Type           { return TypeHelloReply }
func (RegisterSegment) Type() Type      { return TypeRegisterSegment }
func (RegisterSegmentReply) Type() Type { return TypeRegisterSegmentReply }
func (UnregisterSegment) Type() Type    { return TypeUnregisterSegment }
func (Exists) Type() Type               { return TypeExists }
func (ExistsReply) Type() Type          { return TypeExistsReply }
func (Put) Type() Type                  { return TypePut }
func (Get) Type() Type                  { return TypeGet }
func (BatchReply) Type() Type           { return TypeBatchReply }
func (Remove) Type() Type               { return TypeRemove }
func (RemoveReply) Type() Type          { return TypeRemoveReply }
func (Stats) Type() Type                { return TypeStats }
func (StatsReply) Type() Type           { return TypeStatsReply }
func (Ping) Type() Type                 { return TypePing }
func (Pong) Type() Type                 { return TypePong }
func (Ack) Type() Type                  { return TypeAck }
func (Error) Type() Type                { return TypeError }

// newMessage returns a pointer to a zero message of type t, or nil.
func newMessage(t Type) Message {
	switch t {
	case TypeHello:
		return new(Hello)
	case TypeHelloReply:
		return new(HelloReply)
	case TypeRegisterSegment:
		return new(RegisterSegment)
	case TypeRegisterSegmentReply:
		return new(RegisterSegmentReply)
	case TypeUnregisterSegment:
		return new(UnregisterSegment)
	case TypeExists:
		return new(Exists)
	case TypeExistsReply:
		return new(ExistsReply)
	case TypePut:
		return new(Put)
	case TypeGet:
		return new(Get)
	case TypeBatchReply:
		return new(BatchReply)
	case TypeRemove:
		return new(Remove)
	case TypeRemoveReply:
		return new(RemoveReply)
	case TypeStats:
		return new(Stats)
	case TypeStatsReply:
		return new(StatsReply)
	case TypePing:
		return new(Ping)
	case TypePong:
		return new(Pong)
	case TypeAck:
		return new(Ack)
	case TypeError:
		return new(Error)
	}
	return nil
}
