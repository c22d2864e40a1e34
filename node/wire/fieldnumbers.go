package wire

import "google.golang.org/protobuf/encoding/protowire"

// Field numbers, as in strata.proto.
const (
	fHelloVersion    protowire.Number = 1
	fHelloClientName protowire.Number = 2
	fHelloPID        protowire.Number = 3
	fHelloRevision   protowire.Number = 4

	fHelloReplyClientID      protowire.Number = 1
	fHelloReplyServerVersion protowire.Number = 2
	fHelloReplyMaxBatch      protowire.Number = 3
	fHelloReplyClockNS       protowire.Number = 4
	fHelloReplyInstanceID    protowire.Number = 5
	fHelloReplyContentID     protowire.Number = 6
	fHelloReplyStarting      protowire.Number = 7
	fHelloReplyReadyPercent  protowire.Number = 8
	fHelloReplyWarm          protowire.Number = 9
	fHelloReplyRevision      protowire.Number = 10

	fRegisterSize  protowire.Number = 1
	fRegisterName  protowire.Number = 2
	fRegisterFence protowire.Number = 3

	fSegmentID protowire.Number = 1 // RegisterSegmentReply, UnregisterSegment

	fExistsKeys   protowire.Number = 1
	fExistsFormat protowire.Number = 2

	fExistsReplyPresent protowire.Number = 1

	fRangeSegment protowire.Number = 1
	fRangeOffset  protowire.Number = 2
	fRangeLength  protowire.Number = 3

	fItemKey    protowire.Number = 1
	fItemFormat protowire.Number = 2
	fItemRanges protowire.Number = 3
	fItemRuns   protowire.Number = 4

	fRunSegment protowire.Number = 1
	fRunOffset  protowire.Number = 2
	fRunLength  protowire.Number = 3
	fRunStride  protowire.Number = 4
	fRunCount   protowire.Number = 5

	fBatchItems      protowire.Number = 1 // Put, Get
	fBatchDeadlineNS protowire.Number = 2
	fBatchFenceSlot  protowire.Number = 3

	fResultStatus  protowire.Number = 1
	fResultMessage protowire.Number = 2

	fBatchReplyResults protowire.Number = 1

	fRemoveKeys protowire.Number = 1

	fRemoveReplyRemoved protowire.Number = 1

	fStatsReplyJSON protowire.Number = 1

	fNonce protowire.Number = 1 // Ping, Pong

	fErrorCode    protowire.Number = 1
	fErrorMessage protowire.Number = 2
)
