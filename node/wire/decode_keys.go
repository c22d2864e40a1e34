package wire

import "google.golang.org/protobuf/encoding/protowire"

// unmarshalKeys collects the keys (field num) of b; other fields go to other.
func unmarshalKeys(b []byte, num protowire.Number, other func(f *fields) error) ([]string, error) {
	n, err := count(b, num, "keys", MaxItems)
	if err != nil || n == 0 && other == nil {
		return nil, err
	}
	var keys []string
	if n > 0 {
		keys = make([]string, 0, n)
	}
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return keys, err
		}
		if f.num == num {
			k, err := f.string("key", MaxKey)
			if err != nil {
				return nil, prefixIndex("keys", len(keys), err)
			}
			keys = append(keys, k)
		} else if other != nil {
			if err := other(&f); err != nil {
				return nil, err
			}
		}
	}
}

func (m *Exists) unmarshal(b []byte) (err error) {
	m.Keys, err = unmarshalKeys(b, fExistsKeys, func(f *fields) (err error) {
		if f.num == fExistsFormat {
			m.Format, err = f.fixed64("format")
		}
		return err
	})
	return err
}

func (m *ExistsReply) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num == fExistsReplyPresent {
			if m.Present, err = f.uint32("present"); err != nil {
				return err
			}
		}
	}
}

func (m *Remove) unmarshal(b []byte) (err error) {
	m.Keys, err = unmarshalKeys(b, fRemoveKeys, nil)
	return err
}

func (m *RemoveReply) unmarshal(b []byte) error {
	f := fields{b: b}
	for {
		ok, err := f.next()
		if err != nil || !ok {
			return err
		}
		if f.num == fRemoveReplyRemoved {
			if m.Removed, err = f.uint32("removed"); err != nil {
				return err
			}
		}
	}
}
