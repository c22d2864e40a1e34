package main

import (
	"errors"
	"flag"
	"fmt"
	"io"
)

// errHelp reports that -h was asked for and the usage was printed.
var errHelp = errors.New("help")

// newFlagSet returns a flag set that reports errors instead of exiting. Parse
// errors are returned as one line; the full usage is printed only for -h.
func newFlagSet(name string, stderr io.Writer) *flag.FlagSet {
	fs := flag.NewFlagSet("strata "+name, flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: strata %s [flags]\n", name)
		fs.PrintDefaults()
	}
	return fs
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
