package main

import (
	"bytes"
	"context"
	"strings"
	"testing"
)

func runCLI(t *testing.T, stdin string, args ...string) (int, string, string) {
	t.Helper()
	var out, errb bytes.Buffer
	code := run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestKeysMatchDesignVectors(t *testing.T) {
	want := "34fb5c825de7ca4aea6e712f19d439c1da0c92c37b423936c5f618545ca4fa1f\n" +
		"c57b445f90651b9a650e516ab2238c965b21af35608a31c303e6d9e407f2915c\n"
	for _, in := range []string{"[1,2,3,4]", "1 2 3 4\n", "1 2 3 4 5"} {
		code, out, errs := runCLI(t, in, "keys", "--page-size", "2")
		if code != 0 || out != want {
			t.Fatalf("keys < %q: code %d, out %q, err %q", in, code, out, errs)
		}
	}
}

func TestKeysNamespaceBigramAndAlgo(t *testing.T) {
	cases := []struct {
		args []string
		in   string
		want string
	}{
		{[]string{"--page-size", "2", "--extra-key", "lora-a"}, "1 2 3 4", "ad023babe5121ed61b30e57d93dc9d29cb19b361c098794f361e7a94bf561d88\nf674138b108a1679dcac30e25f6350895dbc23f3632541a20a855bc4093382a7\n"},
		{[]string{"--page-size", "2", "--cache-salt", "tenant-1"}, "1 2 3 4", "a63b0d65e8e35cedc7224ba8bfbdd84b7cb84bedffc4c0f6890659fa4b2e8455\nb88acb4922be5241c0f257f6a0888b24b182cb017c00d7f035210fc685826330\n"},
		{[]string{"--page-size", "2", "--bigram"}, "1 2 3 4 5", "ede8ef26a097f0fd889f9f39f6f5af921370630b164c4a4fa28eb716b2df9269\n678c5307f2a02a2aaf8edbeb80ebac13663f70e14a4fc8d5d62b77e702841e4b\n"},
		{[]string{}, "1 2 3", ""},
	}
	for _, c := range cases {
		code, out, errs := runCLI(t, c.in, append([]string{"keys"}, c.args...)...)
		if code != 0 || out != c.want {
			t.Errorf("keys %v: code %d out %q err %q", c.args, code, out, errs)
		}
	}
	code, out, _ := runCLI(t, "1 2 3 4", "keys", "--page-size", "2", "--algo", "xxh3")
	if lines := strings.Fields(out); code != 0 || len(lines) != 2 || len(lines[0]) != 32 {
		t.Errorf("xxh3 keys: code %d out %q", code, out)
	}
}

func TestKeysBadInputExitsTwoWithOneLine(t *testing.T) {
	cases := []struct {
		in   string
		args []string
		msg  string
	}{
		{"1 two 3", nil, "token id 1"},
		{"-1", nil, "token id 0"},
		{"4294967296", nil, "4294967296"},
		{"[1, 2.5]", nil, "2.5"},
		{"[1, 2", nil, "JSON"},
		{"1 2", []string{"--page-size", "0"}, "page size 0"},
		{"1 2", []string{"--page-size", "-4"}, "page size -4"},
		{"1 2", []string{"--algo", "md5"}, "md5"},
		{"1 2", []string{"--nope"}, "nope"},
	}
	for _, c := range cases {
		code, out, errs := runCLI(t, c.in, append([]string{"keys"}, c.args...)...)
		if code != 2 {
			t.Errorf("keys %v < %q: exit %d, want 2", c.args, c.in, code)
		}
		if out != "" {
			t.Errorf("keys %v < %q printed keys %q on bad input", c.args, c.in, out)
		}
		if strings.Count(errs, "\n") != 1 || !strings.Contains(errs, c.msg) {
			t.Errorf("keys %v < %q: stderr %q, want one line naming %q", c.args, c.in, errs, c.msg)
		}
	}
}

func TestUnknownCommandAndHelp(t *testing.T) {
	if code, _, errs := runCLI(t, "", "frobnicate"); code != 2 || !strings.Contains(errs, "unknown command") {
		t.Fatalf("unknown command: %d %q", code, errs)
	}
	if code, _, errs := runCLI(t, "", "help"); code != 0 || !strings.Contains(errs, "keys") {
		t.Fatalf("help: %d %q", code, errs)
	}
	if code, out, _ := runCLI(t, "", "version"); code != 0 || !strings.HasPrefix(out, "strata ") {
		t.Fatalf("version: %d %q", code, out)
	}
}
