package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
)

// errHelp reports that -h was asked for and the usage was printed.
var errHelp = errors.New("help")

// newFlagSet returns a flag set that reports errors instead of exiting. Parse
// errors are returned as one line (the caller prints it on stderr); the full
// usage is printed only for -h, on stdout, and the command exits 0, as kubectl
// and etcd do: `strata serve -h | grep spill` finds the spill's flags.
func newFlagSet(name string, stdout io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("strata "+name, flag.ContinueOnError)
	fs.SetOutput(stdout)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: strata %s [flags]\n", name)
		printFlags(fs)
	}
	return fs
}

// printFlags is flag.PrintDefaults with every flag's default shown, the
// empty and false ones included: an operator reading -h sees what each flag
// does when left out. A usage text that already says its default in words
// ("(default: the model preset's)") is printed as it is, not followed by the
// zero value that stands for it.
func printFlags(fs *flag.FlagSet) {
	w := fs.Output()
	fs.VisitAll(func(f *flag.Flag) {
		kind, usage := flag.UnquoteUsage(f)
		fmt.Fprintf(w, "  -%s", f.Name)
		if kind != "" {
			fmt.Fprintf(w, " %s", kind)
		}
		usage = strings.ReplaceAll(usage, "\n", "\n    \t")
		if strings.Contains(usage, "(default") {
			fmt.Fprintf(w, "\n    \t%s\n", usage)
			return
		}
		fmt.Fprintf(w, "\n    \t%s %s\n", usage, defaultText(f.DefValue))
	})
}

// defaultText says what a flag is when left out.
func defaultText(def string) string {
	if def == "" {
		return "(default: none)"
	}
	return "(default " + def + ")"
}

// parseFlags parses args and wraps failures as usage errors.
func parseFlags(fs *flag.FlagSet, args []string) error {
	out, usage := fs.Output(), fs.Usage
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	err := fs.Parse(args)
	fs.SetOutput(out)
	fs.Usage = usage
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			fs.Usage()
			return errHelp
		}
		return usagef("%w (run with -h for the flags)", err)
	}
	if fs.NArg() > 0 {
		return usagef("unexpected argument %q", fs.Arg(0))
	}
	return nil
}

// flagSet reports whether the flag called name was given on the command line.
func flagSet(fs *flag.FlagSet, name string) bool {
	set := false
	fs.Visit(func(f *flag.Flag) {
		if f.Name == name {
			set = true
		}
	})
	return set
}
