package wire

import (
	"fmt"
	"os"
	"strconv"
	"strings"
	"unicode"

	"google.golang.org/protobuf/encoding/protowire"
)

// This file reads strata.proto, the protocol's schema, so that tests can hold
// the hand-written codec to it (schema_test.go). It parses the subset of the
// proto3 language the schema uses: syntax, package and option statements,
// enums, and messages of singular and repeated fields of scalar, enum and
// message types. Anything else in the file fails the parse, by name: a
// schema that grows a construct (oneof, map, nesting, packed numbers) must
// grow this parser and the checks with it, not slip past them.

// protoSchema is a parsed .proto file.
type protoSchema struct {
	enums    map[string]*protoEnum
	messages map[string]*protoMessage
	// comments holds the text of every comment, for the limits the schema
	// states in prose.
	comments string
}

type protoEnum struct {
	name   string
	values []protoEnumValue
}

type protoEnumValue struct {
	name string
	num  int
}

// has reports whether v is one of the enum's values.
func (e *protoEnum) has(v uint64) bool {
	for _, ev := range e.values {
		if uint64(ev.num) == v {
			return true
		}
	}
	return false
}

type protoMessage struct {
	name   string
	fields []protoField
}

type protoField struct {
	name     string
	typ      string // a scalar type, or the name of an enum or message
	num      protowire.Number
	repeated bool
}

// byNum returns the message's field numbered num.
func (m *protoMessage) byNum(num protowire.Number) (protoField, bool) {
	for _, f := range m.fields {
		if f.num == num {
			return f, true
		}
	}
	return protoField{}, false
}

// protoScalars are the scalar types the parser accepts, with the wire type
// each is encoded with.
var protoScalars = map[string]protowire.Type{
	"uint32":  protowire.VarintType,
	"uint64":  protowire.VarintType,
	"int32":   protowire.VarintType,
	"bool":    protowire.VarintType,
	"fixed64": protowire.Fixed64Type,
	"string":  protowire.BytesType,
	"bytes":   protowire.BytesType,
}

// wireType is the wire type the field's values are encoded with.
func (s *protoSchema) wireType(f protoField) protowire.Type {
	if wt, ok := protoScalars[f.typ]; ok {
		return wt
	}
	if _, ok := s.enums[f.typ]; ok {
		return protowire.VarintType
	}
	return protowire.BytesType
}

func loadProtoSchema(path string) (*protoSchema, error) {
	src, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	return parseProtoSchema(string(src))
}

// parseProtoSchema parses src and checks that every field's type is declared
// and that numbers and names are unique where proto3 requires them to be.
func parseProtoSchema(src string) (*protoSchema, error) {
	toks, comments, err := protoTokens(src)
	if err != nil {
		return nil, err
	}
	p := &protoParser{toks: toks}
	s := &protoSchema{enums: map[string]*protoEnum{}, messages: map[string]*protoMessage{}, comments: comments}
	for !p.done() {
		switch kw := p.next(); kw {
		case "syntax":
			if err := p.expect("="); err != nil {
				return nil, err
			}
			if v := p.next(); v != `"proto3"` {
				return nil, fmt.Errorf("syntax %s: the parser reads proto3 only", v)
			}
			err = p.expect(";")
		case "package":
			p.next()
			err = p.expect(";")
		case "option":
			p.next()
			if err = p.expect("="); err == nil {
				p.next()
				err = p.expect(";")
			}
		case "enum":
			err = p.enum(s)
		case "message":
			err = p.message(s)
		default:
			err = fmt.Errorf("unexpected %q at the top level", kw)
		}
		if err != nil {
			return nil, err
		}
	}
	for _, m := range s.messages {
		for _, f := range m.fields {
			_, scalar := protoScalars[f.typ]
			_, enum := s.enums[f.typ]
			_, msg := s.messages[f.typ]
			if !scalar && !enum && !msg {
				return nil, fmt.Errorf("%s.%s: unknown type %q", m.name, f.name, f.typ)
			}
			if f.repeated && s.wireType(f) != protowire.BytesType {
				return nil, fmt.Errorf("%s.%s: repeated %s would be packed, which the parser does not read", m.name, f.name, f.typ)
			}
		}
	}
	return s, nil
}

