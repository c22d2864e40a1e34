package main

import (
	"bytes"
	"flag"
	"fmt"
	"io"
	"os"
	"regexp"
	"sort"
	"strings"
	"testing"
)

var updateConfigReference = flag.Bool("update", false, "rewrite docs/configuration.md from serve's settings")

// configReferencePath is where the repository keeps the configuration
// reference, relative to this package: docs/configuration.md.
const configReferencePath = "../../docs/configuration.md"

// writeConfigReference writes docs/configuration.md: every setting of
// `strata serve` with its flag, environment variable, config key, type,
// default and meaning. It reads the flag set `serve -h` prints, so the two
// cannot disagree; TestConfigReference keeps the committed file equal to it
// (regenerate with `go test ./cmd/strata -run TestConfigReference -update`).
func writeConfigReference(w io.Writer) error {
	s := newServeSettings()
	fs := flag.NewFlagSet("serve", flag.ContinueOnError)
	s.flags(fs)
	var b strings.Builder
	b.WriteString(`# strata serve: configuration reference

<!-- Generated from strata serve's settings (cmd/strata/serve_settings.go) by
     go test ./cmd/strata -run TestConfigReference -update
     Do not edit: a test fails when this file and ` + "`strata serve -h`" + ` disagree. -->

Every setting of ` + "`strata serve`" + ` has one name in three places: the flag (` + "`--arena`" + `), the
environment variable (` + "`STRATA_`" + ` and the name in capitals, dashes as underscores:
` + "`STRATA_ARENA`" + `) and the key of the JSON file given with ` + "`--config`" + ` (` + "`\"arena\"`" + `). A flag wins
over the environment, the environment over the file, the file over the default. A key the
file does not know, or a value of a type the setting does not take, is refused at start with
exit status 2, naming the key. ` + "`deploy/serve.json`" + ` is an example file (the one the systemd
unit in ` + "`deploy/systemd/`" + ` reads).

| flag | environment | config key | type | default | meaning |
|---|---|---|---|---|---|
`)
	kinds := map[settingKind]bool{}
	fs.VisitAll(func(f *flag.Flag) {
		kind, env, key := kindString, "`STRATA_CONFIG`", "(none: the file itself)"
		if st, ok := s.settings[f.Name]; ok {
			kind, env, key = st.kind, "`"+envName(f.Name)+"`", "`\""+f.Name+"\"`"
		}
		kinds[kind] = true
		def := "(none)"
		if f.DefValue != "" {
			def = "`" + f.DefValue + "`"
		}
		fmt.Fprintf(&b, "| `--%s` | %s | %s | %s | %s | %s |\n", f.Name, env, key, kind, def, mdCell(f.Usage))
	})
	b.WriteString("\nWhat each type takes. On the command line and in the environment every value is text, as\nin the table; in the config file:\n\n| type | in the config file |\n|---|---|\n")
	names := make([]string, 0, len(kinds))
	for k := range kinds {
		names = append(names, string(k))
	}
	sort.Strings(names)
	for _, k := range names {
		fmt.Fprintf(&b, "| %s | %s |\n", k, mdCell(settingKind(k).jsonWant()))
	}
	b.WriteString("\n" + sizeUnitsDoc + " Durations are Go's (`10s`, `5m`, `1h30m`).\n")
	_, err := io.WriteString(w, b.String())
	return err
}

// mdCell makes text safe in a Markdown table cell.
func mdCell(s string) string {
	return strings.NewReplacer("|", `\|`, "\n", " ").Replace(s)
}

// The committed docs/configuration.md is what the settings produce now.
func TestConfigReference(t *testing.T) {
	var b bytes.Buffer
	if err := writeConfigReference(&b); err != nil {
		t.Fatal(err)
	}
	if *updateConfigReference {
		if err := os.WriteFile(configReferencePath, b.Bytes(), 0o644); err != nil {
			t.Fatal(err)
		}
	}
	have, err := os.ReadFile(configReferencePath)
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(have, b.Bytes()) {
		t.Fatalf("docs/configuration.md is out of date with serve's settings: run go test ./cmd/strata -run TestConfigReference -update")
	}
}

// Every flag `strata serve -h` prints is in the reference with the same
// type, default and environment variable, and the reference has no other.
func TestConfigReferenceMatchesServeHelp(t *testing.T) {
	code, help, errs := runCLI(t, "", "serve", "-h")
	if code != 0 {
		t.Fatalf("serve -h: exit %d, %s", code, errs)
	}
	ref, err := os.ReadFile(configReferencePath)
	if err != nil {
		t.Fatal(err)
	}
	rows := map[string][]string{}
	for _, line := range strings.Split(string(ref), "\n") {
		if strings.HasPrefix(line, "| `--") {
			cells := strings.Split(line, " | ")
			rows[strings.Trim(cells[0], "| `")] = cells
		}
	}
	// -h: "  --name kind" then "    \tusage (default D) (env E)".
	re := regexp.MustCompile(`(?m)^  --(\S+) (\S+)\n    \t.*\((?:default ([^)]*)|default: none)\)(?: \(env (\S+)\))?$`)
	flags := re.FindAllStringSubmatch(help, -1)
	if len(flags) < 10 {
		t.Fatalf("read %d flags from serve -h:\n%s", len(flags), help)
	}
	for _, f := range flags {
		name, kind, def, env := "--"+f[1], f[2], f[3], f[4]
		cells, ok := rows[name]
		if !ok {
			t.Errorf("%s is in serve -h, not in docs/configuration.md", name)
			continue
		}
		delete(rows, name)
		if def == "" {
			def = "(none)"
		} else {
			def = "`" + def + "`"
		}
		if env == "" {
			env = "STRATA_CONFIG"
		}
		if cells[1] != "`"+env+"`" || cells[3] != kind || cells[4] != def {
			t.Errorf("%s: the reference says env %s, type %s, default %s; serve -h says %s, %s, %s", name, cells[1], cells[3], cells[4], env, kind, def)
		}
	}
	for name := range rows {
		t.Errorf("%s is in docs/configuration.md, not in serve -h", name)
	}
}
