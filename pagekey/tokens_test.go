package pagekey

import (
	"errors"
	"slices"
	"strconv"
	"strings"
	"testing"
)

func TestParseTokens(t *testing.T) {
	tests := []struct {
		in      string
		want    []uint32
		wantErr bool
	}{
		{"[1,2,3,4]", []uint32{1, 2, 3, 4}, false},
		{"  [ 1 , 2 ]\n", []uint32{1, 2}, false},
		{"1 2\n3\t4", []uint32{1, 2, 3, 4}, false},
		{"", []uint32{}, false},
		{"[]", []uint32{}, false},
		{"4294967295", []uint32{4294967295}, false},
		{"4294967296", nil, true},
		{"-1", nil, true},
		{"[1,-2]", nil, true},
		{"[1.5]", nil, true},
		{"[1e3]", nil, true},
		{"[\"1\"]", nil, true},
		{"[null]", nil, true},
		{"[[1]]", nil, true},
		{"{}", nil, true},
		{"1 two 3", nil, true},
		{"[1,2", nil, true},
		{"[1][2]", nil, true},
		{"[1] 2", nil, true},
		{"0x10", nil, true},
		{strings.Repeat("9", 100), nil, true},
	}
	for _, tt := range tests {
		got, err := ParseTokens(strings.NewReader(tt.in))
		if tt.wantErr {
			if !errors.Is(err, ErrTokens) {
				t.Errorf("ParseTokens(%q) err = %v, want ErrTokens", tt.in, err)
			}
			continue
		}
		if err != nil || !slices.Equal(got, tt.want) {
			t.Errorf("ParseTokens(%q) = %v, %v; want %v", tt.in, got, err, tt.want)
		}
	}
}

func FuzzParseTokens(f *testing.F) {
	for _, s := range []string{"[1,2,3]", "1 2 3", "", "[", "-1", "4294967296", "[1.0]", "\x00\xff"} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		toks, err := ParseTokens(strings.NewReader(string(data)))
		if err != nil {
			if !errors.Is(err, ErrTokens) {
				t.Fatalf("error %v does not wrap ErrTokens", err)
			}
			if strings.Contains(err.Error(), "\n") {
				t.Fatalf("error is not one line: %q", err)
			}
			return
		}
		// What parsed must survive a round trip through the text form.
		var sb strings.Builder
		for _, v := range toks {
			sb.WriteString(" ")
			sb.WriteString(strconv.FormatUint(uint64(v), 10))
		}
		again, err := ParseTokens(strings.NewReader(sb.String()))
		if err != nil || !slices.Equal(again, toks) {
			t.Fatalf("round trip of %v: %v, %v", toks, again, err)
		}
	})
}
