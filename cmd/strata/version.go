package main

import (
	"context"
	"fmt"
	"io"
	"runtime/debug"
)

// version is set at build time with -ldflags "-X main.version=v1.2.3"; otherwise
// the module version or VCS revision from the build info is printed.
var version = ""

func runVersion(_ context.Context, args []string, _ io.Reader, stdout, stderr io.Writer) error {
	fs := newFlagSet("version", stdout)
	if err := parseFlags(fs, args); err != nil {
		return err
	}
	fmt.Fprintf(stdout, "strata %s\n", buildVersion())
	return nil
}

func buildVersion() string {
	if version != "" {
		return version
	}
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return "(unknown)"
	}
	return describeBuild(info)
}

// describeBuild renders the module version, the commit it was built from (with
// "-dirty" for uncommitted changes, and its time) and the Go version. `go build`
// and `go install` in a checkout record the commit; `go run` and `go test` do not,
// and then the line says so rather than print nothing.
func describeBuild(info *debug.BuildInfo) string {
	settings := map[string]string{}
	for _, s := range info.Settings {
		settings[s.Key] = s.Value
	}
	v := info.Main.Version
	if v == "" {
		v = "(devel)"
	}
	switch rev := settings["vcs.revision"]; {
	case rev != "":
		v += " commit " + rev[:min(len(rev), 12)]
		if settings["vcs.modified"] == "true" {
			v += "-dirty"
		}
		if t := settings["vcs.time"]; t != "" {
			v += " (" + t + ")"
		}
	default:
		v += " commit unknown (built without VCS information: go build in a git checkout records it, go run, go test and -buildvcs=false do not)"
	}
	return v + " " + info.GoVersion
}
