package main

import (
	"fmt"
	"reflect"
	"strings"
	"testing"
)

// A small PromQL reader for the dashboard test: it finds what an expression
// selects (metric names and their label matchers) and the labels it groups
// by, which is all the test compares with /metrics. Syntax is Prometheus's
// parser's business (promtool check rules); this reader refuses what it does
// not understand rather than guess.

// promSelector is one vector selector: a metric name and its matchers.
type promSelector struct {
	name     string
	matchers []promMatcher
}

type promMatcher struct{ label, op, value string }

// promGroupingKeywords take a parenthesized list of labels.
var promGroupingKeywords = map[string]bool{"by": true, "without": true, "on": true, "ignoring": true, "group_left": true, "group_right": true}

// promAggregations are the aggregation operators, which may take their
// grouping before their parenthesis (sum by (l) (x)).
var promAggregations = map[string]bool{"sum": true, "min": true, "max": true, "avg": true, "group": true, "stddev": true, "stdvar": true,
	"count": true, "count_values": true, "bottomk": true, "topk": true, "quantile": true, "limitk": true, "limit_ratio": true}

// promKeywords are words that are neither metrics nor functions.
var promKeywords = map[string]bool{"and": true, "or": true, "unless": true, "bool": true, "offset": true, "atan2": true}

func isIdentStart(c byte) bool {
	return c == '_' || c == ':' || (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')
}

func isIdent(c byte) bool { return isIdentStart(c) || (c >= '0' && c <= '9') }

// promqlRefs returns the selectors of expr and the labels it groups by.
func promqlRefs(expr string) (sels []promSelector, grouping []string, err error) {
	i := 0
	skipSpace := func() {
		for i < len(expr) && strings.ContainsRune(" \t\n", rune(expr[i])) {
			i++
		}
	}
	ident := func() string {
		start := i
		for i < len(expr) && isIdent(expr[i]) {
			i++
		}
		return expr[start:i]
	}
	str := func() (string, error) {
		q := expr[i]
		var b strings.Builder
		for i++; i < len(expr); i++ {
			switch c := expr[i]; {
			case c == '\\' && i+1 < len(expr):
				i++
				b.WriteByte(expr[i])
			case c == q:
				i++
				return b.String(), nil
			default:
				b.WriteByte(c)
			}
		}
		return "", fmt.Errorf("unterminated string")
	}
	lastWasMetric := false
	for skipSpace(); i < len(expr); skipSpace() {
		c := expr[i]
		switch {
		case c == '{':
			if !lastWasMetric {
				return nil, nil, fmt.Errorf("a selector without a metric name at %d", i)
			}
			i++
			sel := &sels[len(sels)-1]
			for skipSpace(); i < len(expr) && expr[i] != '}'; skipSpace() {
				label := ident()
				skipSpace()
				op := ""
				for _, o := range []string{"=~", "!~", "!=", "="} {
					if strings.HasPrefix(expr[i:], o) {
						op = o
						break
					}
				}
				if label == "" || op == "" {
					return nil, nil, fmt.Errorf("cannot read the label matcher at %d", i)
				}
				i += len(op)
				skipSpace()
				if i >= len(expr) || (expr[i] != '"' && expr[i] != '\'') {
					return nil, nil, fmt.Errorf("label %s: want a quoted value at %d", label, i)
				}
				v, err := str()
				if err != nil {
					return nil, nil, err
				}
				sel.matchers = append(sel.matchers, promMatcher{label, op, v})
				if skipSpace(); i < len(expr) && expr[i] == ',' {
					i++
				}
			}
			if i >= len(expr) {
				return nil, nil, fmt.Errorf("unterminated {")
			}
			i++
			lastWasMetric = false
		case c == '[':
			end := strings.IndexByte(expr[i:], ']')
			if end < 0 {
				return nil, nil, fmt.Errorf("unterminated [")
			}
			i += end + 1
			lastWasMetric = false
		case c == '"' || c == '\'':
			if _, err := str(); err != nil {
				return nil, nil, err
			}
			lastWasMetric = false
		case c == '$':
			i++
			ident()
			lastWasMetric = false
		case c >= '0' && c <= '9' || c == '.':
			for i < len(expr) && (isIdent(expr[i]) || expr[i] == '.') {
				i++
			}
			lastWasMetric = false
		case isIdentStart(c):
			word := ident()
			skipSpace()
			lastWasMetric = false
			switch {
			case promGroupingKeywords[word]:
				if i >= len(expr) || expr[i] != '(' {
					continue // group_left without labels
				}
				end := strings.IndexByte(expr[i:], ')')
				if end < 0 {
					return nil, nil, fmt.Errorf("unterminated %s (", word)
				}
				for _, l := range strings.Split(expr[i+1:i+end], ",") {
					if l = strings.TrimSpace(l); l != "" {
						grouping = append(grouping, l)
					}
				}
				i += end + 1
			case promKeywords[word], promAggregations[word]:
			case i < len(expr) && expr[i] == '(':
				// a function or an aggregation
			default:
				sels = append(sels, promSelector{name: word})
				lastWasMetric = true
			}
		default:
			i++ // an operator or a parenthesis
			lastWasMetric = false
		}
	}
	return sels, grouping, nil
}

func TestPromqlRefs(t *testing.T) {
	for _, c := range []struct {
		expr     string
		sels     []promSelector
		grouping []string
		err      string
	}{
		{expr: `up`, sels: []promSelector{{name: "up"}}},
		{expr: `sum by (instance, op) (rate(a_total{op="get",instance=~"$instance"}[$__rate_interval])) / on(instance) group_left b > 0`,
			sels:     []promSelector{{name: "a_total", matchers: []promMatcher{{"op", "=", "get"}, {"instance", "=~", "$instance"}}}, {name: "b"}},
			grouping: []string{"instance", "op", "instance"}},
		{expr: `x{k!="a\"b"} and bool y offset 5m`, sels: []promSelector{{name: "x", matchers: []promMatcher{{"k", "!=", `a"b`}}}, {name: "y"}}},
		{expr: `count by (instance) (strata_node_arena_bytes)`, sels: []promSelector{{name: "strata_node_arena_bytes"}}, grouping: []string{"instance"}},
		{expr: `{__name__="x"}`, err: "without a metric name"},
		{expr: `x{k="v"`, err: "unterminated {"},
		{expr: `x{k v}`, err: "cannot read the label matcher"},
	} {
		sels, grouping, err := promqlRefs(c.expr)
		if c.err != "" {
			if err == nil || !strings.Contains(err.Error(), c.err) {
				t.Errorf("%s: error %v, want %q", c.expr, err, c.err)
			}
			continue
		}
		if err != nil || !reflect.DeepEqual(sels, c.sels) || !reflect.DeepEqual(grouping, c.grouping) {
			t.Errorf("%s: %+v, %q, %v; want %+v, %q", c.expr, sels, grouping, err, c.sels, c.grouping)
		}
	}
}