// protoTokens splits src into identifiers, numbers, string literals and
// punctuation, and collects the comments' text.
func protoTokens(src string) (toks []string, comments string, err error) {
	var cm strings.Builder
	for i := 0; i < len(src); {
		c := src[i]
		switch {
		case c == ' ' || c == '\t' || c == '\n' || c == '\r':
			i++
		case strings.HasPrefix(src[i:], "//"):
			end := strings.IndexByte(src[i:], '\n')
			if end < 0 {
				end = len(src) - i
			}
			cm.WriteString(src[i+2:i+end] + "\n")
			i += end
		case strings.HasPrefix(src[i:], "/*"):
			return nil, "", fmt.Errorf("block comments are not read by the parser")
		case c == '"':
			end := strings.IndexByte(src[i+1:], '"')
			if end < 0 {
				return nil, "", fmt.Errorf("unterminated string")
			}
			toks = append(toks, src[i:i+end+2])
			i += end + 2
		case strings.IndexByte("{}=;", c) >= 0:
			toks = append(toks, string(c))
			i++
		case c == '_' || c == '.' || unicode.IsLetter(rune(c)) || unicode.IsDigit(rune(c)):
			j := i
			for j < len(src) && (src[j] == '_' || src[j] == '.' || unicode.IsLetter(rune(src[j])) || unicode.IsDigit(rune(src[j]))) {
				j++
			}
			toks = append(toks, src[i:j])
			i = j
		default:
			return nil, "", fmt.Errorf("unexpected character %q", c)
		}
	}
	return toks, cm.String(), nil
}

type protoParser struct {
	toks []string
	pos  int
}

func (p *protoParser) done() bool { return p.pos >= len(p.toks) }

// next returns the next token, "" at the end.
func (p *protoParser) next() string {
	if p.done() {
		return ""
	}
	p.pos++
	return p.toks[p.pos-1]
}

func (p *protoParser) peek() string {
	if p.done() {
		return ""
	}
	return p.toks[p.pos]
}

func (p *protoParser) expect(tok string) error {
	if got := p.next(); got != tok {
		return fmt.Errorf("want %q, got %q (after token %d)", tok, got, p.pos)
	}
	return nil
}

// ident reads a declared name.
func (p *protoParser) ident(what string) (string, error) {
	t := p.next()
	if t == "" || !unicode.IsLetter(rune(t[0])) || strings.Contains(t, ".") {
		return "", fmt.Errorf("want a %s name, got %q", what, t)
	}
	return t, nil
}

// number reads "= N;" and returns N.
func (p *protoParser) number(what string) (int, error) {
	if err := p.expect("="); err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	n, err := strconv.Atoi(p.next())
	if err != nil {
		return 0, fmt.Errorf("%s: %w", what, err)
	}
	return n, p.expect(";")
}

func (p *protoParser) enum(s *protoSchema) error {
	name, err := p.ident("enum")
	if err != nil {
		return err
	}
	if err := p.expect("{"); err != nil {
		return err
	}
	e := &protoEnum{name: name}
	seen := map[int]string{}
	for p.peek() != "}" {
		vn, err := p.ident(name + " value")
		if err != nil {
			return err
		}
		num, err := p.number(vn)
		if err != nil {
			return err
		}
		if prev, dup := seen[num]; dup {
			return fmt.Errorf("enum %s: %s and %s are both %d", name, prev, vn, num)
		}
		seen[num] = vn
		e.values = append(e.values, protoEnumValue{vn, num})
	}
	p.next()
	if len(e.values) == 0 || e.values[0].num != 0 {
		return fmt.Errorf("enum %s: proto3 wants 0 as its first value", name)
	}
	if s.enums[name] != nil || s.messages[name] != nil {
		return fmt.Errorf("%s declared twice", name)
	}
	s.enums[name] = e
	return nil
}

func (p *protoParser) message(s *protoSchema) error {
	name, err := p.ident("message")
	if err != nil {
		return err
	}
	if err := p.expect("{"); err != nil {
		return err
	}
	m := &protoMessage{name: name}
	for p.peek() != "}" {
		if p.done() {
			return fmt.Errorf("message %s: unterminated", name)
		}
		var f protoField
		if p.peek() == "repeated" {
			p.next()
			f.repeated = true
		}
		switch t := p.next(); t {
		case "message", "enum", "oneof", "map", "reserved", "optional", "option", "extensions":
			return fmt.Errorf("message %s: %q is not read by the parser", name, t)
		default:
			f.typ = t
		}
		if f.name, err = p.ident(name + " field"); err != nil {
			return err
		}
		num, err := p.number(name + "." + f.name)
		if err != nil {
			return err
		}
		if num < 1 || num > int(protowire.MaxValidNumber) {
			return fmt.Errorf("%s.%s: field number %d out of range", name, f.name, num)
		}
		f.num = protowire.Number(num)
		for _, o := range m.fields {
			if o.num == f.num || o.name == f.name {
				return fmt.Errorf("message %s: fields %s and %s clash (%d, %d)", name, o.name, f.name, o.num, f.num)
			}
		}
		m.fields = append(m.fields, f)
	}
	p.next()
	if s.enums[name] != nil || s.messages[name] != nil {
		return fmt.Errorf("%s declared twice", name)
	}
	s.messages[name] = m
	return nil
}
