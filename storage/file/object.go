package file

import (
	"encoding/binary"
	"errors"
	"fmt"

	"github.com/zeebo/xxh3"

	"github.com/stratakv/strata/pagekey"
	"github.com/stratakv/strata/storage"
)

// An object part file is a 4096-byte header, so that the body starts 4 KiB
// aligned for O_DIRECT, followed by the body: the part's bytes in the pool's
// layout order (storage.Parts). All header fields are little-endian:
//
//	[0, 8)      magic "STRATAL3"
//	[8, 12)     version (1)
//	[12, 16)    header size (4096)
//	[16, 24)    body length in bytes
//	[24, 32)    storage.Format of the pool that wrote it
//	[32, 40)    xxh3-64 of the body
//	[40, 42)    length of the object name
//	[42, ...)   the object name, so a file moved under another name is caught
//	[4088, 4096) xxh3-64 of bytes [0, 4088)
const (
	headerSize    = 4096
	headerVersion = 1
	headerMagic   = "STRATAL3"
	offVersion    = 8
	offHdrSize    = 12
	offBodyLen    = 16
	offFormat     = 24
	offBodySum    = 32
	offNameLen    = 40
	offName       = 42
	offHeaderSum  = headerSize - 8
	maxHeaderName = offHeaderSum - offName
)

// header is what an object file says about itself.
type header struct {
	bodyLen uint64
	format  storage.Format
	bodySum uint64
	name    string
}

// encode writes h into the first headerSize bytes of dst, zeroing the rest of them.
func (h header) encode(dst []byte) {
	dst = dst[:headerSize]
	clear(dst)
	copy(dst, headerMagic)
	binary.LittleEndian.PutUint32(dst[offVersion:], headerVersion)
	binary.LittleEndian.PutUint32(dst[offHdrSize:], headerSize)
	binary.LittleEndian.PutUint64(dst[offBodyLen:], h.bodyLen)
	binary.LittleEndian.PutUint64(dst[offFormat:], uint64(h.format))
	binary.LittleEndian.PutUint64(dst[offBodySum:], h.bodySum)
	binary.LittleEndian.PutUint16(dst[offNameLen:], uint16(len(h.name)))
	copy(dst[offName:offHeaderSum], h.name)
	binary.LittleEndian.PutUint64(dst[offHeaderSum:], xxh3.Hash(dst[:offHeaderSum]))
}

// errHeader reports a header that is not one this package wrote intact.
var errHeader = errors.New("bad object header")

// decodeHeader parses and checks a header read from disk. It never panics: b is
// outside input.
func decodeHeader(b []byte) (header, error) {
	if len(b) < headerSize {
		return header{}, fmt.Errorf("%d header bytes, want %d: %w", len(b), headerSize, errHeader)
	}
	b = b[:headerSize]
	if string(b[:len(headerMagic)]) != headerMagic {
		return header{}, fmt.Errorf("no magic: %w", errHeader)
	}
	if sum := binary.LittleEndian.Uint64(b[offHeaderSum:]); sum != xxh3.Hash(b[:offHeaderSum]) {
		return header{}, fmt.Errorf("header checksum mismatch: %w", errHeader)
	}
	if v := binary.LittleEndian.Uint32(b[offVersion:]); v != headerVersion {
		return header{}, fmt.Errorf("version %d, want %d: %w", v, headerVersion, errHeader)
	}
	if n := binary.LittleEndian.Uint32(b[offHdrSize:]); n != headerSize {
		return header{}, fmt.Errorf("header size %d, want %d: %w", n, headerSize, errHeader)
	}
	n := int(binary.LittleEndian.Uint16(b[offNameLen:]))
	if n > maxHeaderName {
		return header{}, fmt.Errorf("name of %d bytes: %w", n, errHeader)
	}
	return header{
		bodyLen: binary.LittleEndian.Uint64(b[offBodyLen:]),
		format:  storage.Format(binary.LittleEndian.Uint64(b[offFormat:])),
		bodySum: binary.LittleEndian.Uint64(b[offBodySum:]),
		name:    string(b[offName : offName+n]),
	}, nil
}

// fileBytes is what an object part with a body of n bytes takes on disk, in whole
// 4 KiB blocks: the unit CapacityBytes counts.
func fileBytes(n int64) int64 { return roundUp(headerSize+n, blockSize) }

// relPath is where object name of key lives, relative to the store's directory:
// in the subdirectory named by the key's first two hex digits (256-way fan-out, so
// no directory grows past what readdir and lookups handle well).
func relPath(key pagekey.Key, name string) string {
	var hex [2 * pagekey.MaxDigestSize]byte
	h := key.AppendHex(hex[:0])
	return string(h[:2]) + "/" + name
}

// tempPrefix starts the name of every file being written and of the writability
// probe. Final object names never start with '.', so the two cannot collide.
const tempPrefix = ".tmp-"

// maxNameBytes bounds an object name so that its temporary name (the name plus
// ".tmp-", "-<pid>-<16 hex>") fits a file name of 255 bytes.
const maxNameBytes = 255 - len(tempPrefix) - 1 - 10 - 1 - 16

// validNameByte reports whether c may appear in an object name, and so in a file
// name: letters, digits and ":_.-".
func validNameByte(c byte) bool {
	return c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == ':' || c == '_' || c == '.' || c == '-'
}

// checkNames reports whether spec's object names are safe file names.
func checkNames(spec storage.PoolSpec) error {
	p := spec.Names.ModelPrefix
	for i := 0; i < len(p); i++ {
		if !validNameByte(p[i]) {
			return fmt.Errorf("pool %q: model prefix %q has %q; object names become file names, so use only letters, digits and \":_.-\": %w",
				spec.Name, p, p[i], storage.ErrConfig)
		}
	}
	if len(p) > 0 && p[0] == '.' {
		return fmt.Errorf("pool %q: model prefix %q starts with '.', which marks temporary files in a file store: %w", spec.Name, p, storage.ErrConfig)
	}
	var d [32]byte
	key, _ := pagekey.KeyFromDigest(d[:])
	for _, name := range storage.ObjectNames(spec, key) {
		if len(name) > maxNameBytes {
			return fmt.Errorf("pool %q: object names of %d bytes (model prefix %q), at most %d fit a file name; shorten the model prefix: %w",
				spec.Name, len(name), p, maxNameBytes, storage.ErrConfig)
		}
	}
	return nil
}

// sibling is the name of the other part of name's object (K for V and V for K),
// or "" for names that have none to speak of. Eviction removes both together, so
// that it never leaves half an object taking space.
func sibling(name string) string {
	n := len(name)
	if n < 2 || name[n-2] != '_' {
		return ""
	}
	switch name[n-1] {
	case 'k':
		return name[:n-1] + "v"
	case 'v':
		return name[:n-1] + "k"
	}
	return ""
}
