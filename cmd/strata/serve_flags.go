package main

import (
	"flag"
	"fmt"
)

// settingFlag is a setting's command-line flag: it only records the text given,
// since the flag is applied after the config file and the environment.
type settingFlag struct {
	given map[string]string
	name  string
	def   string
	bool  bool
}

func (f *settingFlag) String() string {
	if f == nil {
		return ""
	}
	return f.def
}

func (f *settingFlag) Set(v string) error { f.given[f.name] = v; return nil }

// IsBoolFlag lets a switch be given alone (--remote-tls).
func (f *settingFlag) IsBoolFlag() bool { return f.bool }

// flags registers every setting as a flag and returns what was given. -h shows
// each flag's type and default.
func (s *serveSettings) flags(fs *flag.FlagSet) func() map[string]string {
	given := map[string]string{}
	for _, name := range s.names() {
		st := s.settings[name]
		fs.Var(&settingFlag{given: given, name: name, def: st.get(), bool: st.kind == kindBool}, name, st.usage)
	}
	fs.StringVar(&s.config, "config", "", "JSON config file; its keys are these flags' names (env STRATA_CONFIG)")
	fs.Usage = func() {
		w := fs.Output()
		fmt.Fprintln(w, "usage: strata serve [flags]")
		fmt.Fprintln(w, "Each flag can also be set by the environment (STRATA_ + its name in capitals, dashes as underscores) or a --config file; a flag wins over the environment, the environment over the file.")
		fs.VisitAll(func(f *flag.Flag) {
			kind := kindString
			if st, ok := s.settings[f.Name]; ok {
				kind = st.kind
			}
			fmt.Fprintf(w, "  --%s %s\n    \t%s %s", f.Name, kind, f.Usage, defaultText(f.DefValue))
			if f.Name != "config" {
				fmt.Fprintf(w, " (env %s)", envName(f.Name))
			}
			fmt.Fprintln(w)
		})
	}
	return func() map[string]string {
		out := make(map[string]string, len(given))
		for k, v := range given {
			out[k] = v
		}
		return out
	}
}
