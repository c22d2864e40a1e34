package wire

import "google.golang.org/protobuf/encoding/protowire"

func (m *Hello) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fHelloVersion:
			m.Version, err = f.uint32("version")
		case fHelloClientName:
			m.ClientName, err = f.string("client name", MaxName)
		case fHelloPID:
			m.PID, err = f.int32("pid")
		case fHelloRevision:
			m.Revision, err = f.uint32("revision")
		}
		if err != nil {
			return err
		}
	}
}

func (m *HelloReply) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fHelloReplyClientID:
			m.ClientID, err = f.varint("client id")
		case fHelloReplyServerVersion:
			m.ServerVersion, err = f.string("server version", MaxName)
		case fHelloReplyMaxBatch:
			m.MaxBatch, err = f.uint32("max batch")
		case fHelloReplyClockNS:
			m.ClockNS, err = f.varint("clock")
		case fHelloReplyInstanceID:
			m.InstanceID, err = f.fixed64("instance id")
		case fHelloReplyContentID:
			m.ContentID, err = f.fixed64("content id")
		case fHelloReplyStarting:
			m.Starting, err = f.bool("starting")
		case fHelloReplyReadyPercent:
			m.ReadyPercent, err = f.uint32("ready percent") // the last one wins; Validate checks it
		case fHelloReplyWarm:
			m.Warm, err = f.bool("warm")
		case fHelloReplyRevision:
			m.Revision, err = f.uint32("revision")
		}
		if err != nil {
			return err
		}
	}
}

func (m *RegisterSegment) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fRegisterSize:
			m.Size, err = f.varint("size")
		case fRegisterName:
			m.Name, err = f.string("name", MaxName)
		case fRegisterFence:
			var v uint64
			v, err = f.varint("fence")
			if err == nil && v > 1 {
				err = malformed("fence %d, want 0 or 1", v)
			}
			m.Fence = v == 1
		}
		if err != nil {
			return err
		}
	}
}

func unmarshalSegmentID(b []byte, id *uint32) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num == fSegmentID {
			if *id, err = f.uint32("segment id"); err != nil {
				return err
			}
		}
	}
}

func (m *RegisterSegmentReply) unmarshal(b []byte) error {
	return unmarshalSegmentID(b, &m.SegmentID)
}

func (m *UnregisterSegment) unmarshal(b []byte) error {
	return unmarshalSegmentID(b, &m.SegmentID)
}

func (*Stats) unmarshal(b []byte) error { return skipAll(b) }
func (*Ack) unmarshal(b []byte) error   { return skipAll(b) }

func (m *StatsReply) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num == fStatsReplyJSON {
			if err := f.want("json", protowire.BytesType); err != nil {
				return err
			}
			m.JSON = nil // an empty value decodes as none, as it encodes
			if len(f.val) > 0 {
				m.JSON = append([]byte(nil), f.val...)
			}
		}
	}
}

func unmarshalNonce(b []byte, nonce *uint64) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num == fNonce {
			if *nonce, err = f.fixed64("nonce"); err != nil {
				return err
			}
		}
	}
}

func (m *Ping) unmarshal(b []byte) error { return unmarshalNonce(b, &m.Nonce) }
func (m *Pong) unmarshal(b []byte) error { return unmarshalNonce(b, &m.Nonce) }

func (m *Error) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		switch f.num {
		case fErrorCode:
			m.Code, err = f.status("code")
		case fErrorMessage:
			m.Message, err = f.string("message", MaxMessage)
		}
		if err != nil {
			return err
		}
	}
}
