package main

import (
	"bytes"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"sort"
	"strconv"
	"strings"
)

// fromJSON turns a config file's value into the text the setting's flag takes.
// It accepts the types a person writes: a string for anything (as on the
// command line), numbers for numbers and sizes (whole bytes), booleans for switches,
// an array of addresses for --remote and an array of arrays of uids (or user
// names) for --tenant-groups.
func (st *setting) fromJSON(v any) (string, error) {
	switch v := v.(type) {
	case string:
		return v, nil
	case json.Number:
		switch st.kind {
		case kindSize:
			return sizeFromJSON(v)
		case kindInt, kindFloat, kindMode, kindString, kindGroups:
			return v.String(), nil
		case kindDuration:
			return "", fmt.Errorf("%s is a number; give a duration as a string with its unit, e.g. \"10s\"", v)
		}
	case bool:
		if st.kind == kindBool {
			return strconv.FormatBool(v), nil
		}
	case []any:
		switch st.kind {
		case kindList:
			items := make([]string, len(v))
			for i, e := range v {
				a, ok := e.(string)
				if !ok {
					return "", fmt.Errorf("item %d is %s; want an array of strings such as [\"10.0.0.1:6379\", \"10.0.0.2:6379\"]", i, jsonType(e))
				}
				if strings.Contains(a, ",") {
					return "", fmt.Errorf("item %q holds a comma; give one address per item", a)
				}
				items[i] = a
			}
			return strings.Join(items, ","), nil
		case kindGroups:
			groups := make([]string, len(v))
			for i, g := range v {
				members, ok := g.([]any)
				if !ok {
					members = []any{g}
				}
				ids := make([]string, len(members))
				for j, m := range members {
					switch m := m.(type) {
					case json.Number:
						ids[j] = m.String()
					case string:
						ids[j] = m
					default:
						return "", fmt.Errorf("group %d, member %d is %s; want uids or user names such as [[1000, 1001], [\"alice\"]]", i, j, jsonType(m))
					}
				}
				groups[i] = strings.Join(ids, ",")
			}
			return strings.Join(groups, ";"), nil
		}
	case nil:
		return "", fmt.Errorf("null; leave the key out to keep the default")
	}
	return "", fmt.Errorf("%s; want %s", jsonType(v), st.kind.jsonWant())
}

func jsonType(v any) string {
	switch v.(type) {
	case string:
		return "a string"
	case json.Number:
		return "a number"
	case bool:
		return "a boolean"
	case []any:
		return "an array"
	case map[string]any:
		return "an object"
	case nil:
		return "null"
	}
	return fmt.Sprintf("%T", v)
}

// jsonWant says what a config file may give a setting of kind k.
func (k settingKind) jsonWant() string {
	switch k {
	case kindSize:
		return "a size, a string with a binary unit such as \"4GiB\" or a whole number of bytes"
	case kindFloat:
		return "a number"
	case kindInt:
		return "an integer"
	case kindDuration:
		return "a duration, a string such as \"10s\""
	case kindBool:
		return "true or false"
	case kindMode:
		return "an octal mode, a string such as \"0600\""
	case kindList:
		return "an array of strings (or one comma-separated string)"
	case kindGroups:
		return "an array of arrays of uids or user names, e.g. [[1000, 1001], [2000]]"
	case kindLevel:
		return "a string: debug, info, warn or error"
	}
	return "a string"
}

// load applies the config file, the environment and the flags that were given.
func (s *serveSettings) load(fs *flag.FlagSet, given map[string]string) error {
	if s.config != "" {
		raw, err := os.ReadFile(s.config)
		if err != nil {
			return usagef("--config: %w", err)
		}
		var doc map[string]json.RawMessage
		dec := json.NewDecoder(bytes.NewReader(raw))
		dec.UseNumber()
		if err := dec.Decode(&doc); err != nil {
			return usagef("--config %s: %v (want a JSON object whose keys are the flags' names)", s.config, err)
		}
		keys := make([]string, 0, len(doc))
		for k := range doc {
			keys = append(keys, k)
		}
		sort.Strings(keys)
		for _, k := range keys {
			st, ok := s.settings[k]
			if !ok {
				return usagef("--config %s: unknown key %q (the keys are the flags' names: %s)", s.config, k, strings.Join(s.names(), ", "))
			}
			var v any
			vd := json.NewDecoder(bytes.NewReader(doc[k]))
			vd.UseNumber()
			if err := vd.Decode(&v); err != nil {
				return usagef("--config %s: %q: %v", s.config, k, err)
			}
			text, err := st.fromJSON(v)
			if err != nil {
				return usagef("--config %s: %q is %w", s.config, k, err)
			}
			if err := st.set(text); err != nil {
				return usagef("--config %s: %q: %w", s.config, k, err)
			}
		}
	}
	for _, name := range s.names() {
		if v, ok := os.LookupEnv(envName(name)); ok {
			if err := s.settings[name].set(v); err != nil {
				return usagef("%s: %w", envName(name), err)
			}
		}
	}
	for _, name := range s.names() {
		if v, ok := given[name]; ok {
			if err := s.settings[name].set(v); err != nil {
				return usagef("--%s: %w", name, err)
			}
		}
	}
	return nil
}
