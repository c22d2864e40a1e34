package pagekey

import (
	"bufio"
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"strconv"
)

// MaxTokenInput bounds the bytes ParseTokens reads, so a runaway pipe cannot
// exhaust memory: 256 MiB is about 30 million token ids as text.
const MaxTokenInput = 256 << 20

// ParseTokens reads token ids from r: either a JSON array of integers or integers
// separated by white space. Every id must be a whole number in [0, 2^32-1]. The
// error names the first offending value and its position.
func ParseTokens(r io.Reader) ([]uint32, error) {
	data, err := io.ReadAll(io.LimitReader(r, MaxTokenInput+1))
	if err != nil {
		return nil, fmt.Errorf("read token ids: %w", err)
	}
	if len(data) > MaxTokenInput {
		return nil, fmt.Errorf("more than %d bytes of token ids: %w", MaxTokenInput, ErrTokens)
	}
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '[' {
		return parseJSONTokens(trimmed)
	}
	return parseTextTokens(trimmed)
}

func parseJSONTokens(data []byte) ([]uint32, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	var nums []any
	if err := dec.Decode(&nums); err != nil {
		return nil, fmt.Errorf("JSON token ids: %v (want an array of integers): %w", err, ErrTokens)
	}
	if dec.More() {
		return nil, fmt.Errorf("JSON token ids: trailing data after the array: %w", ErrTokens)
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("JSON token ids: trailing data after the array: %w", ErrTokens)
	}
	out := make([]uint32, len(nums))
	for i, v := range nums {
		n, ok := v.(json.Number)
		if !ok {
			return nil, fmt.Errorf("token id %d is %s: want an integer in [0, 4294967295]: %w", i, jsonKind(v), ErrTokens)
		}
		t, err := parseTokenID(string(n), i)
		if err != nil {
			return nil, err
		}
		out[i] = t
	}
	return out, nil
}

func parseTextTokens(data []byte) ([]uint32, error) {
	sc := bufio.NewScanner(bytes.NewReader(data))
	sc.Buffer(make([]byte, 0, 64), 64)
	sc.Split(bufio.ScanWords)
	out := make([]uint32, 0, len(data)/4)
	for i := 0; sc.Scan(); i++ {
		t, err := parseTokenID(sc.Text(), i)
		if err != nil {
			return nil, err
		}
		out = append(out, t)
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("token id %d: %v (ids are integers in [0, 4294967295]): %w", len(out), err, ErrTokens)
	}
	return out, nil
}

func parseTokenID(s string, index int) (uint32, error) {
	v, err := strconv.ParseUint(s, 10, 32)
	if err != nil {
		return 0, fmt.Errorf("token id %d is %q: want an integer in [0, 4294967295]: %w", index, abbreviate(s), ErrTokens)
	}
	return uint32(v), nil
}

func jsonKind(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case bool:
		return "a boolean"
	case nil:
		return "null"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	}
	return fmt.Sprintf("%T", v)
}
